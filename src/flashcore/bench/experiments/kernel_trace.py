"""Kernel time versus launch gap, from the profiler's (CUPTI) kernel timestamps, for flashcore beside SDPA.

do_bench's per-call events measure "launch gap + kernel time" after a 256 MB L2 flush; a CUDA graph measures
back-to-back kernels with a warm L2. When the two disagree on which backend is ahead, this tells which part
differs. For each shape and backend, two loops run under torch.profiler:

* ``flush``: do_bench's loop (zero the 256 MB buffer, then one call), N times;
* ``warm``: N calls back to back (no flush), as in a CUDA graph but eager.

Per call it records the kernel time (first kernel's start to last kernel's end) and the gap from the previous
kernel's end (the flush kernel's, in ``flush``) to the first kernel's start. Beside them, without the profiler:
do_bench's median, the same loop with the queue pre-filled (launch_overhead.window_us) and the host time per
call. Medians go to JSON. ``TRACE_EVENTS=1`` also records do_bench's events inside the traced loop.

Caution (perf-notes v13): the profiler lengthens a backend's window by ~1.5 µs per extra GPU operation in its
call (SDPA's memset before the cuDNN kernel), so compare the traced times within a backend, not across.

    python -m flashcore.bench.experiments.kernel_trace --out $OUT
"""
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import flashcore
from ...plan import knobs
from ..results import collect_environment
from .launch_overhead import window_us as do_bench_prefilled  # do_bench's loop, queue pre-filled
from . import parser

SHAPES = [(1, 8, 512, 64), (1, 16, 1024, 64), (4, 16, 1024, 64)]
N = 100
FLUSH_US = []
EVENTS = os.environ.get("TRACE_EVENTS") == "1"  # record do_bench's events inside the traced loop too
EVENT_US = []


def enqueue_us(fn, n=200):
    """Host time per call of ``fn`` while the GPU is busy (no call waits for it)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(4e8))
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


def trace(fn, flush=None, n=N):
    """[(gap_us, kernel_us, names)] per call; a call is every kernel between two flush kernels (or, without a
    flush, one call's kernels, counted by the number of kernels a single call launches)."""
    for _ in range(5):
        if flush is not None:
            flush.zero_()
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    per_call = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(int(1e8))  # GPU busy while the host enqueues: no host time in the gaps
        for s, e in ev:
            if flush is not None:
                flush.zero_()
            if EVENTS:
                s.record()
            fn()
            if EVENTS:
                e.record()
        torch.cuda.synchronize()
    if EVENTS:
        EVENT_US.append(statistics.median(s.elapsed_time(e) for s, e in ev) * 1e3)
    ks = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start),
                key=lambda t: t[0])
    ks = [k for k in ks if "sleep" not in k[2].lower()]
    calls = []
    i = 0
    prev_end = None
    while i < len(ks):
        if flush is not None:
            if "FillFunctor<int>" in ks[i][2]:  # the flush (the inputs are bf16: no backend fills int32)
                FLUSH_US.append(ks[i][1] - ks[i][0])
                prev_end = ks[i][1]
                i += 1
                continue
        group = ks[i:i + per_call]
        i += per_call
        if prev_end is not None:
            calls.append((group[0][0] - prev_end, group[-1][1] - group[0][0], [g[2][:60] for g in group]))
        prev_end = group[-1][1]
    return calls


def summary(calls):
    gaps = [c[0] for c in calls]
    ks = [c[1] for c in calls]
    return {"gap_us": statistics.median(gaps), "kernel_us": statistics.median(ks),
            "kernel_us_p10": sorted(ks)[len(ks) // 10], "n": len(calls), "kernels": calls[0][2] if calls else []}


def main(argv=None):
    ap = parser(__spec__.name, __doc__)
    a = ap.parse_args(argv)
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    rows = []
    for B, H, S, D in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1e3) % 2**31)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        row = {"shape": [B, H, S, D]}
        backends = {"sdpa_default": lambda: F.scaled_dot_product_attention(q, k, v)}
        for mode in ("auto", "triton", "gluon_ws"):
            backends[f"flashcore_{mode}"] = (mode, lambda: flashcore.attention(q, k, v))
        for name, spec in backends.items():
            mode, fn = spec if isinstance(spec, tuple) else (None, spec)
            if mode is not None:
                os.environ[knobs.HOPPER_KERNEL_ENV] = mode
            out = fn()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 2e-2, (name, err)
            row[name] = {"rel_err": err, "flush": summary(trace(fn, flush))}
            if EVENTS:
                row[name]["flush"]["event_us"] = EVENT_US[-1]
            row[name].update({"warm": summary(trace(fn)),
                         "do_bench_us": do_bench(fn, return_mode="median") * 1e3,
                         "do_bench_prefilled_us": do_bench_prefilled(fn, flush), "enqueue_us": enqueue_us(fn)})
        os.environ.pop(knobs.HOPPER_KERNEL_ENV, None)
        rows.append(row)
    env = collect_environment()
    os.makedirs(a.out, exist_ok=True)
    env["flush_kernel_us"] = statistics.median(FLUSH_US)
    with open(os.path.join(a.out, "kernel-trace.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    print(f"{'shape':16s} {'backend':20s} {'flush gap':>9s} {'flush krn':>9s} {'p10':>7s} {'warm gap':>8s} {'warm krn':>8s} {'do_bench':>8s} {'prefill':>8s} {'host':>6s}")
    for r in rows:
        for name, v in r.items():
            if name == "shape":
                continue
            print(f"{'x'.join(map(str, r['shape'])):16s} {name:20s} {v['flush']['gap_us']:9.2f} "
                  f"{v['flush']['kernel_us']:9.2f} {v['flush']['kernel_us_p10']:7.2f} {v['warm']['gap_us']:8.2f} "
                  f"{v['warm']['kernel_us']:8.2f} {v['do_bench_us']:8.2f} {v['do_bench_prefilled_us']:8.2f} "
                  f"{v['enqueue_us']:6.1f} {v['flush'].get('event_us', 0):6.2f} {v['flush']['kernels'][-1][:30]}")
    print(f"flush kernel: median {statistics.median(FLUSH_US):.1f} us; host per flush+2 events: {enqueue_us(lambda: (flush.zero_(), torch.cuda.Event(enable_timing=True).record(), torch.cuda.Event(enable_timing=True).record())):.1f} us")


if __name__ == "__main__":
    main()
