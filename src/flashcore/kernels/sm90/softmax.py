"""Online softmax of one score tile for the sm_90 forward kernel (device code)."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _softmax_step(s, m_i, l_i, col0, row, seqlen_k, diag, qk_scale, MASK: gl.constexpr, CAUSAL: gl.constexpr,
                  ROW_SUM: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Online softmax of one score tile: returns (p, alpha, m_new, l_new); scores are raw QK^T.
    MASK: keys at or past ``seqlen_k`` are masked, and with CAUSAL also keys right of the diagonal
    (selects on the raw scores: a NaN in a masked key's score cannot reach the output). Without
    ROW_SUM the caller sums the probabilities itself (by MMA) and ``l_new`` is ``l_i``.

    The caller keeps masked and unmasked tiles in two branches of different code: that branch is what
    stops ptxas from hoisting the wait for the previous P@V above this softmax (perf-notes v10)."""
    if MASK:
        col = col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        ok = gl.expand_dims(col < seqlen_k, 0)
        if CAUSAL:
            ok = ok & (gl.expand_dims(col, 0) <= gl.expand_dims(row + diag, 1))
        s = gl.where(ok, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    if MASK:
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet
    else:
        m_use = m_new
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_use, 1))
    if ROW_SUM:
        l_new = l_i * alpha + gl.sum(p, axis=1)
    else:
        l_new = l_i
    return p, alpha, m_new, l_new
