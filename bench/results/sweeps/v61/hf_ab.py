"""session 45 (perf-notes v61): transformers' generate with a DynamicCache (eager decode steps), implementations
interleaved round by round in one process: sdpa; flashcore as shipped (one KVCacheStep per forward pass, run by
every layer, the forward pass's lengths in one launch); flashcore's path before (attention_with_kvcache per layer:
kvcache_step replaced by a shim that calls it; the lengths by PyTorch's eight ops); both without the per-step mask check (validate_masks=False). 8 Llama-8B-wide layers, bf16, random weights.
Per-step ms = (generate(NEW+1) - generate(1)) / NEW, medians over ROUNDS. (Its loop moved into
hf_generate.interleaved_rounds in session 46, the same steps; the JSONs beside it were made by the loop inline.)"""
import contextlib, types
import flashcore
import flashcore.integrations.transformers as fc_hf
from flashcore.bench.experiments.hf_generate import ab_report, ab_setup, interleaved_rounds

ab = ab_setup()


@contextlib.contextmanager
def before():  # the integration's path before v61: a full attention_with_kvcache call per layer, PyTorch's lengths
    real_step, real_bounds = flashcore.kvcache_step, fc_hf._mask_bounds
    flashcore.kvcache_step = lambda q, k, v, **kw: types.SimpleNamespace(
        run=lambda q, k, v: flashcore.attention_with_kvcache(q, k, v, **kw))
    fc_hf._mask_bounds = lambda pm: None
    try:
        yield
    finally:
        flashcore.kvcache_step, fc_hf._mask_bounds = real_step, real_bounds


impls = {"sdpa": ("sdpa", None), "fcore": (ab.check, None), "fcore_before": (ab.check, before),
         "fcore_nocheck": (ab.nocheck, None), "fcore_nocheck_before": (ab.nocheck, before)}
res, tokens = interleaved_rounds(ab.model, ab.ids, ab.mask, impls, ab.NEW, ab.ROUNDS)
ab_report(ab, res, {n: t[0] for n, t in tokens.items()})
