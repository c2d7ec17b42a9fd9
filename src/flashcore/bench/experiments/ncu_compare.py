"""Nsight Compute side by side: one flashcore kernel configuration and SDPA's default backend on
the same shape, profiled in fresh processes (pipe utilisation, issue slots, instruction mix,
occupancy). Writes one text report per subject to --out and prints the key metrics as a table.
Used for the "why is it where it is" entries of docs/perf-notes.md.

``--pass bwd`` profiles the backward instead: every kernel of one backward call (between profiler start and stop,
after two warm-up steps) of each ``--peer`` (``flashcore``, ``sdpa-cudnn``, ``fa4``; the training bench's callables,
causal with ``--causal``), with the heaviest kernel's metrics in the table and every kernel's time beside it, so that
a backward's main loop and its side passes (pre-pass, zeroing, dQ conversion) are read apart. With ``--peer flashcore``
it takes one ``--config`` in the backward planner's names (``plan.backward.bwd_config_name``), which replaces the
planner in the profiled process.

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
# the backward's consumers wait on shared memory, barriers and the copy engine more than the forward's (v35)
BWD_METRICS = KEY_METRICS + [
    "sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "smsp__inst_executed_pipe_lsu.sum",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
]
PEERS = ("flashcore", "sdpa-cudnn", "fa4")
# each peer's main backward kernel, by name (ncu -k): flashcore's Gluon dK/dV(+dQ) kernel, cuDNN's and FA4's bprop
MAIN_BWD_KERNEL = {"flashcore": "regex:attn_bwd_dkdv", "sdpa-cudnn": "regex:bprop", "fa4": "regex:bwd_sm90"}
_KERNEL_HEADER = re.compile(
    r"^\s{0,4}(\S.*?)\s+\((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), (?:Context|Device)", re.M)


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


def metric_values(text, metrics):
    """``{metric: value string}`` read from one kernel's ncu details text ("?" where absent)."""
    vals = {}
    for m in metrics:
        hit = re.search(rf"^\s*{re.escape(m)}\s+\S*\s+([\d,.]+)\s*$", text, re.M)
        vals[m] = hit.group(1) if hit else "?"
    return vals


def kernel_blocks(text):
    """ncu's details output split per profiled kernel: ``[(name, grid, block, text)]`` in launch order."""
    heads = list(_KERNEL_HEADER.finditer(text))
    out = []
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        grid = tuple(int(x) for x in h.groups()[1:4])
        block = tuple(int(x) for x in h.groups()[4:7])
        out.append((h.group(1), grid, block, text[h.start():end]))
    return out


def _number(v):
    return float(v.replace(",", "")) if v not in ("?", "") else float("nan")


SECTIONS = [x for name in ("SpeedOfLight", "ComputeWorkloadAnalysis", "InstructionStats", "WarpStateStats",
                            "SchedulerStats", "Occupancy", "LaunchStats") for x in ("--section", name)]


def _profile(a, tag, selection, metrics, child_args, source_selection, timeout):
    """ncu over a child process of this module (``child_args``), the kernels chosen by ``selection``; the report's
    text goes to ``--out/tag`` and is returned. ``--source`` adds the per-instruction page (SASS, execution counts,
    stall samples) of the kernels ``source_selection`` names, as CSV (``ncu-src-*.csv``)."""
    cmd = ["ncu", "--clock-control", "none", "--cache-control", a.cache, *selection, *SECTIONS,
           "--metrics", ",".join(metrics), "--print-units", "base", sys.executable, "-m", __spec__.name, *child_args]
    rep = os.path.join(a.out, tag[:-4])
    if a.source:
        cmd[1:1] = ["--section", "SourceCounters", "-f", "-o", rep, *source_selection]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    text = res.stdout + res.stderr
    if a.source:
        page = subprocess.run(["ncu", "--import", rep + ".ncu-rep", "--csv", "--page", "source", "--print-source",
                               "sass"], capture_output=True, text=True, timeout=300)
        with open(os.path.join(a.out, "ncu-src-" + tag[4:-4] + ".csv"), "w") as f:
            f.write(page.stdout + page.stderr)
        text = subprocess.run(["ncu", "--import", rep + ".ncu-rep", "--print-units", "base", "--page", "details",
                               "--print-details", "all"], capture_output=True, text=True, timeout=300).stdout
        os.remove(rep + ".ncu-rep")
    with open(os.path.join(a.out, tag), "w") as f:
        f.write(text)
    return text


def child_bwd(shape, peer, causal, bwd_config=None):
    """The profiled process of ``--pass bwd``: two forward+backward steps, then the third's backward between
    ``cudaProfilerStart`` and ``Stop`` (ncu, started with profiling off, profiles every kernel in between).
    ``bwd_config`` (a ``plan.backward`` config name) replaces flashcore's planner for this process."""
    from ..training import TrainCase, _call, _inputs

    if bwd_config:
        from ... import ops
        from ...plan.backward import parse_bwd_config_name
        cfg = parse_bwd_config_name(bwd_config)
        ops.backward_config = lambda *args, **kw: cfg

    B, H, S, D = shape
    case = TrainCase(B, H, H, S, D, causal)
    fn = _call(peer, case)
    if fn is None:
        raise SystemExit(f"{peer} is not installed here")
    (q, k, v), do = _inputs(case, torch.bfloat16, 1234)
    for i in range(3):
        out = fn(q, k, v)
        if i == 2:  # (a profiler range, not NVTX: autograd launches the backward from its own thread)
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        out.backward(do)
        if i == 2:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        q.grad = k.grad = v.grad = None
    torch.cuda.synchronize()


