"""The combine step of split-KV attention (flash-decoding): merge each row's partial outputs by their
logsumexps, ``out = sum_s exp(lse_s - lse) * o_s`` with ``lse = logsumexp_s lse_s``.

Rows are the split kernel's packed query rows (token ``r // GROUP`` of head ``hkv * GROUP + r % GROUP``).
A split that saw no key has ``lse_s = -inf`` and weight 0; a row that saw none at all gets output 0 and lse
``-inf``. Every split is read, by selects only, so the step is as constant-time as its inputs' shapes.

One program merges one row, on one warp: a chunk of ``BLOCK_S`` splits is read as one ``[BLOCK_S, BLOCK_D]``
tile, all of its loads issued at once, and the sums over the split axis stay inside each thread (the warp's
lanes run along D). The form before it merged 16 rows per 4-warp program one split at a time, each split's
loads waiting for the last: a chain of round trips (6.2 us of a 4k decode call with 16 splits; perf-notes v27).
More splits than one chunk holds (``BLOCK_S * BLOCK_D`` is capped so the tile stays in registers) are merged
chunk by chunk, each rescaled to the running maximum."""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from ..capabilities import Capabilities


@triton.jit
def _merge_chunk(PART_O, PART_LSE, s0, num_splits, split_stride, row, row_ok,
                 BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, COUNT_MASKS: tl.constexpr):
    """(max lse, sum of weights, weighted sum of outputs) of splits ``[s0, s0 + BLOCK_S)`` of one row, the
    weights taken against the chunk's own maximum (0 where it is -inf: no split of the chunk saw a key)."""
    offs_s = s0 + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    if COUNT_MASKS:
        ok = offs_s < tl.where(row_ok, num_splits, 0)
    else:
        ok = (offs_s < num_splits) & row_ok
    srow = offs_s.to(tl.int64) * split_stride + row
    lse = tl.load(PART_LSE + srow, mask=ok, other=float("-inf"))
    o = tl.load(PART_O + srow[:, None] * BLOCK_D + offs_d[None, :], mask=ok[:, None], other=0.0)
    m = tl.max(lse, axis=0)
    w = tl.exp(lse - tl.where(m == float("-inf"), 0.0, m))
    return m, tl.sum(w, axis=0), tl.sum(w[:, None] * o, axis=0)


@triton.jit
def decode_combine_kernel(
    PART_O, PART_LSE, O, LSE, CU_Q,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh, stride_ls,
    seqlen_q, total_q, num_heads_kv, num_splits, part_rows,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    PACKED: tl.constexpr, RETURN_LSE: tl.constexpr, PDL: tl.constexpr, COUNT_MASKS: tl.constexpr,
):
    """COUNT_MASKS (the CPU interpreter only): masks as comparisons against counts. Triton 3.9's interpreter makes a
    vector mask combined with a boolean scalar an int32 mask, which its loads and stores refuse; compiled, the
    boolean form is kept (the machine code the GPU runs and the SASS gate audited)."""
    r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_kv
    hkv = pid_bh % num_heads_kv
    tok = r // GROUP
    head = hkv * GROUP + r % GROUP
    if PDL:
        # launched as a programmatic dependent of the split step: everything above overlapped its tail; the
        # partials (and cu_seqlens_q, which an append step may precede) are read only after it completed
        gdc_wait()
    if PACKED:
        # clamped into q (and max_seqlen_q), so unchecked offsets (CUDA-graph replays) never address past it
        q0 = tl.minimum(tl.maximum(tl.load(CU_Q + b), 0), total_q)
        n_q = tl.minimum(tl.maximum(tl.load(CU_Q + b + 1) - q0, 0), tl.minimum(seqlen_q, total_q - q0))
        tok_abs = (q0 + tok).to(tl.int64)
        o_base = O + tok_abs * stride_os
    else:
        n_q = seqlen_q
        tok_abs = tok.to(tl.int64)
        o_base = O + b.to(tl.int64) * stride_ob + tok_abs * stride_os
    row_ok = (tok < n_q) & (r < part_rows)
    split_stride = tl.num_programs(1).to(tl.int64) * part_rows
    row = pid_bh.to(tl.int64) * part_rows + r
    m, denom, acc = _merge_chunk(PART_O, PART_LSE, 0, num_splits, split_stride, row, row_ok, BLOCK_S, BLOCK_D,
                                 COUNT_MASKS)
    for s0 in range(BLOCK_S, num_splits, BLOCK_S):
        m_c, denom_c, acc_c = _merge_chunk(PART_O, PART_LSE, s0, num_splits, split_stride, row, row_ok, BLOCK_S,
                                           BLOCK_D, COUNT_MASKS)
        m_new = tl.maximum(m, m_c)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp(m - m_ref)  # 0 where a side saw no key (-inf - finite, or -inf - 0)
        a_c = tl.exp(m_c - m_ref)
        denom = denom * a + denom_c * a_c
        acc = acc * a + acc_c * a_c
        m = m_new
    seen = denom > 0.0
    d_safe = tl.where(seen, denom, 1.0)
    offs_d = tl.arange(0, BLOCK_D)
    o = tl.where(seen, acc / d_safe, 0.0)
    if COUNT_MASKS:
        d_ok = offs_d < tl.where(row_ok, HEAD_DIM, 0)
    else:
        d_ok = row_ok & (offs_d < HEAD_DIM)
    tl.store(o_base + head * stride_oh + offs_d, o.to(O.dtype.element_ty), mask=d_ok)
    if RETURN_LSE:
        lse = tl.where(seen, tl.where(m == float("-inf"), 0.0, m) + tl.log(d_safe), float("-inf"))
        tl.store(LSE + b.to(tl.int64) * stride_lb + head * stride_lh + tok_abs * stride_ls, lse, mask=row_ok)


CAPABILITIES = Capabilities(
    name="triton_decode_combine", module=__name__, role="split-KV combine: every CUDA GPU and the CPU interpreter",
    dtypes=("fp16", "bf16", "fp32"), head_dims=tuple(range(8, 257, 8)), archs=None,
    features=("split_kv", "lse", "secure"), secret=("PART_O", "PART_LSE"))
