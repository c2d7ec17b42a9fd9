"""A/B (one process, interleaved rounds): the split step triggering its combine step's launch at its start
against the implicit trigger at the split's completion. As run (git a0ca890 + the experiment), the arms flipped a
module flag, TD.SPLIT_TRIGGERS_COMBINE, that build_split read; the shipped form is launch.triton_decode.triggers_combine
(perf-notes v43), so this script documents the measurement rather than running against the current tree.
Per call: eager calls queued behind a GPU sleep (the host never starves the GPU), rotating 8 input sets so the K/V
come from HBM; and CUDA-graph replays of the same rotation. Writes $OUT/pdl-ab.json."""
import json, os, time
import torch
import flashcore
from flashcore.launch import triton_decode as TD
from flashcore.plan.cache import PLANS

DEV = "cuda"
SHAPES = [("B1 4k", 1, 4096, 0, False, False), ("B1 4k p16", 1, 4096, 16, False, False),
          ("B1 4k secure", 1, 4096, 0, True, False), ("B1 64k", 1, 65536, 0, False, False),
          ("B1 64k p16", 1, 65536, 16, False, False), ("B1 4k fp8", 1, 4096, 0, False, True),
          ("B4 8k", 4, 8192, 0, False, False)]
SETS = 8


def inputs(B, cap, page, fp8, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(B, 1, 32, 128, device=DEV, dtype=torch.bfloat16, generator=g)
    cdt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    if page:
        w = cap // page
        kc, vc = (torch.randn(B * w, page, 8, 128, device=DEV, generator=g).to(cdt) for _ in range(2))
        table = torch.randperm(B * w, device=DEV, generator=g).view(B, w).int()
    else:
        kc, vc = (torch.randn(B, cap, 8, 128, device=DEV, generator=g).to(cdt) for _ in range(2))
        table = None
    kw = dict(cache_seqlens=torch.full((B,), cap, device=DEV, dtype=torch.int32), page_table=table)
    if fp8:
        kw.update(k_descale=torch.full((B, 8), 0.5, device=DEV), v_descale=torch.full((B, 8), 0.5, device=DEV))
    return q, kc, vc, kw, torch.empty_like(q)


def measure(sets, secure, n_eager=160):
    calls = [lambda s=s: flashcore.attention_with_kvcache(s[0], s[1], s[2], secure=secure, out=s[4], validate=False,
                                                         **s[3]) for s in sets]
    for c in calls:
        c()
    torch.cuda.synchronize()
    # eager, queued behind a sleep
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(1980e6 * n_eager * 120e-6))
    e0.record()
    for i in range(n_eager):
        calls[i % len(calls)]()
    e1.record()
    torch.cuda.synchronize()
    eager = e0.elapsed_time(e1) * 1000 / n_eager
    # graph of 4 rotations
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(4):
            for c in calls:
                c()
    gr.replay(); torch.cuda.synchronize()
    e0.record(); gr.replay(); e1.record(); torch.cuda.synchronize()
    graph = e0.elapsed_time(e1) * 1000 / (4 * len(calls))
    return eager, graph


rows = []
for name, B, cap, page, secure, fp8 in SHAPES:
    sets = [inputs(B, cap, page, fp8, 100 + i) for i in range(SETS)]
    res = {"off": {"eager": [], "graph": []}, "on": {"eager": [], "graph": []}}
    outs = {}
    for r in range(4):
        for arm in (("off", "on") if r % 2 == 0 else ("on", "off")):
            TD.SPLIT_TRIGGERS_COMBINE = arm == "on"
            PLANS.clear()
            e, g = measure(sets, secure)
            res[arm]["eager"].append(e); res[arm]["graph"].append(g)
            outs[arm] = sets[0][4].clone()
    med = {a: {k: sorted(v)[len(v) // 2] for k, v in d.items()} for a, d in res.items()}
    same = torch.equal(outs["on"], outs["off"])
    rows.append(dict(shape=name, B=B, cap=cap, page=page, secure=secure, fp8=fp8, res=res, med=med, same_output=same))
    print(f"{name:14s} eager off {med['off']['eager']:7.2f} on {med['on']['eager']:7.2f} ({med['on']['eager']/med['off']['eager']:.3f}) "
          f"graph off {med['off']['graph']:7.2f} on {med['on']['graph']:7.2f} ({med['on']['graph']/med['off']['graph']:.3f}) same {same}", flush=True)
    del sets
    torch.cuda.empty_cache()
os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
json.dump(dict(env=dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, git=os.environ.get("FLASHCORE_GIT_SHA"),
                        date=time.strftime("%Y-%m-%d %H:%M:%S")), rows=rows),
          open(os.path.join(os.environ.get("OUT", "."), "pdl-ab.json"), "w"), indent=1)