def main_bwd(a, shape):
    """``--pass bwd``: every kernel of one backward per peer; the table holds each peer's heaviest kernel."""
    rows, kernels = {}, {}
    for peer in a.peer or list(PEERS):
        cfg = a.config[0] if a.config else None
        tag = (f"ncu-bwd-{'x'.join(map(str, shape))}{'-causal' if a.causal else ''}-{peer}{'-' + cfg if cfg else ''}"
               f"-cache-{a.cache}.txt")
        child = (["--pass", "bwd", "--shape", a.shape, "--child", peer] + (["--causal"] if a.causal else [])
                 + ([f"--bwd-config={cfg}"] if cfg else []))
        # (--source: the per-instruction page of the main kernel only)
        text = _profile(a, tag, ["--profile-from-start", "off"], BWD_METRICS, child, ["-k", MAIN_BWD_KERNEL[peer]],
                        timeout=900)
        blocks = [(name, metric_values(body, BWD_METRICS)) for name, _, _, body in kernel_blocks(text)]
        if not blocks:
            print(f"{peer}: no kernel profiled (see {tag})")
            continue
        kernels[peer] = [(name[:60], _number(vals["gpu__time_duration.sum"]) / 1e3) for name, vals in blocks]
        rows[peer] = max(blocks, key=lambda b: _number(b[1]["gpu__time_duration.sum"]))[1]
    for peer, ks in kernels.items():
        total = sum(t for _, t in ks)
        print(f"{peer}: {len(ks)} kernels, {total:.1f} us in all")
        for name, t in ks:
            print(f"  {t:10.1f} us  {name}")
    names = list(rows)
    print(f"{'metric (heaviest kernel)':<80}" + "".join(f"{n:>20}" for n in names))
    for m in BWD_METRICS:
        print(f"{m:<80}" + "".join(f"{rows[n][m]:>20}" for n in names))


def main(argv=None):
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--shape", required=True, help="B,H,S,D (bf16; non-causal unless --causal, --pass bwd only)")
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="fwd",
                    help="fwd: one forward kernel (default); bwd: every kernel of one backward, per --peer")
    ap.add_argument("--peer", action="append", default=[], choices=PEERS,
                    help="--pass bwd: the backends to profile (default: all three)")
    ap.add_argument("--causal", action="store_true", help="--pass bwd: causal (bottom-right)")
    ap.add_argument("--config", action="append", default=[],
                    help="flashcore config(s); SDPA is always profiled. --pass bwd: one backward config "
                         "(plan.backward's names, e.g. 32x128w4s3-64x64w4s3-atomic-gluon128x128w8s2) with --peer "
                         "flashcore")
    ap.add_argument("--cache", choices=("all", "none"), default="all",
                    help="ncu --cache-control: all = caches flushed before the kernel (cold, the default), none = warm")
    ap.add_argument("--source", action="store_true", help="also export the per-instruction source page (CSV)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bwd-config", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    shape = tuple(int(x) for x in a.shape.split(","))
    if a.pass_ == "fwd" and (a.peer or a.causal):
        ap.error("--peer and --causal are for --pass bwd")
    if a.pass_ == "bwd" and a.config and not a.child:
        from ...plan.backward import parse_bwd_config_name
        if len(a.config) > 1 or a.peer != ["flashcore"]:
            ap.error("--pass bwd takes one --config, with --peer flashcore alone")
        try:
            parse_bwd_config_name(a.config[0])
        except ValueError as e:
            ap.error(f"--config: {e}")
    if a.child:
        if a.pass_ == "bwd":
            child_bwd(shape, a.child, a.causal, a.bwd_config)
        else:
            child(shape, a.child)
        return
    if a.pass_ == "bwd":
        main_bwd(a, shape)
        return
    rows = {}
    for subject in ["sdpa"] + (a.config or ["auto"]):
        kernel = r"regex:sdpa|fmha|flash|cudnn" if subject == "sdpa" else "regex:attn_fwd"
        tag = f"ncu-{'x'.join(map(str, shape))}-{subject}-cache-{a.cache}.txt"
        text = _profile(a, tag, ["-k", kernel, "--launch-skip", "2", "--launch-count", "1"], KEY_METRICS,
                        ["--shape", a.shape, "--child", subject], [], timeout=300)
        rows[subject] = metric_values(text, KEY_METRICS)
    names = list(rows)
    print(f"{'metric':<80}" + "".join(f"{n:>20}" for n in names))
    for m in KEY_METRICS:
        print(f"{m:<80}" + "".join(f"{rows[n][m]:>20}" for n in names))


if __name__ == "__main__":
    main()
