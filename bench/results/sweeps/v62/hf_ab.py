"""session 46 (perf-notes v62), run on the tree with early-mask-copy.patch applied (it needs
``fc_hf._start_host_copy``): transformers' generate with a DynamicCache (eager decode steps), implementations
interleaved round by round in one process (hf_generate.interleaved_rounds): sdpa; flashcore patched (the mask's
bounds copied to the host as the mask function makes the mask: the first layer waits for that copy only);
flashcore with the check as a sync in the first layer (the copy's start replaced by a no-op shim: the bounds read
back there, behind every queued launch, as before the patch); flashcore without the check (validate_masks=False).
8 Llama-8B-wide layers, bf16, random weights. Per-step ms = (generate(NEW+1) - generate(1)) / NEW, medians over
ROUNDS."""
import contextlib
import flashcore.integrations.transformers as fc_hf
from flashcore.bench.experiments.hf_generate import ab_report, ab_setup, interleaved_rounds

ab = ab_setup()


@contextlib.contextmanager
def sync_check():
    real = fc_hf._start_host_copy
    fc_hf._start_host_copy = lambda pm, spec: None
    try:
        yield
    finally:
        fc_hf._start_host_copy = real


impls = {"sdpa": ("sdpa", None), "fcore": (ab.check, None), "fcore_sync_check": (ab.check, sync_check),
         "fcore_nocheck": (ab.nocheck, None)}
res, tokens = interleaved_rounds(ab.model, ab.ids, ab.mask, impls, ab.NEW, ab.ROUNDS)
ab_report(ab, res, tokens)
