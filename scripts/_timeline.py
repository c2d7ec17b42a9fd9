"""EXPERIMENT (perf-notes v15): per-warpgroup clock timeline of the Gluon kernel (GluonLaunch.exp_poly = 9 turns
the stamps on; the trace buffer goes in as seqlens_q_ptr)."""
import json, os, sys, statistics
import torch
import torch.nn.functional as F
from triton.testing import do_bench
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from flashcore import ops, kernels
from flashcore.kernels import hopper_fwd
from flashcore.kernels.configs import parse_config_name

out_dir = os.environ.get("OUT", ".")
TUNE = int(os.environ.get("TUNE", "0"))
SHAPES = [((4, 16, 1024, 64), "auto"), ((4, 16, 1024, 64), "gluon_ws_64x128s2"), ((1, 16, 1024, 64), "auto"),
          ((8, 16, 1024, 64), "auto"), ((4, 16, 1024, 128), "auto")]
res = []
flush = torch.empty(512 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
for (B, H, S, D), cname in SHAPES:
    cfg = parse_config_name(cname)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    sdpa = do_bench(lambda: F.scaled_dot_product_attention(q, k, v), warmup=25, rep=100) * 1e3
    kernels._PLANS.clear()
    call = ops.dense_call(q, k, v, None, None, False, D ** -0.5, False, False, False, out=o, config=cfg, validate=False)
    plain = do_bench(lambda: call(q, k, v, None, None, o), warmup=25, rep=100) * 1e3
    hopper_fwd.GluonLaunch.tune = 9 + TUNE
    kernels._PLANS.clear()
    call = ops.dense_call(q, k, v, None, None, False, D ** -0.5, False, False, False, out=o, config=cfg, validate=False)
    hopper_fwd.GluonLaunch.tune = 0
    g = call.plan.main
    grid = g.step.grid[0]
    nwg = g.step.constexprs["NUM_WG"]
    tr = torch.full((grid * nwg * 256,), -1, dtype=torch.int64, device="cuda")
    traced = do_bench(lambda: g.run((q, k, v, o, q, tr), q.device), warmup=25, rep=100) * 1e3
    ref = F.scaled_dot_product_attention(q, k, v)
    err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
    runs = []
    for rep in range(5):
        tr.fill_(-1)
        flush.zero_()
        torch.cuda.synchronize()
        g.run((q, k, v, o, q, tr), q.device)
        torch.cuda.synchronize()
        runs.append(tr.view(grid, nwg, 256).cpu())
    warm = []
    for rep in range(3):  # no flush: L2 and TLBs warm
        tr.fill_(-1)
        g.run((q, k, v, o, q, tr), q.device)
        torch.cuda.synchronize()
        warm.append(tr.view(grid, nwg, 256).cpu())
    torch.save(torch.stack(warm), os.path.join(out_dir, f"trace-{B}x{H}x{S}x{D}-{cname}-t{TUNE}-warm.pt"))
    t = runs[-1]
    # calibration: clock cycles per ns, from the consumer's first and last stamps
    cyc = (t[:, :, 253] - t[:, :, 0]).double()
    ns = (t[:, :, 255] - t[:, :, 254]).double()
    ghz = (cyc.sum() / ns.sum()).item()
    n_blocks = -(-S // 128)

    def item_stats(row):
        items = []
        for i in range(10):
            b = 1 + i * 24
            if row[b] < 0:
                break
            s = [row[b + 1]] + [row[b + 2 * j] for j in range(1, n_blocks)]
            pv = [row[b + 2 * j + 1] for j in range(1, n_blocks)]
            items.append(dict(q=row[b], s=s, pv=pv, lastpv=row[b + 22], end=row[b + 23]))
        return items

    rows = {}
    for w in range(nwg):
        st = dict(first_q=[], q_to_s0=[], s0_to_s1=[], step=[], last_step=[], epilogue=[], gap=[], total=[], items=[],
                  end_after_start=[])
        for p in range(grid):
            row = t[p, w].tolist()
            its = item_stats(row)
            if not its:
                continue
            st["first_q"].append(its[0]["q"] - row[0])
            st["total"].append(row[253] - row[0])
            st["items"].append(len(its))
            for a, it in enumerate(its):
                st["q_to_s0"].append(it["s"][0] - it["q"])
                if n_blocks > 1:
                    st["s0_to_s1"].append(it["s"][1] - it["s"][0])
                if n_blocks > 2:
                    st["step"].extend(it["s"][j + 1] - it["s"][j] for j in range(1, n_blocks - 1))
                st["last_step"].append(it["lastpv"] - it["s"][-1])
                st["epilogue"].append(it["end"] - it["lastpv"])
                if a + 1 < len(its):
                    st["gap"].append(its[a + 1]["q"] - it["end"])
        rows[f"wg{w}"] = {k: (statistics.median(v) / ghz / 1e3 if k != "items" else statistics.mean(v)) for k, v in st.items() if v}
        rows[f"wg{w}"]["step_p10_p90_us"] = [sorted(st["step"])[len(st["step"]) // 10] / ghz / 1e3,
                                              sorted(st["step"])[9 * len(st["step"]) // 10] / ghz / 1e3] if st["step"] else None
    r = dict(shape=[B, H, S, D], config=cname, grid=grid, num_wg=nwg, sdpa_us=sdpa, plain_us=plain, traced_us=traced,
             err=err, ghz=ghz, wg=rows)
    res.append(r)
    torch.save(torch.stack(runs), os.path.join(out_dir, f"trace-{B}x{H}x{S}x{D}-{cname}-t{TUNE}.pt"))
    print(json.dumps(r), flush=True)
json.dump(res, open(os.path.join(out_dir, f"timeline-t{TUNE}.json"), "w"), indent=1)
print("\nshape config sdpa plain traced | per WG (us): first_q q->s0 s0->s1 step last_step epilogue gap total items")
for r in res:
    print("x".join(map(str, r["shape"])), r["config"], f"{r['sdpa_us']:.1f} {r['plain_us']:.1f} {r['traced_us']:.1f} err {r['err']:.1e} {r['ghz']:.2f}GHz")
    for w, st in r["wg"].items():
        print("   ", w, " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in st.items()))
