"""Timing statistics and the sampling plan (pure functions; no GPU)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from flashcore.bench import timing
from flashcore.bench.stats import geomean, percentile, summarize_ms


@pytest.mark.parametrize("samples", [[3.0], [2.0, 1.0], [5.0, 1.0, 4.0, 2.0, 3.0], list(np.linspace(0.1, 9.3, 37)),
                                     list(np.random.default_rng(0).lognormal(size=101))])
@pytest.mark.parametrize("q", [0, 5, 50, 95, 99, 100])
def test_percentile_matches_numpy(samples, q):
    assert percentile(samples, q) == pytest.approx(float(np.percentile(samples, q)), rel=1e-12, abs=1e-12)


def test_summary_in_microseconds_matches_numpy():
    ms = list(np.random.default_rng(1).uniform(0.01, 0.02, size=200))
    s = summarize_ms(ms)
    us = np.array(ms) * 1000.0
    assert s["n"] == 200
    assert s["median_us"] == pytest.approx(np.median(us))
    assert s["mean_us"] == pytest.approx(us.mean())
    assert s["p95_us"] == pytest.approx(np.percentile(us, 95))
    assert s["p99_us"] == pytest.approx(np.percentile(us, 99))
    assert (s["min_us"], s["max_us"]) == (pytest.approx(us.min()), pytest.approx(us.max()))


def test_an_outlier_moves_the_mean_and_max_but_not_the_median():
    clean = [0.010] * 99
    noisy = clean + [5.0]  # one 5 ms hiccup (e.g. a context switch)
    a, b = summarize_ms(clean), summarize_ms(noisy)
    assert b["median_us"] == pytest.approx(a["median_us"]) == pytest.approx(10.0)
    assert b["max_us"] == pytest.approx(5000.0)
    assert b["mean_us"] > 5 * a["mean_us"]
    assert b["p95_us"] == pytest.approx(10.0)


def test_empty_and_invalid_samples_are_errors():
    with pytest.raises(ValueError, match="no timing samples"):
        summarize_ms([])
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError):
        summarize_ms([0.1, float("nan")])
    with pytest.raises(ValueError):
        summarize_ms([0.1, -1.0])
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_geomean():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([0.5, None, 2.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        geomean([None])


def test_rotation_only_when_the_working_set_fits_in_l2():
    l2 = 50 * 2**20
    assert timing.use_rotation(2 * 2**20, l2)
    assert not timing.use_rotation(268 * 2**20, l2)


@pytest.mark.parametrize("io_mb", [0.5, 2, 8, 32, 50])
def test_rotation_sets_push_more_than_two_l2_between_reuses(io_mb):
    l2 = 50 * 2**20
    io = int(io_mb * 2**20)
    n = timing.rotation_sets(io, l2)
    assert n >= 2
    if n < 64:  # uncapped: (n-1) other sets pass between two uses of one set
        assert (n - 1) * io >= 2 * l2
    assert n <= 64


def test_plan_repeats_follows_the_time_budget_within_bounds():
    assert timing.plan_repeats(1.0, rep_ms=100, warmup_ms=25) == (25, 100)
    n_warm, n_rep = timing.plan_repeats(0.001, rep_ms=100, warmup_ms=25)
    assert n_rep == timing.MAX_REPS and n_warm == 200
    n_warm, n_rep = timing.plan_repeats(50.0, rep_ms=100, warmup_ms=25)
    assert n_rep == timing.MIN_REPS and n_warm == 1


def test_sleep_covers_the_host_enqueue_time_and_is_capped():
    cycles_per_ms = 1.8e6
    c = timing.sleep_cycles(0.05, 50, cycles_per_ms)  # 50 calls × 50 µs of host time
    assert c >= 50 * 0.05 * cycles_per_ms
    assert timing.sleep_cycles(10.0, 50, cycles_per_ms) == int(timing.MAX_SLEEP_MS * cycles_per_ms)
    assert timing.sleep_cycles(0.0, 1, cycles_per_ms) >= 1
    assert math.isfinite(c)


def test_clean_flush_zeroes_then_reads_twice_the_l2():
    """The clean-L2 flush (the decode suite's ``timing_clean_l2``): the buffer zeroed as before, then a read of
    2x L2 of other data (its sum lands in a preallocated scalar). Its first GPU run failed on the sum's overload."""
    import torch

    t = timing.Timer.__new__(timing.Timer)  # no GPU: the flush itself on CPU tensors
    t.device, t.flush_buffer, t._evict = torch.device("cpu"), torch.full((16,), 7, dtype=torch.int32), None
    t.flush()
    assert t._evict is None and not t.flush_buffer.any()
    t.flush_buffer.fill_(7)
    t.flush(clean=True)
    assert not t.flush_buffer.any()
    assert t._evict.numel() * t._evict.element_size() == 2 * timing.DEFAULT_L2_BYTES
    assert int(t._sink) == t._evict.numel()
