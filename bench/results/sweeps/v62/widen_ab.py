"""session 46 (perf-notes v62): FP8 decode with the widening's byte permute before the two converts (one PRMT per
four values; the tree) against the form before (two PRMTs after the converts; `decode.py` loaded again from its
source with the earlier assembly, as a separate module whose split kernel the "old" plans launch). Same plans,
tiles and splits (the planner's); fast and secure; contiguous and page 16; B1 64k, B1 4k, B64 16k (32/8 heads, D 128,
bf16 q, e4m3 cache, every sequence full). Each form checked against the float64 reference (dequantised cache) and
against the other bit for bit, then timed: CUDA graphs of ~2 ms of calls replayed in a random order each round
(kv_configs.interleaved's method), and per call in the decode suite's timer (interleaved rounds). Writes
$OUT/widen_ab.json; prints a table."""
import importlib.util, json, os, random, statistics, sys, types
import torch
import flashcore.launch.triton_decode as LD
from flashcore.bench.experiments.kv_configs import _make, _planned, _graph_us
from flashcore.bench.timing import Timer
from flashcore.reference import attention_with_kvcache as reference

NEW_ASM = """            .reg .b16 a, b;
            .reg .b32 t;
            prmt.b32 t, $2, 0, 0x3120;
            mov.b32 {a, b}, t;
            cvt.rn.f16x2.e4m3x2 $0, a;
            cvt.rn.f16x2.e4m3x2 $1, b;"""
OLD_ASM = """            .reg .b16 a, b;
            .reg .b32 r, q;
            mov.b32 {a, b}, $2;
            cvt.rn.f16x2.e4m3x2 r, a;
            cvt.rn.f16x2.e4m3x2 q, b;
            prmt.b32 $0, r, q, 0x5410;
            prmt.b32 $1, r, q, 0x7632;"""
src_path = os.path.join(os.path.dirname(LD.__file__), "..", "kernels", "triton", "decode.py")
src = open(src_path).read()
assert NEW_ASM in src, "the tree's widening is not the new form"
old_path = "/tmp/flashcore_decode_old_widen.py"
open(old_path, "w").write(src.replace(NEW_ASM, OLD_ASM))
spec = importlib.util.spec_from_file_location("flashcore.kernels.triton.decode_old_widen", old_path)
old_mod = importlib.util.module_from_spec(spec)
old_mod.__package__ = "flashcore.kernels.triton"
sys.modules[spec.name] = old_mod
spec.loader.exec_module(old_mod)
NEW_KERNEL = LD.decode_split_kernel

dev = "cuda"
OUT = os.environ.get("OUT", ".")
ROUNDS = int(os.environ.get("ROUNDS", 60))
CASES = [  # (name, B, cap, page, secure)
    ("B1 64k", 1, 65536, 0, False), ("B1 64k p16", 1, 65536, 16, False), ("B64 16k", 64, 16384, 0, False),
    ("B64 16k p16", 64, 16384, 16, False), ("secure B1 64k", 1, 65536, 0, True), ("secure B64 16k", 64, 16384, 0, True)]
CASES = [c for c in CASES if not os.environ.get("ONLY") or c[0] in os.environ["ONLY"].split(",")]
g = torch.Generator(device=dev).manual_seed(int.from_bytes(os.urandom(4), "little"))
timer = Timer()
entries, rows = [], []


def planned(form, q, kc, vc, kw, secure):
    LD.decode_split_kernel = NEW_KERNEL if form == "new" else old_mod.decode_split_kernel
    try:
        plan, fn = _planned(q, kc, vc, kw, None, secure)
        out = fn()  # builds and runs the plan's steps with this form's kernel
        torch.cuda.synchronize()
    finally:
        LD.decode_split_kernel = NEW_KERNEL
    return plan, fn


for name, B, cap, page, secure in CASES:
    q, kc, vc, kw = _make(B, 32, 8, 128, cap, 1, page, True, g, dev)
    sets = [(q, kc, vc, kw)]
    if B * cap * 8 * 128 * 2 < 2 * timer.flush_buffer.numel():  # fits the L2 twice: rotate sets per call
        sets += [_make(B, 32, 8, 128, cap, 1, page, True, g, dev) for _ in range(8)]
    ref = reference(q.double(), kc.double(), vc.double(), cache_seqlens=kw["cache_seqlens"], page_table=kw.get("page_table"),
                    k_descale=kw.get("k_descale"), v_descale=kw.get("v_descale"))
    ref = ref[0] if isinstance(ref, tuple) else ref
    outs, fns, plans = {}, {}, {}
    for form in ("old", "new"):
        fl, pl = [], []
        for s in sets:
            plan, fn = planned(form, *s, secure)
            fl.append(fn)
            pl.append(plan)
        o = torch.full_like(q, float("nan"))
        pl[0](q, kc, vc, dict(kw), o)
        torch.cuda.synchronize()
        outs[form] = o
        fns[form], plans[form] = fl, pl
    err = {f: ((outs[f].double() - ref).norm() / ref.norm()).item() for f in outs}
    same = bool(torch.equal(outs["old"], outs["new"]))
    row = dict(case=name, config=str(plans["new"][0].config), rel_err=err, bit_equal=same, per_call={}, graph={})
    for form in ("old", "new"):
        fn = fns[form][0]
        one = _graph_us(fn)
        reps = max(1, min(200, round(2000 / one)))
        gr = torch.cuda.CUDAGraph()
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            fn()
        torch.cuda.current_stream().wait_stream(st)
        with torch.cuda.graph(gr):
            for _ in range(reps):
                fn()
        # the inputs, the plans (their outputs and workspaces) and the calls live as long as the graph that uses them
        entries.append(dict(row=row, form=form, graph=gr, reps=reps, times=[], keep=(sets, plans[form], fns[form])))
    for r in range(5):
        for form in random.sample(["old", "new"], 2):
            row["per_call"].setdefault(form, []).append(
                timer.stats(fns[form], flush=len(sets) == 1, rep_ms=40)["median_us"])
    rows.append(row)
    print(name, row["config"], err, same, flush=True)

rng = random.Random(11)
ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for _ in range(ROUNDS):
    order = list(range(len(entries)))
    rng.shuffle(order)
    for i in order:
        e = entries[i]
        ev[0].record()
        e["graph"].replay()
        ev[1].record()
        ev[1].synchronize()
        e["times"].append(1e3 * ev[0].elapsed_time(ev[1]) / e["reps"])
for e in entries:
    e["row"]["graph"][e["form"]] = dict(us=statistics.median(e["times"]), p10=sorted(e["times"])[len(e["times"]) // 10],
                                        p90=sorted(e["times"])[9 * len(e["times"]) // 10])
json.dump(dict(rows=rows, torch=torch.__version__, device=torch.cuda.get_device_name(),
               git=os.environ.get("FLASHCORE_GIT_SHA")), open(os.path.join(OUT, "widen_ab.json"), "w"), indent=1)
print(f"{'case':20s} {'graph old':>10s} {'graph new':>10s} {'new/old':>8s} {'call old':>9s} {'call new':>9s} {'new/old':>8s}  err(new) bits")
for r in rows:
    go, gn = r["graph"]["old"]["us"], r["graph"]["new"]["us"]
    co, cn = statistics.median(r["per_call"]["old"]), statistics.median(r["per_call"]["new"])
    print(f"{r['case']:20s} {go:10.2f} {gn:10.2f} {gn / go:8.3f} {co:9.2f} {cn:9.2f} {cn / co:8.3f}  {r['rel_err']['new']:.1e} {r['bit_equal']}")
