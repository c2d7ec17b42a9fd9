"""Secure-mode pre-pass: a copy of V whose rows at or past the secret true length are zero.

Why a separate pass: padding may hold NaN/Inf, and inside the P·V MMA 0 * NaN = NaN, so V's
padding must be zeroed before the MMA reads it. Doing that select inside the attention loop
forces every V tile from shared memory through registers and back (an extra round trip and a
barrier per key block, ~25% of the secure kernel's time at D=128). Done once here it costs one
streaming read and write of V, and GQA shares it across the query heads of a group.

Constant time: every program reads and writes its whole (publicly bounded) tile; the true
length only enters a select.

The padding is filled with a public pseudo-random pattern (a hash of the position), not zeros: the
tensor cores take less time on zero operands (docs/security.md §5.4), so zeros in V would make the
P·V product's time follow the secret length. The masked probabilities are exactly 0 and the pattern
is finite, so each padded row contributes exactly 0 and the output is bit-identical to zero filling.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _position_noise(rows, cols, salt):
    """Finite values in [-2, 2) from a hash of (salt, row, col): public, data-independent."""
    h = (rows[:, None].to(tl.uint32) * 0x9E3779B1) ^ (cols[None, :].to(tl.uint32) * 0x85EBCA77) ^ (
        salt.to(tl.uint32) * 0xC2B2AE3D)
    h = (h ^ (h >> 15)) * 0x2C1B3C6D
    h = h ^ (h >> 12)
    return ((h >> 8) & 0xFFFF).to(tl.float32) * (4.0 / 65536.0) - 2.0


@triton.jit
def attn_secure_zero_v_padding_kernel(
    V, VS, SEQLENS_K,
    stride_vb, stride_vh, stride_vs,
    seqlen_k, num_heads_kv,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_kv
    h = pid_bh % num_heads_kv
    len_k = tl.minimum(tl.maximum(tl.load(SEQLENS_K + b), 0), seqlen_k)
    rows = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    in_bounds = (rows[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)  # public shape only
    src = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh + rows[:, None] * stride_vs + offs_d[None, :]
    x = tl.load(src, mask=in_bounds, other=0.0)
    x = tl.where(rows[:, None] < len_k, x, _position_noise(rows, offs_d, pid_bh).to(x.dtype))
    # VS is contiguous [B, Hkv, S, HEAD_DIM]
    dst = VS + (pid_bh.to(tl.int64) * seqlen_k + rows[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(dst, x, mask=in_bounds)
