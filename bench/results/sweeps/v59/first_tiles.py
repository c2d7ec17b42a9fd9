"""session 43: does the fast split step wait on the length's load before its first K/V tile? Per-call time (the
decode suite's Timer: rotation, queue pre-filled) of the planner's form against EXP_FIRST variants:
1 = the length not loaded (capacity; right for full caches only: an upper bound of decoupling), 1x = the split's
first x tiles prefetched into L2 at the kernel's start (capacity-based chunks: the real ones at full length)."""
import json, os, random, statistics, sys, time
from dataclasses import replace
import torch
from flashcore.bench.timing import Timer
from flashcore.bench.experiments.kv_configs import _planned, _make
from flashcore.reference import attention_with_kvcache as reference

dev = "cuda"
OUT = os.environ.get("OUT", ".")
CASES = [tuple(int(x) for x in c.split(",")) for c in os.environ.get("CASES", "1,4096,0").split(";")]  # B,S,PAGE
MODES = [int(m) for m in os.environ.get("MODES", "0,1,11,12,14").split(",")]
SETS, ROUNDS = int(os.environ.get("SETS", 9)), int(os.environ.get("ROUNDS", 5))
g = torch.Generator(device=dev).manual_seed(int(time.time()) % 2**31)
timer = Timer()
results = {}
for (B, S, PAGE) in CASES:
    sets = max(2, min(SETS, int(400e6 // (B * S * 8 * 128 * 4))))
    ins = [_make(B, 32, 8, 128, S, 1, PAGE, False, g, dev) for _ in range(sets)]
    plan0, _ = _planned(*ins[0], None)
    base = plan0.config
    fns, err, same = {}, {}, {}
    for m in MODES:
        cfg = replace(base, exp_first=m)
        fns[m] = [_planned(q, k, v, kw, cfg)[1] for (q, k, v, kw) in ins]
        q, k, v, kw = ins[0]
        errs, eq = [], []
        for lens in (kw["cache_seqlens"], torch.randint(1, S + 1, (B,), device=dev, dtype=torch.int32)):
            t = dict(kw, cache_seqlens=lens)
            outs = []
            for c in (cfg, base):
                plan, _ = _planned(q, k, v, t, c)
                o = torch.full_like(q, float("nan"))
                plan(q, k, v, t, o)
                outs.append(o)
            torch.cuda.synchronize()
            ref = reference(q.double(), k.double(), v.double(), cache_seqlens=lens, page_table=kw.get("page_table"))
            ref = ref[0] if isinstance(ref, tuple) else ref
            errs.append(((outs[0].double() - ref).norm() / ref.norm()).item())
            eq.append(bool(torch.equal(outs[0], outs[1])))
        err[m], same[m] = errs, eq
    per = {m: [] for m in MODES}
    for r in range(ROUNDS):
        order = list(MODES)
        random.shuffle(order)
        for m in order:
            per[m].append(timer.stats(fns[m], flush=sets == 1, rep_ms=60)["median_us"])
    from torch.profiler import ProfilerActivity, profile
    kern = {}
    for m in MODES:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.cuda._sleep(2_000_000)
            for i in range(40):
                fns[m][i % sets]()
            torch.cuda.synchronize()
        ks = {}
        for e in prof.events():
            if e.device_type.name == "CUDA" and "sleep" not in e.name.lower():
                ks.setdefault(e.name[:28], []).append(e.device_time)
        kern[m] = {k: round(statistics.median(v), 2) for k, v in ks.items()}
    key = f"B{B}_S{S}_p{PAGE}"
    results[key] = dict(config=str(base), sets=sets, rel_err=err, equal_to_plan=same, per_call_us=per, kernels=kern)
    for m in MODES:
        print(f"{key:16s} mode {m:2d} med {statistics.median(per[m]):7.2f} [{min(per[m]):.2f}-{max(per[m]):.2f}] "
              f"err {['%.1e' % e for e in err[m]]} eq {same[m]} {kern[m]}", flush=True)
json.dump(dict(results=results, torch=torch.__version__, device=torch.cuda.get_device_name()),
          open(os.path.join(OUT, "first_tiles.json"), "w"), indent=1)
