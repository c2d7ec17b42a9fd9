"""``flashcore bench timeline``: where the Gluon kernel's time goes, per work item (perf-notes v15).

Runs a traced launch (the ``trace`` switch of ``plan.knobs.GluonSwitches``: SM clock stamps per consumer
warpgroup) after an L2 flush and again warm, and prints the median phase durations (:mod:`flashcore.bench.timeline`)
beside the untraced and SDPA times. Non-causal only (causal items differ in length). Writes ``timeline.json`` and
the raw traces (``trace-<shape>-<config>-<cold|warm>.pt``) to ``--out``.

    flashcore bench timeline --shapes 4x16x1024x64,1x16x1024x64 [--config gluon_ws_64x128s2]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from .. import ops
from ..kernels import SM90_FWD
from ..plan import knobs
from ..plan.tables import parse_config_name
from . import timeline
from .suites import SuiteError, parse_shapes


def register(tools) -> None:
    p = tools.add_parser("timeline", help="per-phase timeline of the Gluon kernel from its trace stamps (cold, warm)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "."), metavar="DIR", help="where the files go ($OUT or .)")
    p.add_argument("--shapes", default="4x16x1024x64,1x16x1024x64,4x16x1024x128", help="BxHxSxD,... (non-causal)")
    p.add_argument("--config", default="auto", help="a config's sweep name (plan.tables.config_name), or auto")
    p.add_argument("--reps", type=int, default=3, help="traced runs per state; the last is summarised")
    p.set_defaults(func=run)


def parse_args(args) -> tuple:
    """(shapes, config) from the parsed options; SystemExit with a message naming the bad option."""
    try:
        shapes = parse_shapes(args.shapes)
    except SuiteError as e:
        raise SystemExit(f"--shapes: {e}") from None
    for s in shapes:
        if s.causal or s.Sq < 129:
            raise SystemExit(f"--shapes: {s.label} must be non-causal with S > 128 (at least two key tiles)")
    try:
        cfg = parse_config_name(args.config)
    except ValueError as e:
        raise SystemExit(f"--config: {e}") from None
    if args.reps < 1:
        raise SystemExit(f"--reps must be >= 1, got {args.reps}")
    return shapes, cfg


def plan(q, k, v, o, cfg, trace: bool):
    """The Gluon plan for these tensors, traced or not (the switch is read when the launch is planned)."""
    with knobs.override(trace=trace):
        return ops.dense_plan(q, k, v, None, None, False, q.shape[-1] ** -0.5, False, False, False, out=o,
                              config=cfg, validate=False)


def run_shape(B, H, S, D, cname, cfg, reps, flush, out_dir) -> dict:
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    F.scaled_dot_product_attention(q, k, v)  # cuDNN plans a new shape on its first call: not in the timing
    torch.cuda.synchronize()
    sdpa_us = do_bench(lambda: F.scaled_dot_product_attention(q, k, v), warmup=25, rep=100) * 1e3
    plain = plan(q, k, v, o, cfg, False)
    plain_us = do_bench(lambda: plain(q, k, v, None, None, o), warmup=25, rep=100) * 1e3
    traced = plan(q, k, v, o, cfg, True)
    if traced.selection.kernel != SM90_FWD.name:
        raise SystemExit(f"{B}x{H}x{S}x{D} {cname}: the plan runs {traced.selection.explain()}, not the Gluon kernel")
    g = traced.main
    grid, nwg = g.step.grid[0], g.step.constexprs["NUM_WG"]
    tr = torch.empty(g.trace_slots, dtype=torch.int64, device="cuda")
    o.fill_(float("nan"))
    g.run((q, k, v, o, q, tr), q.device)  # the trace buffer takes the lengths' argument
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
            raw.append(tr.view(grid, nwg, -1).cpu())
        torch.save(torch.stack(raw), os.path.join(out_dir, f"trace-{B}x{H}x{S}x{D}-{cname}-{label}.pt"))
        last = raw[-1].tolist()
        ghz = timeline.clock_ghz(last)
        res[label] = dict(ghz=ghz, phases_us=timeline.summary(timeline.phases(last, n_blocks, ghz)))
    return res


def table_lines(rows) -> list:
    """Median us per phase of consumer warpgroup 0, cold and warm, beside SDPA's and the untraced time."""
    cols = [p for p in timeline.PHASES if p != "span"] + ["span", "span_max"]
    lines = ["", "median us per consumer warpgroup (warpgroup 0); span_max: the last program",
             f"{'shape':>14} {'state':>5} {'sdpa':>6} {'ours':>6} " + " ".join(f"{c:>10}" for c in cols)]
    for r in rows:
        for label in ("cold", "warm"):
            ph = r[label]["phases_us"][0]
            lines.append(f"{'x'.join(map(str, r['shape'])):>14} {label:>5} {r['sdpa_us']:6.1f} {r['plain_us']:6.1f} "
                         + " ".join(f"{ph.get(c, float('nan')):10.3f}" for c in cols))
    return lines


def run(args) -> int:
    shapes, cfg = parse_args(args)
    if not torch.cuda.is_available():
        raise SystemExit("flashcore bench timeline needs a Hopper GPU")
    os.makedirs(args.out, exist_ok=True)
    flush = torch.empty(512 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")  # > L2, and most TLB reach
    rows = []
    for s in shapes:
        rows.append(run_shape(s.B, s.Hq, s.Sq, s.D, args.config, cfg, args.reps, flush, args.out))
        print(json.dumps(rows[-1]), flush=True)
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, sha=os.environ.get("FLASHCORE_GIT_SHA"),
               date=time.strftime("%Y-%m-%d %H:%M:%S"))
    with open(os.path.join(args.out, "timeline.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    for line in table_lines(rows):
        print(line)
    print("max error vs SDPA:", max(r["err"] for r in rows))
    return 0
