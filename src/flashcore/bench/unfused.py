"""The unfused baseline: cuBLAS q·kᵀ, a row-wise Triton softmax, cuBLAS P·v (three kernels).

It materialises the full score matrix in HBM, which is exactly the traffic a fused kernel
avoids, so it shows what fusion buys. The softmax kernel folds in the softmax scale and the
causal mask (bottom-right aligned, like :func:`flashcore.attention`), so the baseline stays at
three kernels. Rows that see no key come out as zeros (flashcore's convention).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

LABEL = "unfused (cuBLAS+Triton softmax)"
SINGLE_PASS_MAX = 8192  # a whole row in registers up to this width; longer rows take two passes
_LOG2E = 1.4426950408889634


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


def _block_and_warps(n_cols: int, block_n: Optional[int]):
    if block_n is None:
        block_n = triton.next_power_of_2(min(n_cols, SINGLE_PASS_MAX))
    block_n = max(16, int(block_n))
    if block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two, got {block_n}")
    num_warps = 4 if block_n <= 1024 else (8 if block_n <= 4096 else 16)
    return block_n, num_warps


def softmax_rows(scores: torch.Tensor, *, q_len: int, causal: bool = False, causal_offset: int = 0,
                 scale: float = 1.0, out: Optional[torch.Tensor] = None, block_n: Optional[int] = None) -> torch.Tensor:
    """Row-wise softmax(scale · scores) over the last dimension.

    ``scores`` is ``[..., rows, n_cols]`` with contiguous rows; the query position of a row is its
    flat row index mod ``q_len``. With ``causal``, row position i keeps columns
    ``j <= i + causal_offset`` (``causal_offset = Sk - Sq`` for bottom-right alignment).
    ``block_n`` forces the column tile (tests use it to exercise the two-pass path).
    """
    if scores.stride(-1) != 1:
        raise ValueError("scores must have a unit stride in the last dimension")
    n_cols = scores.shape[-1]
    s2 = scores.reshape(-1, n_cols)  # a view for contiguous scores
    n_rows = s2.shape[0]
    if n_rows % q_len != 0:
        raise ValueError(f"the number of rows ({n_rows}) must be a multiple of q_len ({q_len})")
    if out is None:
        out = torch.empty_like(scores)
    p2 = out.view(-1, n_cols)
    block, num_warps = _block_and_warps(n_cols, block_n)
    if n_rows == 0:
        return out
    _softmax_rows_kernel[(n_rows,)](
        s2, p2, n_cols, q_len, int(causal_offset), float(scale) * _LOG2E, s2.stride(0), p2.stride(0),
        CAUSAL=bool(causal), BLOCK_N=block, SINGLE_PASS=block >= n_cols, num_warps=num_warps,
    )
    return out


def unfused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                      scale: Optional[float] = None, block_n: Optional[int] = None) -> torch.Tensor:
    """q ``[B, Hq, Sq, D]``, k/v ``[B, Hkv, Sk, D]`` (contiguous) → out ``[B, Hq, Sq, D]``.

    GQA without copying k/v: the ``Hq/Hkv`` query heads that share a k/v head are stacked along
    the row axis (a view of contiguous q), so one batched matmul per k/v head serves them all.
    """
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    q_rows = q.reshape(B, Hkv, group * Sq, D)
    scores = torch.matmul(q_rows, k.transpose(-1, -2))
    probs = softmax_rows(scores, q_len=Sq, causal=causal, causal_offset=Sk - Sq, scale=scale, out=scores,
                         block_n=block_n)
    return torch.matmul(probs, v).view(B, Hq, Sq, D)
