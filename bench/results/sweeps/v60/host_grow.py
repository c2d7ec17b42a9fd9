"""session 44 (perf-notes v60): host time of each eager decode call on a cache one token longer per call (as
transformers' DynamicCache), B=1 32/8 D128 bf16, K from 2048 up, the GPU kept busy; and the planner's config per
capacity, to see which calls pay what. Then cProfile over the slowest stretch."""
import cProfile, io, json, os, pstats, statistics, time
import torch
import flashcore
from flashcore.plan.cache import PLANS

dev = "cuda"
B, HQ, HKV, D = int(os.environ.get("B", 1)), 32, 8, 128
K0, K1 = int(os.environ.get("K0", 2048)), int(os.environ.get("K1", 4200))
kbuf = torch.randn(B, HKV, K1 + 1200, D, device=dev, dtype=torch.bfloat16)
vbuf = torch.randn_like(kbuf)
q4 = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.bfloat16)


def fc(K):
    k, v = kbuf[:, :, :K], vbuf[:, :, :K]
    return flashcore.attention_with_kvcache(q4.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), cache_seqlens=K,
                                            causal=True, validate=False)


def timed_pass():
    """(K, host us) of one call per length K0..K1-1, the GPU kept busy (a sleep queued every 100 calls)."""
    out = []
    for K in range(K0, K1):
        if (K - K0) % 100 == 0:
            torch.cuda.synchronize()
            torch.cuda._sleep(int(1.5e9 * 0.05))
        t0 = time.perf_counter()
        fc(K)
        out.append((K, (time.perf_counter() - t0) * 1e6))
    torch.cuda.synchronize()
    return out


fc(K0 - 1)
torch.cuda.synchronize()
times = timed_pass()
cfgs = {}
for p in PLANS.plans():
    cfg = getattr(p, "config", None)
    cap = getattr(getattr(p, "shape", None), "capacity", None)
    if cfg is not None and cap is not None:
        cfgs[cap] = str(cfg)
slow = sorted(times, key=lambda x: -x[1])[:15]
print("slowest calls:", [(k, round(t)) for k, t in slow])
# per 100-token window: median host time and the configs seen
for w in range(K0, K1, 100):
    ts = [t for k, t in times if w <= k < w + 100]
    cs = sorted({cfgs.get(k, "?") for k in range(w, min(w + 100, K1))})
    print(f"K {w}-{w+99}: median {statistics.median(ts):7.1f} us  max {max(ts):8.1f}  configs {len(cs)}: {cs[0][:150] if cs else ''}")
# a second pass over the same lengths: every plan is cached now (how much is the plan build?)
times2 = [t for _, t in timed_pass()]
print("second pass (plans cached): median", round(statistics.median(times2), 1), "us")
PLANS.clear()
Kp = int(os.environ.get("KP", 2300))
torch.cuda._sleep(int(1.5e9 * 0.1))
pr = cProfile.Profile()
pr.enable()
for K in range(Kp, Kp + 200):
    fc(K)
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(40)
print("\n".join(s.getvalue().splitlines()[:60]))
json.dump(dict(times=times, times_cached=times2, configs=cfgs, profile=s.getvalue()),
          open(os.path.join(os.environ.get("OUT", "."), "host_grow.json"), "w"))
