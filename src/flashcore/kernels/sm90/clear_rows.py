"""Clearing the key rows past a length in a shared-memory K/V tile, for the sm_90 forward kernel (device code).

Rows of a cache tile past a sequence's key length are cache memory that may hold anything (never written, stale,
NaN); their probabilities are 0, but 0 * NaN = NaN in P V. The fast path clears the last tile of an item in its
consumer warpgroups (``fwd._clear_rows_past_length``); the secure path clears every V tile in its loader
warpgroup (``pipeline._sanitise_v``), since which tiles hold such rows is secret there. Either way each chunk of
rows is read whole and written whole, whatever the length: a select, so neither the addresses nor the work
follow the length."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _zero_rows_past(tile, valid_rows, ROWS: gl.constexpr, FIRST: gl.constexpr, STEP: gl.constexpr,
                    BLOCK_N: gl.constexpr):
    """Zero the rows at or past ``valid_rows`` of ``tile`` ([BLOCK_N, D] in shared memory): the ROWS-row chunks
    FIRST, FIRST + STEP, ... (the calling warps' share), each loaded, selected and stored by all calling warps."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    for c in gl.static_range(FIRST, BLOCK_N // ROWS, STEP):
        part = tile.slice(c * ROWS, ROWS, dim=0)
        x = part.load(layout)
        rows = c * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        part.store(gl.where(gl.expand_dims(rows < valid_rows, 1), x, gl.zeros_like(x)))
