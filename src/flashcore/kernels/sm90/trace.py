"""Debug timeline of the sm_90 forward kernel (device side): with ``TRACE`` each consumer warpgroup writes
clock readings at fixed points into its own row of ``TRACE_SLOTS`` int64. Off (the default), no code is
emitted. The host side reads the buffer with ``flashcore.bench.timeline``."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


# Debug timeline (the ``trace`` switch of ``plan.knobs.GluonSwitches``; perf-notes v15): with TRACE each consumer
# warpgroup writes SM clock readings at fixed points into its own row of TRACE_SLOTS int64, in place of the
# secure-only lengths pointer. Row (program * NUM_WG + warpgroup): slot 0/1 the consumer's first/last clock,
# 2/3 the global timer (ns) at the same points (to convert clocks), 4 the loader's first clock, 5 the clock
# when the first Q load was issued, 6/7 the global timer and the clock at kernel entry (4-7: in the row of
# warpgroup 0); from TRACE_ITEM0 on, TRACE_ITEM_SLOTS per work item (up to TRACE_MAX_ITEMS items):
# +0 Q ready, +1 S_0 ready, +2j S_j ready and +2j+1 P_(j-1) V_(j-1) done (1 <= j < TRACE_MAX_STEPS),
# +20 O ready, +21 O store issued, +22 last P V done, +23 item done. Off (the default), no code is emitted.
TRACE_SLOTS = 256
TRACE_ITEM0 = 8
TRACE_ITEM_SLOTS = 24
TRACE_MAX_STEPS = 10
TRACE_MAX_ITEMS = (TRACE_SLOTS - TRACE_ITEM0) // TRACE_ITEM_SLOTS
_TRACE_SLOTS = gl.constexpr(TRACE_SLOTS)
_TRACE_ITEM0 = gl.constexpr(TRACE_ITEM0)
_TRACE_ITEM_SLOTS = gl.constexpr(TRACE_ITEM_SLOTS)
_TRACE_MAX_STEPS = gl.constexpr(TRACE_MAX_STEPS)


@gluon.jit
def _stamp(trace_ptr, slot, TRACE: gl.constexpr, WG: gl.constexpr, NUM_WG: gl.constexpr, GLOBAL: gl.constexpr = False):
    if TRACE:
        if GLOBAL:
            t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], gl.int64, False, 1)
        else:
            t = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], gl.int64, False, 1)
        gl.store(trace_ptr + (gl.program_id(0) * NUM_WG + WG) * _TRACE_SLOTS + slot, t, mask=slot < _TRACE_SLOTS)


@gluon.jit
def _stamp_step(trace_ptr, tb, j, odd, TRACE: gl.constexpr, WG: gl.constexpr, NUM_WG: gl.constexpr):
    if TRACE:
        if j < _TRACE_MAX_STEPS:
            _stamp(trace_ptr, tb + 2 * j + odd, TRACE, WG, NUM_WG)
