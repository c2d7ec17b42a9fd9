"""Host cost of one eager call: flashcore (each kernel, with and without the Gluon launch's encoded
descriptor cache) beside SDPA. Two measures per backend:

* ``enqueue_us``: host time to issue one call while the GPU is held busy (``torch.cuda._sleep``), so
  no call waits for the GPU: the pure Python + driver cost a serving loop pays per call;
* ``sync_us``: wall time of one call plus ``synchronize`` (median), what a synchronous caller sees;
* ``loop_us``: wall time per call of 200 calls issued back to back, then one ``synchronize``: the
  larger of host and GPU time, what an eager loop sees;
* ``gpu_us``: ``do_bench`` (L2 flushed; the host cost hides behind the flush).

``--dispatch`` times small shapes on both kernels this way: where the Gluon kernel's host cost no
longer hides behind its GPU time, the planner's size threshold (plan.tables.GLUON_MIN_WORK) decides.
The kernel is forced with ``FLASHCORE_HOPPER_KERNEL`` (a knob: part of every plan key, so no cache is cleared).

    python -m flashcore.bench.experiments.host_latency --out $OUT
"""
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import flashcore
from ...api import plan_attention
from ...kernels import SM90_FWD
from ...plan import knobs
from .. import timing
from ..results import collect_environment
from . import parser

SHAPES = [(1, 8, 512, 64), (1, 16, 1024, 64), (4, 16, 1024, 64), (1, 16, 1024, 128)]
DISPATCH = [(1, 8, 512, 128), (1, 16, 1024, 128), (2, 16, 1024, 128), (1, 8, 2048, 128), (2, 16, 1024, 64),
            (1, 32, 1024, 64), (1, 16, 2048, 64)]


def enqueue_us(fn, n=200, rounds=7):
    """Median over rounds of the mean host time per call, each round issued behind a GPU spin."""
    fn(); torch.cuda.synchronize()
    per_round = []
    for _ in range(rounds):
        torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU spin: every call below is queued behind it
        t = time.perf_counter()
        for _ in range(n):
            fn()
        per_round.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_round)


def loop_us(fn, n=200):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def sync_us(fn, n=200):
    """Median wall time of one call + synchronize (the bench's host latency, over ``n`` calls)."""
    fn()
    return timing.host_latency_us([fn], calls=n, budget_s=60.0)


def gpu_us(fn):
    return do_bench(fn, return_mode="median") * 1e3


def main(argv=None):
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--dispatch", action="store_true", help="also small shapes on both kernels (loop_us, gpu_us)")
    a = ap.parse_args(argv)
    rows = []
    for B, H, S, D in SHAPES + (DISPATCH if a.dispatch else []):
        g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1e3) % 2**31)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        row = {"shape": [B, H, S, D]}
        sd = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
        fc = lambda: flashcore.attention(q, k, v)  # noqa: E731
        timers = dict(enqueue_us=enqueue_us, sync_us=sync_us, loop_us=loop_us, gpu_us=gpu_us)
        row["sdpa_default"] = {n: t(sd) for n, t in timers.items()}
        for mode in ("triton", "gluon_ws"):
            os.environ[knobs.HOPPER_KERNEL_ENV] = mode
            ref = F.scaled_dot_product_attention(q, k, v).float()
            err = ((fc().float() - ref).norm() / ref.norm()).item()
            row[f"flashcore_{mode}"] = {**{n: t(fc) for n, t in timers.items()}, "rel_err_vs_sdpa": err}
            plan = plan_attention(q, k, v)  # the plan the calls above ran
            row[f"flashcore_{mode}"]["plan"] = plan.selection.explain()
            if mode == "gluon_ws" and plan.selection.kernel == SM90_FWD.name:
                launch = plan.main
                row["gluon_fast_path"] = bool(launch.fast)
                saved, launch.fast = launch.fast, False  # the same calls through Triton's own launcher
                try:  # (descriptors encoded each call)
                    row["flashcore_gluon_ws_uncached"] = {n: t(fc) for n, t in timers.items() if n != "gpu_us"}
                finally:
                    launch.fast = saved
        os.environ.pop(knobs.HOPPER_KERNEL_ENV)
        rows.append(row)
    env = collect_environment()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "host_latency.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    names = ["sdpa_default", "flashcore_triton", "flashcore_gluon_ws", "flashcore_gluon_ws_uncached"]
    print(f"{'shape':>16} " + " ".join(f"{n:>28}" for n in names) + "   (enqueue / sync / loop / gpu us)")
    for r in rows:
        print(f"{'x'.join(map(str, r['shape'])):>16} " + " ".join(
            "{:>6.1f}/{:>6.1f}/{:>6.1f}/{:>6.1f}".format(*(r[n].get(t, float("nan")) for t in
                                                        ("enqueue_us", "sync_us", "loop_us", "gpu_us")))
            for n in names))


if __name__ == "__main__":
    main()
