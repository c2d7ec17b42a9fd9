"""The combine step of split-KV attention (flash-decoding): merge each row's partial outputs by their
logsumexps, ``out = sum_s exp(lse_s - lse) * o_s`` with ``lse = logsumexp_s lse_s``.

Rows are the split kernel's packed query rows (token ``r // GROUP`` of head ``hkv * GROUP + r % GROUP``).
A split that saw no key has ``lse_s = -inf`` and weight 0; a row that saw none at all gets output 0 and lse
``-inf``. Every split is read, by selects only, so the step is as constant-time as its inputs' shapes."""
from __future__ import annotations

import triton
import triton.language as tl

from ..capabilities import Capabilities


@triton.jit
def decode_combine_kernel(
    PART_O, PART_LSE, O, LSE, CU_Q,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh, stride_ls,
    seqlen_q, total_q, num_heads_kv, num_splits, part_rows,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    PACKED: tl.constexpr, RETURN_LSE: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_kv
    hkv = pid_bh % num_heads_kv
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    tok = offs_r // GROUP
    head = hkv * GROUP + offs_r % GROUP
    if PACKED:
        # clamped into q (and max_seqlen_q), so unchecked offsets (CUDA-graph replays) never address past it
        q0 = tl.minimum(tl.maximum(tl.load(CU_Q + b), 0), total_q)
        n_q = tl.minimum(tl.maximum(tl.load(CU_Q + b + 1) - q0, 0), tl.minimum(seqlen_q, total_q - q0))
        tok_abs = (q0 + tok).to(tl.int64)
        o_base = O + tok_abs[:, None] * stride_os
    else:
        n_q = seqlen_q
        tok_abs = tok.to(tl.int64)
        o_base = O + b.to(tl.int64) * stride_ob + tok_abs[:, None] * stride_os
    row_ok = (tok < n_q) & (offs_r < part_rows)
    split_stride = tl.num_programs(1).to(tl.int64) * part_rows
    rows = pid_bh.to(tl.int64) * part_rows + offs_r
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    for s in range(num_splits):
        m = tl.maximum(m, tl.load(PART_LSE + s * split_stride + rows, mask=row_ok, other=float("-inf")))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    denom = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for s in range(num_splits):
        lse_s = tl.load(PART_LSE + s * split_stride + rows, mask=row_ok, other=float("-inf"))
        w = tl.exp(lse_s - m_safe)
        o_s = tl.load(PART_O + (s * split_stride + rows)[:, None] * BLOCK_D + offs_d[None, :],
                      mask=row_ok[:, None], other=0.0)
        denom += w
        acc += w[:, None] * o_s
    seen = denom > 0.0
    d_safe = tl.where(seen, denom, 1.0)
    o = tl.where(seen[:, None], acc / d_safe[:, None], 0.0)
    tl.store(o_base + head[:, None] * stride_oh + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    if RETURN_LSE:
        lse = tl.where(seen, m_safe + tl.log(d_safe), float("-inf"))
        tl.store(LSE + b.to(tl.int64) * stride_lb + head * stride_lh + tok_abs * stride_ls, lse, mask=row_ok)


CAPABILITIES = Capabilities(
    name="triton_decode_combine", module=__name__, role="split-KV combine: every CUDA GPU and the CPU interpreter",
    dtypes=("fp16", "bf16", "fp32"), head_dims=tuple(range(8, 257, 8)), archs=None,
    features=("split_kv", "lse", "secure"), secret=("PART_O", "PART_LSE"))
