"""Where the Gluon kernel's time goes, per work item (perf-notes v15): runs a traced launch
(``hopper_fwd.GluonLaunch.trace``: SM clock stamps per consumer warpgroup) after an L2 flush and again warm, and
prints the median phase durations (flashcore.bench.timeline) beside the untraced and SDPA times. Non-causal only
(causal items differ in length). Writes ``timeline.json`` and the raw traces (``trace-<shape>-<config>.pt``).

    PYTHONPATH=src python scripts/kernel_timeline.py --shapes 4x16x1024x64,1x16x1024x64 [--config gluon_ws_64x128s2]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from flashcore import kernels, ops  # noqa: E402
from flashcore.bench import timeline  # noqa: E402
from flashcore.kernels import hopper_fwd  # noqa: E402
from flashcore.kernels.configs import parse_config_name  # noqa: E402


def plan(q, k, v, o, cfg, trace):
    hopper_fwd.GluonLaunch.trace = trace
    kernels._PLANS.clear()
    try:
        return ops.dense_call(q, k, v, None, None, False, q.shape[-1] ** -0.5, False, False, False, out=o,
                              config=cfg, validate=False)
    finally:
        hopper_fwd.GluonLaunch.trace = False
        kernels._PLANS.clear()


def run_shape(B, H, S, D, cname, reps, flush, out_dir):
    cfg = parse_config_name(cname)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    F.scaled_dot_product_attention(q, k, v)  # cuDNN plans a new shape on its first call: not in the timing
    torch.cuda.synchronize()
    sdpa_us = do_bench(lambda: F.scaled_dot_product_attention(q, k, v), warmup=25, rep=100) * 1e3
    call = plan(q, k, v, o, cfg, False)
    plain_us = do_bench(lambda: call(q, k, v, None, None, o), warmup=25, rep=100) * 1e3
    g = plan(q, k, v, o, cfg, True).plan.main
    if type(g).__name__ != "GluonLaunch":
        raise SystemExit(f"{B}x{H}x{S}x{D} {cname}: the plan runs {type(g).__name__}, not the Gluon kernel")
    grid, nwg = g.step.grid[0], g.step.constexprs["NUM_WG"]
    tr = torch.empty(grid * nwg * hopper_fwd.TRACE_SLOTS, dtype=torch.int64, device="cuda")
    o.fill_(float("nan"))
    g.run((q, k, v, o, q, tr), q.device)
    ref = F.scaled_dot_product_attention(q, k, v).float()
    err = ((o.float() - ref).norm() / ref.norm()).item()
    res = dict(shape=[B, H, S, D], config=cname, grid=grid, num_wg=nwg, sdpa_us=sdpa_us, plain_us=plain_us, err=err)
    n_blocks = -(-S // 128)
    for label in ("cold", "warm"):
        raw = []
        for _ in range(reps):
            tr.fill_(-1)
            if label == "cold":
                flush.zero_()
            torch.cuda.synchronize()
            g.run((q, k, v, o, q, tr), q.device)
            torch.cuda.synchronize()
            raw.append(tr.view(grid, nwg, hopper_fwd.TRACE_SLOTS).cpu())
        torch.save(torch.stack(raw), os.path.join(out_dir, f"trace-{B}x{H}x{S}x{D}-{cname}-{label}.pt"))
        last = raw[-1].tolist()
        ghz = timeline.clock_ghz(last)
        res[label] = dict(ghz=ghz, phases_us=timeline.summary(timeline.phases(last, n_blocks, ghz)))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="4x16x1024x64,1x16x1024x64,4x16x1024x128", help="BxHxSxD,... (non-causal)")
    ap.add_argument("--config", default="auto", help="a config's sweep name (configs.config_name), or auto")
    ap.add_argument("--reps", type=int, default=3, help="traced runs per state; the last is summarised")
    a = ap.parse_args()
    rows = []
    shapes = []
    for item in a.shapes.split(","):
        try:
            B, H, S, D = (int(x) for x in item.split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: each shape is BxHxSxD (non-causal), got {item!r}") from None
        if min(B, H, S, D) < 1 or S < 129:
            raise SystemExit(f"--shapes: {item!r} needs positive sizes and S > 128 (at least two key tiles)")
        shapes.append((B, H, S, D))
    try:
        parse_config_name(a.config)
    except ValueError as e:
        raise SystemExit(f"--config: {e}") from None
    if a.reps < 1:
        raise SystemExit(f"--reps must be >= 1, got {a.reps}")
    if not torch.cuda.is_available():
        raise SystemExit("kernel_timeline.py needs a Hopper GPU")
    flush = torch.empty(512 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")  # > L2, and most TLB reach
    for B, H, S, D in shapes:
        r = run_shape(B, H, S, D, a.config, a.reps, flush, a.out)
        rows.append(r)
        print(json.dumps(r), flush=True)
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, sha=os.environ.get("FLASHCORE_GIT_SHA"),
               date=time.strftime("%Y-%m-%d %H:%M:%S"))
    with open(os.path.join(a.out, "timeline.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    cols = [p for p in timeline.PHASES if p != "span"] + ["span", "span_max"]
    print(f"\nmedian us per consumer warpgroup (warpgroup 0); span_max: the last program\n{'shape':>14} {'state':>5} "
          f"{'sdpa':>6} {'ours':>6} " + " ".join(f"{c:>10}" for c in cols))
    for r in rows:
        for label in ("cold", "warm"):
            ph = r[label]["phases_us"][0]
            print(f"{'x'.join(map(str, r['shape'])):>14} {label:>5} {r['sdpa_us']:6.1f} {r['plain_us']:6.1f} "
                  + " ".join(f"{ph.get(c, float('nan')):10.3f}" for c in cols))
    print("max error vs SDPA:", max(r["err"] for r in rows))


if __name__ == "__main__":
    main()
