"""session 44 (perf-notes v60): host time of the parts of one eager decode call as transformers' integration makes
it (B=1, 32/8, D 128, bf16, K 2048, [B,S,H,D] views of [B,H,S,D] caches, cache_seqlens/cache_leftpad int32 tensors
from the padding mask, validate=False), the GPU kept busy; medians over rounds of N calls."""
import json, os, statistics, time, types
import torch
import torch.nn.functional as F
import flashcore
from flashcore import ops
from flashcore.ops import KV_OPTIONAL
from flashcore.problem import kvcache_key
from flashcore.plan.cache import PLANS
import flashcore.integrations.transformers as fc_hf

dev = "cuda"
B, HQ, HKV, D, K = 1, 32, 8, 128, 2048
N, ROUNDS = 300, 7
kc = torch.randn(B, HKV, K, D, device=dev, dtype=torch.bfloat16)
vc = torch.randn_like(kc)
q4 = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.bfloat16)
q, k, v = q4.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
start = torch.zeros(B, dtype=torch.int32, device=dev)
end = torch.full((B,), K, dtype=torch.int32, device=dev)
scale = D ** -0.5
pm = torch.ones(B, K, dtype=torch.bool, device=dev)
module = types.SimpleNamespace(is_causal=True, training=False)


def full():
    return flashcore.attention_with_kvcache(q, k, v, cache_seqlens=end, cache_leftpad=start, causal=True, scale=scale,
                                            validate=False)


out0 = full()
opt = dict(k=None, v=None, page_table=None, cache_batch_idx=None, cache_leftpad=start, cu_seqlens_q=None,
           k_descale=None, v_descale=None)
flags = (None, True, scale, 0, False, False, False)


def key():
    return kvcache_key("auto", q, k, v, tuple(opt[n] for n in KV_OPTIONAL) + (end,), None, flags=flags)


plan = PLANS.get(key())
assert plan is not None, "the key here differs from the call's"
tensors = dict(opt, cache_seqlens=end)


def plan_run():
    return plan(q, k, v, tensors, None)


def integ():
    return fc_hf.attention_forward(module, q4, kc, vc, integ_mask, scaling=scale)


integ_mask = pm.clone()
integ_mask._flashcore = fc_hf._MaskSpec(causal=True, frame=K)
integ_mask._flashcore.ok = True


def sdpa():
    return F.scaled_dot_product_attention(q4, kc, vc, scale=scale, enable_gqa=True)


parts = {"key": key, "plan_run": plan_run, "full_call": full, "integration": integ, "sdpa_default": sdpa,
         "torch_empty": lambda: torch.empty((1, 1, 32, 128), dtype=torch.bfloat16, device=dev),
         "transpose3": lambda: (q4.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2))}
for f in parts.values():
    f(); f()
torch.cuda.synchronize()
res = {n: [] for n in parts}
for r in range(ROUNDS):
    for n, f in parts.items():
        torch.cuda._sleep(int(1.5e9 * N * 120e-6))
        t0 = time.perf_counter()
        for _ in range(N):
            f()
        res[n].append((time.perf_counter() - t0) / N * 1e6)
        torch.cuda.synchronize()
o = full().float(); r_ = sdpa().transpose(1, 2).float()
err = ((o - r_).norm() / r_.norm()).item()
summary = {n: round(statistics.median(v), 2) for n, v in res.items()}
print("rel err vs sdpa", err, "config", plan.config)
for n, s in summary.items():
    print(f"{n:14s} {s:7.2f} us  rounds {[round(x, 1) for x in res[n]]}")
json.dump(dict(summary=summary, rounds=res, rel_err=err, config=str(plan.config)),
          open(os.path.join(os.environ.get("OUT", "."), "host_parts.json"), "w"), indent=1)
