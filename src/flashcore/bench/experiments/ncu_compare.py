"""Nsight Compute side by side: one flashcore kernel configuration and SDPA's default backend on
the same shape, profiled in fresh processes (pipe utilisation, issue slots, instruction mix,
occupancy). Writes one text report per subject to --out and prints the key metrics as a table.
Used for the "why is it where it is" entries of docs/perf-notes.md.

    python -m flashcore.bench.experiments.ncu_compare --shape 16,16,2048,64 --config 128x128w8s2_r128 --out $OUT

A config is written as in ``flashcore bench sweep`` (plan.tables.config_name):
``{BM}x{BN}w{warps}s{stages}[_inloop][_tma][_r{maxnreg}]``, or
``gluon_ws_s{stages}`` (128x128) or ``gluon_ws_{BM}x{BN}s{stages}`` for the warp-specialised Gluon kernel, or
``auto`` for the planner's choice. ``--cache none`` profiles with a warm L2 (ncu's default flushes it).
``--source`` also writes each kernel's per-instruction page (SASS, execution counts and warp-stall samples by
reason) as CSV, for finding where the warps wait (``ncu-src-*.csv``).
"""
import argparse
import os
import re
import subprocess
import sys

import torch
import torch.nn.functional as F

from ... import ops
from ...plan.tables import parse_config_name
from . import parser

KEY_METRICS = [
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
    "sm__inst_executed_pipe_fma.sum",
    "sm__inst_executed_pipe_alu.sum",
    "sm__inst_executed_pipe_xu.sum",
    "sm__inst_executed_pipe_uniform.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "sm__cycles_active.avg",
    "gpc__cycles_elapsed.max",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_sector_hit_rate.pct",
]


def parse_config(text):
    try:
        return parse_config_name(text)
    except ValueError as e:
        raise SystemExit(f"--config: {e}")


def child(shape, subject):
    """The profiled process: three calls of ``subject`` (the third is profiled: --launch-skip 2)."""
    B, H, S, D = shape
    g = torch.Generator(device="cuda").manual_seed(1234)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    if subject == "sdpa":
        fn = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    else:
        call = ops.dense_plan(q, k, v, None, None, False, D ** -0.5, False, False, False,
                              config=parse_config(subject), validate=False)
        fn = lambda: call(q, k, v, None, None)[0]  # noqa: E731
    for _ in range(3):
        fn()
    torch.cuda.synchronize()


def main(argv=None):
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--shape", required=True, help="B,H,S,D (bf16, non-causal)")
    ap.add_argument("--config", action="append", default=[], help="flashcore config(s); SDPA is always profiled")
    ap.add_argument("--cache", choices=("all", "none"), default="all",
                    help="ncu --cache-control: all = caches flushed before the kernel (cold, the default), none = warm")
    ap.add_argument("--source", action="store_true", help="also export the per-instruction source page (CSV)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    shape = tuple(int(x) for x in a.shape.split(","))
    if a.child:
        child(shape, a.child)
        return
    rows = {}
    for subject in ["sdpa"] + (a.config or ["auto"]):
        kernel = r"regex:sdpa|fmha|flash|cudnn" if subject == "sdpa" else "regex:attn_fwd"
        cmd = ["ncu", "--clock-control", "none", "--cache-control", a.cache, "-k", kernel,
               "--launch-skip", "2", "--launch-count", "1",
               "--section", "SpeedOfLight", "--section", "ComputeWorkloadAnalysis", "--section", "InstructionStats",
               "--section", "WarpStateStats", "--section", "SchedulerStats", "--section", "Occupancy",
               "--section", "LaunchStats", "--metrics", ",".join(KEY_METRICS), "--print-units", "base",
               sys.executable, "-m", __spec__.name, "--shape", a.shape, "--child", subject]
        tag = f"ncu-{'x'.join(map(str, shape))}-{subject}-cache-{a.cache}.txt"
        if a.source:
            rep = os.path.join(a.out, tag[:-4])
            cmd[1:1] = ["--section", "SourceCounters", "-f", "-o", rep]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        text = res.stdout + res.stderr
        if a.source:
            page = subprocess.run(["ncu", "--import", rep + ".ncu-rep", "--csv", "--page", "source",
                                   "--print-source", "sass"], capture_output=True, text=True, timeout=300)
            with open(os.path.join(a.out, "ncu-src-" + tag[4:-4] + ".csv"), "w") as f:
                f.write(page.stdout + page.stderr)
            text = subprocess.run(["ncu", "--import", rep + ".ncu-rep", "--print-units", "base", "--page", "details",
                                   "--print-details", "all"], capture_output=True, text=True, timeout=300).stdout
            os.remove(rep + ".ncu-rep")
        with open(os.path.join(a.out, tag), "w") as f:
            f.write(text)
        vals = {}
        for m in KEY_METRICS:
            hit = re.search(rf"^\s*{re.escape(m)}\s+\S*\s+([\d,.]+)\s*$", text, re.M)
            vals[m] = hit.group(1) if hit else "?"
        rows[subject] = vals
    names = list(rows)
    print(f"{'metric':<80}" + "".join(f"{n:>20}" for n in names))
    for m in KEY_METRICS:
        print(f"{m:<80}" + "".join(f"{rows[n][m]:>20}" for n in names))


if __name__ == "__main__":
    main()
