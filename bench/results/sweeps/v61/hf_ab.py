"""session 45 (perf-notes v61): transformers' generate with a DynamicCache (eager decode steps), implementations
interleaved round by round in one process: sdpa; flashcore as shipped (one KVCacheStep per forward pass, run by
every layer, the forward pass's lengths in one launch); flashcore's path before (attention_with_kvcache per layer:
kvcache_step replaced by a shim that calls it; the lengths by PyTorch's eight ops); both without the per-step mask check (validate_masks=False). 8 Llama-8B-wide layers, bf16, random weights.
Per-step ms = (generate(NEW+1) - generate(1)) / NEW, medians over ROUNDS."""
import json, os, statistics, time, types
import torch
import flashcore
import flashcore.integrations.transformers as fc_hf
from flashcore.bench.experiments.hf_generate import make_model, prompts

B = int(os.environ.get("B", 1))
P, NEW, ROUNDS = int(os.environ.get("P", 2048)), int(os.environ.get("NEW", 128)), int(os.environ.get("ROUNDS", 5))
model, cfg = make_model(8, 32000)
check = fc_hf.register("fcore")
nocheck = fc_hf.register("fcore_nocheck", validate_masks=False)
real_step = flashcore.kvcache_step
real_bounds = fc_hf._mask_bounds


def old_step(q, k, v, **kw):  # the integration's path before v61: a full attention_with_kvcache call per layer
    return types.SimpleNamespace(run=lambda q, k, v: flashcore.attention_with_kvcache(q, k, v, **kw))


def old_bounds(pm):
    return None


impls = {"sdpa": ("sdpa", real_step, real_bounds), "fcore": (check, real_step, real_bounds),
         "fcore_before": (check, old_step, old_bounds), "fcore_nocheck": (nocheck, real_step, real_bounds),
         "fcore_nocheck_before": (nocheck, old_step, old_bounds)}
ids, mask = prompts(B, P, 32000, False)


def gen(n):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=n,
                              min_new_tokens=n)


def timed(n):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = gen(n)
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


res = {n: [] for n in impls}
tokens = {}
for r in range(ROUNDS + 2):
    for n, (impl, step_fn, bounds_fn) in impls.items():
        model.set_attn_implementation(impl)
        flashcore.kvcache_step, fc_hf._mask_bounds = step_fn, bounds_fn
        try:
            t1, _ = timed(1)
            tn, out = timed(NEW + 1)
        finally:
            flashcore.kvcache_step, fc_hf._mask_bounds = real_step, real_bounds
        tokens[n] = out[0, P:P + 16].tolist()
        if r >= 2:  # two warm-up rounds: compiles, plans, sdpa's cuDNN graphs per key length
            res[n].append((tn - t1) / NEW * 1e3)
summary = {n: round(statistics.median(v), 3) for n, v in res.items()}
for n in impls:
    print(f"B{B} {n:22s} {summary[n]:7.3f} ms/step  x sdpa {summary['sdpa'] / summary[n]:.3f}  rounds "
          f"{[round(x, 3) for x in res[n]]}")
json.dump(dict(B=B, P=P, NEW=NEW, ROUNDS=ROUNDS, summary=summary, rounds=res, tokens=tokens,
               git=os.environ.get("FLASHCORE_GIT_SHA")),
          open(os.path.join(os.environ.get("OUT", "."), f"hf_ab_B{B}.json"), "w"), indent=1)
