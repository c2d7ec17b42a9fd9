"""Work scheduling of the persistent sm_90 forward kernel: which query-row tile, head and key-tile range a
program's n-th work item covers. Device code only; every quantity here is a function of public shapes."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _kv_blocks(pid_m, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
               NUM_WG: gl.constexpr):
    """K/V tiles the item's NUM_WG*BLOCK_M query rows visit (at least 1: an all-masked tile yields zeros)."""
    if CAUSAL:
        # bottom-right alignment: row i sees keys j <= i + Sk - Sq
        hi = gl.minimum((pid_m + 1) * NUM_WG * BLOCK_M + seqlen_k - seqlen_q, seqlen_k)
    else:
        hi = seqlen_k
    return gl.maximum(gl.cdiv(hi, BLOCK_N), 1)


@gluon.jit
def _row_tile(r, HALF: gl.constexpr, num_m_tiles, CAUSAL: gl.constexpr, PAIRED: gl.constexpr):
    """(row-tile index, valid) of work item ``HALF`` of the ``r``-th scheduling unit of a head."""
    if PAIRED:
        heavy = num_m_tiles - 1 - r
        if HALF == 0:
            return heavy, True
        return r, r != heavy
    if CAUSAL:
        return num_m_tiles - 1 - r, True
    return r, True


@gluon.jit
def _units_per_head(num_m_tiles, PAIRED: gl.constexpr):
    if PAIRED:
        return (num_m_tiles + 1) // 2
    return num_m_tiles


@gluon.jit
def _tile_coords(unit, HALF: gl.constexpr, num_m_tiles, CAUSAL: gl.constexpr, PAIRED: gl.constexpr):
    """(row-tile index, batch*head, valid) of work item ``HALF`` of scheduling unit ``unit``.
    Consecutive units share a head (K/V stay in L2). Causal row tiles run last-first, so the heaviest
    (the most keys) go first; PAIRED (persistent causal) units are two row tiles of a head, the i-th
    heaviest with the i-th lightest, so every unit costs the same number of key tiles (+-1) and a
    static round-robin over units stays balanced. An odd tile count leaves the middle tile unpaired."""
    per_head = _units_per_head(num_m_tiles, PAIRED)
    pid_m, valid = _row_tile(unit % per_head, HALF, num_m_tiles, CAUSAL, PAIRED)
    return pid_m, unit // per_head, valid


@gluon.jit
def _head_coords(bh, num_heads, group):
    """(batch, query head, K/V head) of a flat batch*head index."""
    b = bh // num_heads
    h = bh % num_heads
    return b, h, h // group
