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

from .unfused_softmax import _softmax_rows_kernel

LABEL = "unfused (cuBLAS+Triton softmax)"
SINGLE_PASS_MAX = 8192  # a whole row in registers up to this width; longer rows take two passes
_LOG2E = 1.4426950408889634


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
