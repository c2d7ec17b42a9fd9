"""Per-warpgroup timelines of the Hopper Gluon kernel, from its TRACE stamps (the ``trace`` switch of ``plan.knobs.GluonSwitches``).

A traced launch writes SM clock readings at fixed points of each consumer warpgroup's work items
(``kernels/sm90/trace.py``'s TRACE_* slot layout). This module turns one such buffer into phase durations, so that
"where does the time of a 10 us work item go" is a measurement, not a guess (perf-notes v15):

* ``startup``: consumer start to its first Q in shared memory;
* per item: ``q_to_s0`` (first K tile and S_0), ``first_step`` (S_0 to S_1: the first softmax, no P V to
  overlap), ``step`` (S_j to S_(j+1)), ``last_step`` (S_last to the last P V), ``o_math`` (normalise),
  ``o_store`` (shared-memory store and TMA store issue), ``o_wait`` (the rest of the epilogue),
  ``gap`` (item done to the next item's Q ready);
* ``span``: consumer start to its last item done.

Clocks are converted with the global timer read at the consumer's first and last stamps.
"""
from __future__ import annotations

import statistics

from ..kernels.sm90.trace import TRACE_ITEM0, TRACE_ITEM_SLOTS, TRACE_MAX_ITEMS, TRACE_MAX_STEPS, TRACE_SLOTS

PHASES = ("startup", "q_to_s0", "first_step", "step", "last_step", "o_math", "o_store", "o_wait", "gap", "span")


def _items(row, n_blocks: int) -> list[dict]:
    steps = min(n_blocks, TRACE_MAX_STEPS)
    out = []
    for i in range(TRACE_MAX_ITEMS):
        b = TRACE_ITEM0 + i * TRACE_ITEM_SLOTS
        if row[b] < 0 or row[b + 23] < 0:  # not reached (the buffer starts at -1)
            break
        out.append(dict(q=row[b], s=[row[b + 1]] + [row[b + 2 * j] for j in range(1, steps)],
                        o=row[b + 20], issued=row[b + 21], last_pv=row[b + 22], done=row[b + 23]))
    return out


def clock_ghz(trace) -> float:
    """SM clocks per ns over the consumers' spans (global timer at slots 2/3, clocks at 0/1)."""
    cyc = ns = 0
    for prog in trace:
        for row in prog:
            if min(row[0], row[1], row[2], row[3]) >= 0 and row[3] > row[2]:
                cyc += row[1] - row[0]
                ns += row[3] - row[2]
    if ns <= 0:
        raise ValueError("the trace has no consumer with both start and end stamps")
    return cyc / ns


def phases(trace, n_blocks: int, ghz: float | None = None) -> dict:
    """{warpgroup: {phase: [durations in us]}} over all programs of a trace ([programs][warpgroups][TRACE_SLOTS]
    nested lists or a tensor's ``tolist()``). ``n_blocks``: K/V tiles per item (non-causal: ceil(Sk / 128)).
    The last item-to-item step is measured only when the item has at most TRACE_MAX_STEPS tiles."""
    if n_blocks < 2:
        raise ValueError(f"n_blocks must be >= 2 (one tile has no steps), got {n_blocks}")
    trace = trace.tolist() if hasattr(trace, "tolist") else trace
    if any(len(row) != TRACE_SLOTS for prog in trace for row in prog):
        raise ValueError(f"each warpgroup's row must have {TRACE_SLOTS} slots")
    ghz = ghz or clock_ghz(trace)
    us = 1.0 / (ghz * 1e3)
    out = {}
    for w in range(len(trace[0])):
        ph = {k: [] for k in PHASES}
        for prog in trace:
            row = prog[w]
            its = _items(row, n_blocks)
            if not its:
                continue
            ph["startup"].append((its[0]["q"] - row[0]) * us)
            ph["span"].append((its[-1]["done"] - row[0]) * us)
            for a, it in enumerate(its):
                s = it["s"]
                ph["q_to_s0"].append((s[0] - it["q"]) * us)
                ph["first_step"].append((s[1] - s[0]) * us)
                ph["step"].extend((s[j + 1] - s[j]) * us for j in range(1, len(s) - 1))
                if n_blocks <= TRACE_MAX_STEPS:
                    ph["last_step"].append((it["last_pv"] - s[-1]) * us)
                ph["o_math"].append((it["o"] - it["last_pv"]) * us)
                ph["o_store"].append((it["issued"] - it["o"]) * us)
                ph["o_wait"].append((it["done"] - it["issued"]) * us)
                if a + 1 < len(its):
                    ph["gap"].append((its[a + 1]["q"] - it["done"]) * us)
        out[w] = ph
    return out


def summary(ph: dict) -> dict:
    """{warpgroup: {phase: median us}}, plus ``span_max``: the span of the last program to finish."""
    out = {}
    for w, d in ph.items():
        row = {k: statistics.median(v) for k, v in d.items() if v}
        if d["span"]:
            row["span_max"] = max(d["span"])
        out[w] = row
    return out
