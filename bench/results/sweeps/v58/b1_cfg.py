"""session 42: B1 32/8 4k D128 bf16 contiguous decode: split-kernel configurations under the suite's per-call timer
(rotation, queue pre-filled), their profiler kernel times, and correctness against the planner's output."""
import json, os, random, statistics, sys, time
import torch
import flashcore
from flashcore.bench.timing import Timer
from flashcore.bench.experiments.kv_configs import _planned, CFG
from flashcore.reference import attention_with_kvcache as reference

dev = "cuda"
OUT = os.environ.get("OUT", ".")
S, SETS = int(os.environ.get("S", 4096)), int(os.environ.get("SETS", 9))
CFGS = {
    "plan": None,
    "128_8w_3s_16": CFG(16, 128, 8, 3, 16),
    "64_4w_3s_32": CFG(16, 64, 4, 3, 32),
    "64_4w_4s_32": CFG(16, 64, 4, 4, 32),
    "64_4w_3s_16": CFG(16, 64, 4, 3, 16),
    "64_8w_3s_16": CFG(16, 64, 8, 3, 16),
    "128_8w_3s_8": CFG(16, 128, 8, 3, 8),
    "32_4w_4s_32": CFG(16, 32, 4, 4, 32),
    "128_8w_2s_16": CFG(16, 128, 8, 2, 16),
}
if os.environ.get("CFGLIST"):
    CFGS = {"plan": None}
    for item in os.environ["CFGLIST"].split(";"):
        f = item.split(",")
        ft = None if len(f) < 5 or f[4] == "-" else bool(int(f[4]))
        pf = None if len(f) < 6 else bool(int(f[5]))
        CFGS["_".join(f)] = CFG(16, int(f[0]), int(f[1]), int(f[2]), int(f[3]), full_tiles=ft, prefetch_pt=pf)
only = os.environ.get("ONLY")
if only:
    CFGS = {k: v for k, v in CFGS.items() if k in only.split(",")}
g = torch.Generator(device=dev).manual_seed(int(time.time()) % 2**31)
from flashcore.bench.experiments.kv_configs import _make
PAGE = int(os.environ.get("PAGE", 0))
BATCH = int(os.environ.get("B", 1))
FP8 = bool(int(os.environ.get("FP8", 0)))
ins = []
for i in range(SETS):
    q, k, v, kw = _make(BATCH, 32, 8, 128, S, 1, PAGE, FP8, g, dev)
    ins.append((q, k, v, kw))
fns, ref_err = {}, {}
for name, cfg in CFGS.items():
    calls = []
    for (q, k, v, kw) in ins:
        plan, fn = _planned(q, k, v, kw, cfg)
        calls.append((fn, plan))
    fns[name] = [c[0] for c in calls]
    if cfg is None:
        print("planner config", calls[0][1].config, flush=True)
    # correctness on set 0: full and random lengths, output poisoned with NaN first, float64 reference
    q, k, v, kw = ins[0]
    errs = []
    for lens in (kw["cache_seqlens"], torch.randint(1, S + 1, (BATCH,), device=dev, dtype=torch.int32)):
        t = dict(kw, cache_seqlens=lens)
        plan, _ = _planned(q, k, v, t, cfg)
        o = torch.full_like(q, float("nan"))
        plan(q, k, v, t, o)
        torch.cuda.synchronize()
        kd, vd = kw.get("k_descale"), kw.get("v_descale")
        ref = reference(q.double(), k.double(), v.double(), cache_seqlens=lens, page_table=kw.get("page_table"),
                        k_descale=kd, v_descale=vd)
        ref = ref[0] if isinstance(ref, tuple) else ref
        errs.append(((o.double() - ref).norm() / ref.norm()).item())
    ref_err[name] = errs
print("rel err", json.dumps(ref_err), flush=True)
timer = Timer()
rounds = int(os.environ.get("ROUNDS", 6))
per = {n: [] for n in CFGS}
for r in range(rounds):
    names = list(CFGS)
    random.shuffle(names)
    for n in names:
        st = timer.stats(fns[n], flush=SETS == 1, rep_ms=60)
        per[n].append(st["median_us"])
# profiler kernel times
from torch.profiler import ProfilerActivity, profile
kern = {}
for n in CFGS:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(2_000_000)
        for i in range(60):
            fns[n][i % SETS]()
        torch.cuda.synchronize()
    ks = {}
    for e in prof.events():
        if e.device_type.name == "CUDA" and "sleep" not in e.name.lower():
            ks.setdefault(e.name[:40], []).append(e.device_time)
    kern[n] = {k: round(statistics.median(v), 2) for k, v in ks.items()}
res = dict(S=S, sets=SETS, rel_err=ref_err, per_call_us=per, kernels=kern, torch=torch.__version__)
json.dump(res, open(os.path.join(OUT, f"b1_cfg_b{BATCH}_{S}_p{PAGE}_fp8{int(FP8)}.json"), "w"), indent=1)
for n in CFGS:
    print(f"{n:16s} per call med {statistics.median(per[n]):6.2f} [{min(per[n]):.2f}-{max(per[n]):.2f}]  {kern[n]}")
