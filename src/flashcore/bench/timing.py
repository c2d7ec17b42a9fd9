"""GPU timing: CUDA-event samples with a cold L2, host latency, CUDA-graph time, ceilings.

Methodology (recorded in every result file):

* Every timed call starts with a cold L2, as in ``triton.testing.do_bench``: either the 256 MB
  buffer do_bench writes is zeroed before the call ("l2-flush"), or, when one input set fits in
  L2, the calls cycle through enough distinct input sets that more than 2×L2 of other data passes
  between two uses of a set ("rotate"; it avoids timing the write-back of the flush buffer's dirty
  lines, which inflates microsecond-scale kernels).
* Each call is bracketed by its own pair of CUDA events; warm-up calls are not recorded.
* "clean-l2" (the decode suite's second time of a flushed case): the flush, then an untimed read of 2x L2 of
  another buffer, so the timed call evicts clean lines only. The flush's zeroing leaves the L2 full of dirty lines
  whose write-back (~8 µs on an H200) lands inside the timed call and is the same for every kernel, which hides
  ratios between calls that read different byte counts (an FP8 cache against a bf16 one).
* The GPU queue is pre-filled: a spin kernel (``torch.cuda._sleep``) long enough to cover the
  host's enqueue time of a chunk of calls runs first, so host launch overhead never shows up
  in the event times (with do_bench it does whenever the host is slower than the flush).
* For comparison with numbers taken with do_bench, ``triton.testing.do_bench``'s own median
  is recorded beside ours (``do_bench_median_us``).
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Sequence

import torch

from .stats import summarize_ms

L2_FLUSH_BYTES = 256 * 1024 * 1024  # what triton.testing.do_bench zeroes before each call
DEFAULT_L2_BYTES = 50 * 1024 * 1024  # H100 SXM
CHUNK = 50  # timed calls per pre-filled queue
MIN_REPS, MAX_REPS = 30, 1000
MAX_SLEEP_MS = 200.0
GRAPH_CALLS = 20
SMALL_FLOPS = 2e10  # host latency and CUDA-graph time are measured below this

METHOD_NOTES = {
    "l2-flush": "256 MB buffer zeroed before every timed call (triton.testing.do_bench's cache flush)",
    "rotate": "inputs cycled through N distinct sets (> 2x L2 between reuses), no flush",
    "clean-l2": "timing_clean_l2 (decode, flushed cases): the l2-flush, then an untimed read of 2x L2 of another "
                "buffer: the L2 is cold and clean (no dirty write-back inside the timed call)",
    "queue": "GPU queue pre-filled with torch.cuda._sleep so host launch overhead is excluded",
    "stat": "median of per-call CUDA-event times; warm-up excluded",
    "do_bench_median_us": "triton.testing.do_bench(fn, return_mode='median') on input set 0, for comparison",
    "host_latency_us": "median wall-clock of fn() + torch.cuda.synchronize() (time.perf_counter)",
    "cuda_graph_us": f"{GRAPH_CALLS} calls captured in one CUDA graph, replay time / {GRAPH_CALLS} (warm L2)",
}


# ---------------------------------------------------------------- pure planning helpers
def use_rotation(io_bytes: int, l2_bytes: int) -> bool:
    """Rotate input sets (instead of flushing) when one set fits in L2."""
    return io_bytes <= l2_bytes


def rotation_sets(io_bytes: int, l2_bytes: int, max_sets: int = 64) -> int:
    """Sets needed so that more than 2×L2 bytes of other sets pass between two uses of one set."""
    return int(min(max_sets, max(2, math.ceil(2 * l2_bytes / max(io_bytes, 1)) + 1)))


def plan_repeats(estimate_ms: float, rep_ms: float, warmup_ms: float,
                 min_reps: int = MIN_REPS, max_reps: int = MAX_REPS) -> tuple:
    """(n_warmup, n_repeat) from a per-call time estimate, as do_bench does, but clamped so that
    percentiles have enough samples and slow shapes do not run for minutes."""
    est = max(float(estimate_ms), 1e-4)
    n_warmup = int(min(max(1, warmup_ms / est), 200))
    n_repeat = int(min(max(min_reps, rep_ms / est), max_reps))
    return n_warmup, n_repeat


def sleep_cycles(host_ms_per_call: float, calls: int, cycles_per_ms: float, cap_ms: float = MAX_SLEEP_MS) -> int:
    """Spin long enough for the host to enqueue ``calls`` calls (1.5× margin, capped)."""
    ms = min(cap_ms, 1.5 * host_ms_per_call * calls + 0.02)
    return max(1, int(ms * cycles_per_ms))


# ---------------------------------------------------------------- timer
class Timer:
    """Cold-L2 CUDA-event timing of zero-argument callables on the current device."""

    def __init__(self, device=None):
        self.device = torch.device(device or "cuda")
        self.flush_buffer = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=self.device)
        self.cycles_per_ms = self._calibrate_sleep()
        self._evict = None  # made on the first clean flush: 2x L2 of clean data

    def flush(self, clean: bool = False) -> None:
        self.flush_buffer.zero_()
        if clean:
            if self._evict is None:
                l2 = (torch.cuda.get_device_properties(self.device).L2_cache_size if self.device.type == "cuda"
                      else 0) or DEFAULT_L2_BYTES
                self._evict = torch.ones(2 * l2 // 4, dtype=torch.int32, device=self.device)
                self._sink = torch.empty((), dtype=torch.int64, device=self.device)
            torch.sum(self._evict, 0, dtype=torch.int64, out=self._sink)

    @staticmethod
    def _calibrate_sleep() -> float:
        """GPU clock cycles per millisecond of torch.cuda._sleep (used to size the queue pre-fill)."""
        cycles = 10_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        rate = 1.5e6
        for _ in range(2):  # the first run includes the module load
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            torch.cuda.synchronize()
            rate = cycles / max(start.elapsed_time(end), 1e-3)
        return rate

    def _timed_calls(self, fns: Sequence[Callable], count: int, offset: int, flush: bool, events,
                     clean: bool = False) -> None:
        n = len(fns)
        for i in range(count):
            fn = fns[(offset + i) % n]
            if flush:
                self.flush(clean)
            events[i][0].record()
            fn()
            events[i][1].record()

    def _estimate_ms(self, fns, flush: bool, clean: bool = False) -> float:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(5)]
        torch.cuda.synchronize()
        self._timed_calls(fns, 5, 0, flush, events, clean)
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in events)

    def measure(self, fns: Sequence[Callable], *, flush: bool, rep_ms: float = 100.0, warmup_ms: float = 25.0,
                clean: bool = False) -> list:
        """Per-call times in ms. ``fns`` are cycled through (one per input set when rotating). ``clean``: each
        flush is followed by an untimed read of 2x L2 (METHOD_NOTES["clean-l2"])."""
        fns = list(fns)
        clean = clean and flush
        n_warmup, n_repeat = plan_repeats(self._estimate_ms(fns, flush, clean), rep_ms, warmup_ms)
        chunk = min(CHUNK, n_repeat)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(chunk)]
        # Warm-up with exactly the timed enqueue pattern; it also measures the host cost per call.
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for done in range(0, n_warmup, chunk):
            self._timed_calls(fns, min(chunk, n_warmup - done), done, flush, events, clean)
        host_ms = (time.perf_counter() - t0) * 1e3 / n_warmup
        torch.cuda.synchronize()
        samples = []
        for done in range(0, n_repeat, chunk):
            count = min(chunk, n_repeat - done)
            torch.cuda._sleep(sleep_cycles(host_ms, count, self.cycles_per_ms))
            self._timed_calls(fns, count, done, flush, events, clean)
            torch.cuda.synchronize()
            samples.extend(s.elapsed_time(e) for s, e in events[:count])
        return samples

    def stats(self, fns, *, flush: bool, rep_ms: float = 100.0, clean: bool = False) -> dict:
        return summarize_ms(self.measure(fns, flush=flush, rep_ms=rep_ms, clean=clean))


def do_bench_median_us(fn: Callable, rep_ms: float = 100.0) -> float:
    import triton.testing

    return 1000.0 * float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def host_latency_us(fns: Sequence[Callable], calls: int = 30, budget_s: float = 1.0) -> float:
    """Median wall-clock of one eager call including its completion (perf_counter + synchronize)."""
    fns = list(fns)
    torch.cuda.synchronize()
    times = []
    deadline = time.perf_counter() + budget_s
    for i in range(calls):
        t0 = time.perf_counter()
        fns[i % len(fns)]()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() > deadline and len(times) >= 5:
            break
    return 1e6 * statistics.median(times)


def cuda_graph_us(fn, calls: int = GRAPH_CALLS, replays: int = 10) -> float:
    """Per-call time of ``calls`` calls captured in one CUDA graph (median over replays). ``fn``: one callable,
    or a sequence of them that the captured calls cycle through (one per input set: L2 stays cold).

    Raises whatever capture raises; the caller reports the backend as not capturable.
    """
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs requires
        for i in range(max(3, len(fns))):
            fns[i % len(fns)]()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        per_call.append(1000.0 * start.elapsed_time(end) / calls)
    del graph
    return statistics.median(per_call)


# ---------------------------------------------------------------- ceilings
MATMUL_N = 8192
COPY_BYTES = 1024 ** 3


def measure_ceilings(timer: Timer, dtype: torch.dtype, rep_ms: float = 100.0) -> dict:
    """The two roofs every result is compared with, measured in this run on this GPU."""
    n = MATMUL_N
    a = torch.randn(n, n, dtype=dtype, device=timer.device)
    b = torch.randn(n, n, dtype=dtype, device=timer.device)
    c = torch.empty(n, n, dtype=dtype, device=timer.device)
    mm = timer.stats([lambda: torch.matmul(a, b, out=c)], flush=True, rep_ms=rep_ms)
    del a, b, c
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=timer.device)
    dst = torch.empty_like(src)
    cp = timer.stats([lambda: dst.copy_(src)], flush=True, rep_ms=rep_ms)
    del src, dst
    torch.cuda.empty_cache()
    return {
        "matmul_tflops": 2 * n ** 3 / (mm["median_us"] * 1e-6) / 1e12,
        "copy_gbps": 2 * COPY_BYTES / (cp["median_us"] * 1e-6) / 1e9,
        "matmul": {"m": n, "n": n, "k": n, "dtype": str(dtype).replace("torch.", ""), "timing": mm},
        "copy": {"bytes": COPY_BYTES, "note": "device-to-device copy; bandwidth counts bytes read + written",
                 "timing": cp},
    }


READ_BYTES = 1024 ** 3


def measure_read_ceiling(timer: Timer, rep_ms: float = 100.0) -> dict:
    """Read-only bandwidth: ``torch.sum`` of a 1 GiB bf16 buffer (bytes read / time). A generic reduction, not a
    tuned stream: context for decode (which only reads), beside the copy ceiling the fractions are taken of."""
    buf = torch.zeros(READ_BYTES // 2, dtype=torch.bfloat16, device=timer.device)
    st = timer.stats([lambda: buf.sum(dtype=torch.float32)], flush=True, rep_ms=rep_ms)
    del buf
    torch.cuda.empty_cache()
    return {"read_gbps": READ_BYTES / (st["median_us"] * 1e-6) / 1e9,
            "read": {"bytes": READ_BYTES, "note": "torch.sum(dtype=float32) of a bf16 buffer; bytes read / time",
                     "timing": st}}
