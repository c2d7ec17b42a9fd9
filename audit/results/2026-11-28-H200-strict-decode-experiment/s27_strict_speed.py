"""Same-run speed of KV-cache decode: fast, secure=True, secure='strict' (the strict form of
bench/results/sweeps/strict-decode-v42.patch). Each mode is one CUDA graph of back-to-back calls on the same inputs,
replayed in 7 interleaved rounds; medians. No L2 flush: a cache smaller than the L2 (B1 4k) is read from it. Writes
$OUT/strict-speed.json and prints a table."""
import json, os, sys, time
import torch
import flashcore
from flashcore import reference as R

DEV = "cuda"
SHAPES = [  # (name, B, Hq, Hkv, D, cap, page, fp8)
    ("B64 16k", 64, 32, 8, 128, 16384, 0, False),
    ("B64 8k page16", 64, 32, 8, 128, 8192, 16, False),
    ("B1 64k", 1, 32, 8, 128, 65536, 0, False),
    ("B1 64k page16", 1, 32, 8, 128, 65536, 16, False),
    ("B8 4k", 8, 32, 8, 128, 4096, 0, False),
    ("B1 4k", 1, 32, 8, 128, 4096, 0, False),
    ("B64 16k fp8", 64, 32, 8, 128, 16384, 0, True),
    ("B1 64k fp8 page16", 1, 32, 8, 128, 65536, 16, True),
]
MODES = [False, True, "strict"]


def case(B, Hq, Hkv, D, cap, page, fp8):
    g = torch.Generator(device=DEV).manual_seed(1)
    q = torch.randn(B, 1, Hq, D, device=DEV, dtype=torch.bfloat16, generator=g)
    cdt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    if page:
        w = cap // page
        kc = torch.randn(B * w, page, Hkv, D, device=DEV, generator=g).to(cdt)
        vc = torch.randn(B * w, page, Hkv, D, device=DEV, generator=g).to(cdt)
        table = torch.randperm(B * w, device=DEV, generator=g).view(B, w).int()
    else:
        kc = torch.randn(B, cap, Hkv, D, device=DEV, generator=g).to(cdt)
        vc = torch.randn(B, cap, Hkv, D, device=DEV, generator=g).to(cdt)
        table = None
    kw = dict(cache_seqlens=torch.full((B,), cap, device=DEV, dtype=torch.int32), page_table=table)
    if fp8:
        kw.update(k_descale=torch.full((B, Hkv), 0.5, device=DEV), v_descale=torch.full((B, Hkv), 0.5, device=DEV))
    return q, kc, vc, kw


def graph_of(fn, reps):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return g


rows = []
for name, B, Hq, Hkv, D, cap, page, fp8 in SHAPES:
    q, kc, vc, kw = case(B, Hq, Hkv, D, cap, page, fp8)
    outs, graphs = {}, {}
    kvbytes = 2 * B * cap * Hkv * D * kc.element_size()
    reps = max(2, min(50, int(2e9 / kvbytes)))
    for m in MODES:
        out = torch.empty_like(q)
        fn = lambda m=m, out=out: flashcore.attention_with_kvcache(q, kc, vc, secure=m, out=out, validate=False, **kw)
        flashcore.attention_with_kvcache(q, kc, vc, secure=m, out=out, **kw)
        outs[m] = out
        graphs[m] = graph_of(fn, reps)
    torch.cuda.synchronize()
    d_strict = (outs["strict"].float() - outs[True].float()).abs().max().item()
    eq = torch.equal(outs["strict"], outs[True])
    times = {str(m): [] for m in MODES}
    for r in range(7):
        for m in (MODES if r % 2 == 0 else MODES[::-1]):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); graphs[m].replay(); e1.record(); torch.cuda.synchronize()
            times[str(m)].append(e0.elapsed_time(e1) * 1000 / reps)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    rows.append(dict(shape=name, B=B, Hq=Hq, Hkv=Hkv, D=D, cap=cap, page=page, fp8=fp8, reps=reps, us=med,
                     all_us=times, strict_vs_secure_maxdiff=d_strict, strict_equals_secure=eq,
                     tbs={k: kvbytes / (v * 1e-6) / 1e12 for k, v in med.items()}))
    del graphs, outs, q, kc, vc
    torch.cuda.empty_cache()
env = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), git=os.environ.get("FLASHCORE_GIT_SHA"),
           date=time.strftime("%Y-%m-%d %H:%M:%S"))
os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
json.dump(dict(env=env, rows=rows), open(os.path.join(os.environ.get("OUT", "."), "strict-speed.json"), "w"), indent=1)
print(f"{'shape':20s} {'fast':>8s} {'secure':>8s} {'strict':>8s} {'sec/fast':>8s} {'str/fast':>8s} {'str/sec':>8s} eq  maxdiff")
for r in rows:
    u = r["us"]
    print(f"{r['shape']:20s} {u['False']:8.1f} {u['True']:8.1f} {u['strict']:8.1f} {u['False']/u['True']:8.3f} "
          f"{u['False']/u['strict']:8.3f} {u['True']/u['strict']:8.3f} {int(r['strict_equals_secure'])} {r['strict_vs_secure_maxdiff']:.2e}")
