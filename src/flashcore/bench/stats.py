"""Summary statistics of timing samples (pure Python: testable without a GPU)."""
from __future__ import annotations

import math
from typing import Sequence

STAT_KEYS = ("median_us", "min_us", "mean_us", "p95_us", "p99_us", "max_us")


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, as numpy.percentile's default."""
    if not samples:
        raise ValueError("percentile of an empty sample")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(float(x) for x in samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize_ms(samples_ms: Sequence[float]) -> dict:
    """Timing samples in milliseconds (CUDA events' unit) → statistics in microseconds."""
    if len(samples_ms) == 0:
        raise ValueError("no timing samples to summarize")
    bad = [x for x in samples_ms if not math.isfinite(x) or x < 0]
    if bad:
        raise ValueError(f"timing samples must be finite and non-negative, got {bad[0]!r}")
    us = [1000.0 * float(x) for x in samples_ms]
    return {
        "n": len(us),
        "median_us": percentile(us, 50),
        "min_us": min(us),
        "mean_us": sum(us) / len(us),
        "p95_us": percentile(us, 95),
        "p99_us": percentile(us, 99),
        "max_us": max(us),
    }


def tflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e12


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        raise ValueError("geometric mean of no positive values")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
