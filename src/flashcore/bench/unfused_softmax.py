"""Device side of the unfused baseline (``bench/unfused.py``): the row-wise softmax kernel over a
materialised score matrix, with the softmax scale and the bottom-right causal mask folded in."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _softmax_rows_kernel(S, P, n_cols, q_len, causal_offset, scale_log2e, stride_s, stride_p,
                         CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr):
    row = tl.program_id(0)
    # Rows are [..., q_len, n_cols] flattened, so the query position is the row index mod q_len.
    qpos = row % q_len
    if CAUSAL:
        n_visible = tl.minimum(tl.maximum(qpos + causal_offset + 1, 0), n_cols)
    else:
        n_visible = n_cols
    s_row = S + row.to(tl.int64) * stride_s
    p_row = P + row.to(tl.int64) * stride_p
    cols = tl.arange(0, BLOCK_N)
    if SINGLE_PASS:
        x = tl.load(s_row + cols, mask=cols < n_visible, other=float("-inf")).to(tl.float32) * scale_log2e
        m = tl.max(x, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)  # a row with no visible key: avoid -inf - -inf
        e = tl.where(cols < n_visible, tl.exp2(x - m_safe), 0.0)
        total = tl.sum(e, axis=0)
        inv = tl.where(total > 0.0, 1.0 / tl.where(total > 0.0, total, 1.0), 0.0)
        tl.store(p_row + cols, (e * inv).to(P.dtype.element_ty), mask=cols < n_cols)
    else:
        # Pass 1: per-lane running max and rescaled sum (online softmax), merged at the end.
        m_lane = tl.full([BLOCK_N], float("-inf"), tl.float32)
        l_lane = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            x = tl.load(s_row + c, mask=c < n_visible, other=float("-inf")).to(tl.float32) * scale_log2e
            m_new = tl.maximum(m_lane, x)
            m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.where(m_lane == float("-inf"), 0.0, tl.exp2(m_lane - m_new_safe))
            p = tl.where(x == float("-inf"), 0.0, tl.exp2(x - m_new_safe))
            l_lane = l_lane * alpha + p
            m_lane = m_new
        m = tl.max(m_lane, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        lane_scale = tl.where(m_lane == float("-inf"), 0.0, tl.exp2(m_lane - m_safe))
        total = tl.sum(l_lane * lane_scale, axis=0)
        inv = tl.where(total > 0.0, 1.0 / tl.where(total > 0.0, total, 1.0), 0.0)
        # Pass 2: normalise and write (masked columns get exact zeros).
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            x = tl.load(s_row + c, mask=c < n_visible, other=float("-inf")).to(tl.float32) * scale_log2e
            e = tl.where(c < n_visible, tl.exp2(x - m_safe), 0.0)
            tl.store(p_row + c, (e * inv).to(P.dtype.element_ty), mask=c < n_cols)
