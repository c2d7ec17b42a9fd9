"""session 43 (perf-notes v59, v60): a DecodeConfig field (FIELD: round_robin, merged) off and on against the planner's
form. Per-call time (the decode suite's Timer: rotation, queue pre-filled), CUDA-graph replays, profiler kernel
times, and each form's output against the float64 reference and against the planner's (full and random lengths,
NaN-poisoned outputs); with GRAPHCHECK=1 also a captured graph replayed with new lengths against an eager call.
CASES "B,S,PAGE[,FP8];..."; forms: the planner's (pol), FIELD False (off) and True (on)."""
import json, os, random, statistics, sys, time
from dataclasses import replace
import torch
from flashcore.bench.timing import Timer
from flashcore.bench.experiments.kv_configs import _planned, _make
from flashcore.reference import attention_with_kvcache as reference

dev = "cuda"
OUT = os.environ.get("OUT", ".")
CASES = [tuple(int(x) for x in c.split(",")) for c in os.environ.get("CASES", "1,4096,16").split(";")]
FIELD = os.environ.get("FIELD", "round_robin")
FORMS = {"pol": {}, "off": {FIELD: False}, "on": {FIELD: True}}
if os.environ.get("FORMS"):  # "name:field=int,field=int;..." (e.g. "off:warm_table=0;l1:warm_table=1,warm_level=1")
    FORMS = {"pol": {}}
    for item in os.environ["FORMS"].split(";"):
        name, _, kv = item.partition(":")
        FORMS[name] = {k: int(v) for k, v in (x.split("=") for x in kv.split(",") if x)}
MODES = list(FORMS)
SETS, ROUNDS = int(os.environ.get("SETS", 9)), int(os.environ.get("ROUNDS", 5))
g = torch.Generator(device=dev).manual_seed(int(time.time()) % 2**31)
timer = Timer()
results = {}
for case in CASES:
    B, S, PAGE = case[:3]
    FP8 = bool(case[3]) if len(case) > 3 else False
    sets = max(2, min(SETS, int(400e6 // (B * S * 8 * 128 * (2 if FP8 else 4)))))
    ins = [_make(B, 32, 8, 128, S, 1, PAGE, FP8, g, dev) for _ in range(sets)]
    plan0, _ = _planned(*ins[0], None)
    base = plan0.config
    fns, err, same = {}, {}, {}
    for m in MODES:
        cfg = replace(base, **FORMS[m])
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
            ref = reference(q.double(), k.double(), v.double(), cache_seqlens=lens, page_table=kw.get("page_table"),
                            k_descale=kw.get("k_descale"), v_descale=kw.get("v_descale"))
            ref = ref[0] if isinstance(ref, tuple) else ref
            errs.append(((outs[0].double() - ref).norm() / ref.norm()).item())
            eq.append(bool(torch.equal(outs[0], outs[1])))
        err[m], same[m] = errs, eq
        pl = _planned(q, k, v, kw, cfg)[0]
        fns[m + "_ce"] = (pl.split.constexprs.get(FIELD.upper(), False) if FIELD.upper() in pl.split.constexprs
                          else getattr(pl, FIELD, None) is not None)
        if os.environ.get("GRAPHCHECK") == "1":  # a graph captured once, replayed with new lengths
            t = dict(kw, cache_seqlens=kw["cache_seqlens"].clone())
            plan, _ = _planned(q, k, v, t, cfg)
            go = torch.full_like(q, float("nan"))
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                plan(q, k, v, t, go)
            torch.cuda.current_stream().wait_stream(side)
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                plan(q, k, v, t, go)
            ok = []
            for _ in range(3):
                t["cache_seqlens"].copy_(torch.randint(0, S + 1, (B,), device=dev, dtype=torch.int32))
                go.fill_(float("nan"))
                gr.replay()
                eo = torch.full_like(q, float("nan"))
                plan(q, k, v, dict(t, cache_seqlens=t["cache_seqlens"].clone()), eo)
                torch.cuda.synchronize()
                ok.append(bool(torch.equal(go, eo)))
            err[m + "_graph_equals_eager"] = ok
    per = {m: [] for m in MODES}
    for r in range(ROUNDS):
        order = list(MODES)
        random.shuffle(order)
        for m in order:
            per[m].append(timer.stats(fns[m], flush=sets == 1, rep_ms=60)["median_us"])
    graph = {m: [] for m in MODES}  # CUDA graphs: one call per input set, replayed; per call
    if os.environ.get("GRAPHS", "1") == "1":
        gs = {}
        for m in MODES:
            for f in fns[m]:
                f()
            torch.cuda.synchronize()
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                for f in fns[m]:
                    f()
            gs[m] = gr
        for r in range(ROUNDS):
            order = list(MODES)
            random.shuffle(order)
            for m in order:
                gs[m].replay()
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                n = max(3, int(20000 // (sets * max(statistics.median(per[m]), 1.0))))
                e0.record()
                for _ in range(n):
                    gs[m].replay()
                e1.record()
                torch.cuda.synchronize()
                graph[m].append(e0.elapsed_time(e1) * 1000 / (n * sets))
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
    key = f"B{B}_S{S}_p{PAGE}" + ("_fp8" if FP8 else "")
    results[key] = dict(config=str(base), sets=sets, rel_err=err, equal_to_plan=same, per_call_us=per, graph_per_call_us=graph, kernels=kern,
                        field=FIELD, taken={m: fns[m + "_ce"] for m in MODES})
    for m in MODES:
        print(f"{key:20s} {m:3s} {FIELD[:6]}={fns[m + '_ce']!s:5s} med {statistics.median(per[m]):7.2f} [{min(per[m]):.2f}-{max(per[m]):.2f}] "
              f"graph {statistics.median(graph[m]) if graph[m] else 0:7.2f} err {['%.1e' % e for e in err[m]]} eq {same[m]} "
              f"{kern[m]}", flush=True)
json.dump(dict(results=results, torch=torch.__version__, device=torch.cuda.get_device_name()),
          open(os.path.join(OUT, f"{FIELD}_ab.json"), "w"), indent=1)
