"""flashcore.bench.timeline: the Gluon kernel's TRACE stamps -> phase durations (CPU: a synthetic trace whose
phases are known)."""
import pytest

from flashcore.bench import timeline
from flashcore.kernels.sm90.trace import TRACE_ITEM0, TRACE_ITEM_SLOTS, TRACE_MAX_STEPS, TRACE_SLOTS

GHZ = 2.0  # clocks per ns in the synthetic trace


def _row(items, n_blocks, startup=1000, q_to_s0=300, step=2000, first_step=1800, last_step=1500, o_math=100,
         o_store=200, o_wait=50, gap=400, t0=10_000):
    """One warpgroup's row: ``items`` work items with fixed phase lengths in ns (clocks = GHZ * ns)."""
    row = [-1] * TRACE_SLOTS
    c = lambda ns: int(t0 + GHZ * ns)  # noqa: E731
    row[0], row[2] = c(0), 5_000_000
    t = startup
    for i in range(items):
        b = TRACE_ITEM0 + i * TRACE_ITEM_SLOTS
        row[b] = c(t)
        t += q_to_s0
        row[b + 1] = c(t)
        for j in range(1, n_blocks):
            t += first_step if j == 1 else step
            if j < TRACE_MAX_STEPS:
                row[b + 2 * j] = c(t)
                row[b + 2 * j + 1] = c(t + 10)
        t += last_step
        row[b + 22] = c(t)
        t += o_math
        row[b + 20] = c(t)
        t += o_store
        row[b + 21] = c(t)
        t += o_wait
        row[b + 23] = c(t)
        if i + 1 < items:
            t += gap
    row[1], row[3] = c(t), 5_000_000 + t
    return row, t


def test_phases_recover_a_known_timeline():
    n = 8
    a, span_a = _row(3, n)
    b, span_b = _row(2, n, step=2200)
    trace = [[a, a], [b, b]]  # two programs, two warpgroups each
    assert timeline.clock_ghz(trace) == pytest.approx(GHZ)
    ph = timeline.phases(trace, n)
    assert set(ph) == {0, 1}
    p = ph[0]
    assert p["startup"] == pytest.approx([1.0, 1.0])
    assert p["q_to_s0"] == pytest.approx([0.3] * 5) and p["first_step"] == pytest.approx([1.8] * 5)
    assert sorted(p["step"]) == pytest.approx([2.0] * (3 * (n - 2)) + [2.2] * (2 * (n - 2)))
    assert p["last_step"] == pytest.approx([1.5] * 5) and p["gap"] == pytest.approx([0.4] * 3)
    assert p["o_math"] == pytest.approx([0.1] * 5) and p["o_store"] == pytest.approx([0.2] * 5)
    assert p["o_wait"] == pytest.approx([0.05] * 5)
    assert sorted(p["span"]) == pytest.approx(sorted([span_a / 1e3, span_b / 1e3]))
    s = timeline.summary(ph)[1]
    assert s["step"] == pytest.approx(2.0) and s["span_max"] == pytest.approx(max(span_a, span_b) / 1e3)


def test_items_past_the_recorded_steps_skip_the_last_step():
    """Items longer than TRACE_MAX_STEPS tiles record their first steps only: no last_step for them."""
    n = TRACE_MAX_STEPS + 3
    row, _ = _row(2, n)
    p = timeline.phases([[row]], n)[0]
    assert p["last_step"] == [] and len(p["step"]) == 2 * (TRACE_MAX_STEPS - 2)
    assert p["step"] == pytest.approx([2.0] * len(p["step"]))


def test_unreached_items_and_bad_input():
    row, _ = _row(1, 4)
    empty = [-1] * TRACE_SLOTS  # a warpgroup of a program that got no item
    ph = timeline.phases([[row], [empty]], 4, ghz=GHZ)
    assert len(ph[0]["startup"]) == 1
    with pytest.raises(ValueError, match="n_blocks"):
        timeline.phases([[row]], 1)
    with pytest.raises(ValueError, match="slots"):
        timeline.phases([[row[:-1]]], 4)
    with pytest.raises(ValueError, match="start and end"):
        timeline.clock_ghz([[empty]])


def _timeline_args(**kw):
    import argparse

    return argparse.Namespace(**{"shapes": "4x16x1024x64", "config": "auto", "reps": 3, **kw})


def test_timeline_tool_checks_its_options():
    """``flashcore bench timeline``: non-causal shapes of at least two key tiles, a config's sweep name, reps >= 1;
    a bad option is named before any GPU work."""
    from flashcore.bench import timeline_run
    from flashcore.bench.suites import Shape

    shapes, cfg = timeline_run.parse_args(_timeline_args(shapes="4x16x1024x64,1x16x129x128"))
    assert shapes == [Shape.dense(4, 16, 1024, 64), Shape.dense(1, 16, 129, 128)] and cfg is None
    _, cfg = timeline_run.parse_args(_timeline_args(config="gluon_ws_64x128s2"))
    assert (cfg.block_m, cfg.block_n, cfg.num_stages, cfg.kernel) == (64, 128, 2, "gluon_ws")
    for kw, message in ((dict(shapes="4x16x1024"), "--shapes: a shape is BxHxSxD"),
                        (dict(shapes="4x16x1024x64c"), "--shapes: .* non-causal"),
                        (dict(shapes="4x16x128x64"), "S > 128"), (dict(config="bogus"), "--config: cannot parse"),
                        (dict(reps=0), "--reps must be >= 1")):
        with pytest.raises(SystemExit, match=message):
            timeline_run.parse_args(_timeline_args(**kw))


def test_timeline_tool_table():
    from flashcore.bench import timeline_run

    phases = {p: float(i) for i, p in enumerate(timeline.PHASES)}
    row = {"shape": [4, 16, 1024, 64], "sdpa_us": 30.0, "plain_us": 29.5,
           "cold": {"phases_us": {0: {**phases, "span_max": 99.0}}}, "warm": {"phases_us": {0: phases}}}
    lines = timeline_run.table_lines([row])
    header = lines[2].split()
    assert header[:4] == ["shape", "state", "sdpa", "ours"] and header[-2:] == ["span", "span_max"]
    cold, warm = lines[3].split(), lines[4].split()
    assert cold[:4] == ["4x16x1024x64", "cold", "30.0", "29.5"] and float(cold[-1]) == 99.0
    assert float(cold[-2]) == phases["span"] and float(cold[4]) == phases["startup"]
    assert warm[1] == "warm" and warm[-1] == "nan"
