"""session 44 (perf-notes v60): host time per eager decode call, the way transformers' integration calls it
(B=1, 32/8 heads, D 128, bf16, [B, S, H, D] views of [B, H, S, D] caches, cache_seqlens an int, validate=False),
against SDPA on the same tensors. Host time = CPU wall time of N calls while the GPU is kept busy (a sleep queued
first, so no launch waits on the GPU). Cases: a plan hit (the same capacity every call) and a growing cache (one
token longer per call, as transformers' DynamicCache). Then cProfile of each, top functions by own time."""
import cProfile, io, json, os, pstats, statistics, time
import torch
import torch.nn.functional as F
import flashcore

dev = "cuda"
B, HQ, HKV, D, S0 = int(os.environ.get("B", 1)), 32, 8, 128, 2048
N = int(os.environ.get("N", 200))
ROUNDS = int(os.environ.get("ROUNDS", 7))
g = torch.Generator(device=dev).manual_seed(int(time.time()) % 2**31)
kbuf = torch.randn(B, HKV, S0 + N * (ROUNDS + 4) + 64, D, device=dev, dtype=torch.bfloat16, generator=g)
vbuf = torch.randn_like(kbuf)
q4 = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.bfloat16, generator=g)
scale = D ** -0.5
state = {"K": S0}


def fc(K):
    k, v = kbuf[:, :, :K], vbuf[:, :, :K]
    return flashcore.attention_with_kvcache(q4.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), cache_seqlens=K,
                                            causal=True, scale=scale, validate=False)


def sd(K):
    k, v = kbuf[:, :, :K], vbuf[:, :, :K]
    return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)


from torch.nn.attention import SDPBackend, sdpa_kernel
NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sd_nocudnn(K):  # SDPA without its cuDNN backend (which builds a graph per new key length: 35-49 ms, v22)
    with sdpa_kernel(NO_CUDNN):
        return sd(K)


def run(fn, grow):
    K = state["K"]
    for _ in range(N):
        fn(K)
        if grow:
            K += 1
    state["K"] = K


# correctness once: both against each other at one length
torch.cuda.synchronize()
o1 = fc(S0).transpose(1, 2).float()
o2 = sd_nocudnn(S0).float()
err = ((o1 - o2).norm() / o2.norm()).item()
print(f"fc vs sdpa rel err {err:.2e}")
assert err < 1e-2
cases = {"fc_hit": (fc, False), "fc_grow": (fc, True), "sdpa_hit": (sd, False), "sdpa_nocudnn_hit": (sd_nocudnn, False),
         "sdpa_nocudnn_grow": (sd_nocudnn, True)}
for name, (fn, grow) in cases.items():  # warm up (compiles, plans, cuDNN graphs for the first lengths)
    run(fn, grow)
torch.cuda.synchronize()
res = {n: [] for n in cases}
for r in range(ROUNDS):
    for name, (fn, grow) in cases.items():
        torch.cuda._sleep(int(1.5e9 * N * 150e-6))  # ~N * 150 us of GPU time at ~1.5 GHz: the queue never drains
        t0 = time.perf_counter()
        run(fn, grow)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        res[name].append((t1 - t0) / N * 1e6)
summary = {n: dict(median_us=statistics.median(v), min_us=min(v), rounds=v) for n, v in res.items()}
profiles = {}
for name in ("fc_hit", "fc_grow"):
    fn, grow = cases[name]
    torch.cuda._sleep(int(1.5e9 * N * 300e-6))
    pr = cProfile.Profile()
    pr.enable()
    run(fn, grow)
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(28)
    profiles[name] = s.getvalue()
    print(f"==== {name} (cProfile, {N} calls)")
    print("\n".join(s.getvalue().splitlines()[:45]))
out = os.environ.get("OUT", ".")
json.dump(dict(B=B, summary=summary, profiles=profiles, torch=torch.__version__, device=torch.cuda.get_device_name(),
               rel_err=err), open(os.path.join(out, f"host_decode_B{B}.json"), "w"), indent=1)
for n, s in summary.items():
    print(f"{n:10s} host per call median {s['median_us']:7.1f} us  min {s['min_us']:7.1f}")
