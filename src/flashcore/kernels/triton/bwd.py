"""Attention backward (FlashAttention-2 style) in Triton: three kernels, one idea each.

* :func:`attn_bwd_preprocess_kernel`: per query row, ``delta = rowsum(dO * O) - dLSE`` and the forward's
  logsumexp in base 2 (``lse2``; a row that saw no key gets ``+inf``, so every probability recomputed from it
  is exactly 0, never ``exp2(-inf + inf) = NaN``).
* :func:`attn_bwd_dkdv_kernel`: one program per (key tile, sequence, k/v head). It holds its K and V tiles
  and walks the query tiles that can see them, for every query head of its GQA group, accumulating dK and
  dV in registers: each dK/dV element has one owner, so they are deterministic and need no reduction
  across heads. With ``ATOMIC_DQ`` it also adds each step's dQ contribution into an fp32 buffer with
  atomics (one kernel, five products per tile, but the order of the additions varies from run to run).
* :func:`attn_bwd_dq_kernel`: one program per (query tile, sequence, query head), walking the key tiles;
  the deterministic dQ (it recomputes QK^T and dO V^T: seven products per tile in all instead of five).

Math (scores in base 2, as the forward): ``p = exp2(qk * scale * log2e - lse2)``, ``dv = p^T dO``,
``dp = dO V^T``, ``ds = p * (dp - delta)``, ``dk = scale * ds^T q``, ``dq = scale * ds k``. The dK/dV kernel
works on the transposed tile (keys as rows: ``qk^T = k q^T``) so that both of its products take the tile
as their left operand without a register transpose. ``delta`` carries ``-dLSE``: the gradient of the
returned logsumexp with respect to a score is the probability itself, so it folds into the same term.

Causal masks are bottom-right (query ``i`` sees key ``j`` iff ``j <= i + Sk - Sq``); tiles that straddle
the diagonal or the end of the keys run a masked step, the others an unmasked one (``constexpr`` stages; with
``EVEN_N``, whole key tiles and no causal mask, the masked loop of the dK/dV kernel is not compiled at all).
Rows past the end of the queries load q = dO = 0 and lse2 = +inf: their probabilities are 0.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..capabilities import Capabilities


@triton.jit
def _rows(ptrs, rows, bound, offs_d, HEAD_DIM: tl.constexpr, EVEN_D: tl.constexpr):
    """A [rows, BLOCK_D] tile, zero outside ``rows < bound`` and ``d < HEAD_DIM``."""
    if EVEN_D:
        return tl.load(ptrs, mask=rows[:, None] < bound, other=0.0)
    return tl.load(ptrs, mask=(rows[:, None] < bound) & (offs_d[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def _sequence(b, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q, seqlen_k, VARLEN: tl.constexpr):
    """(first query row, first key row, query length, key length) of batch entry ``b``. A packed (varlen) sequence
    starts at its cumulative offsets, and the launcher gives packed tensors a batch stride of 0; a dense batch entry
    starts at row 0 of its own slice, which its batch stride places. So every base address below is
    ``b * stride_b + start * stride_s + h * stride_h`` in both modes."""
    if VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + b)
        k_start = tl.load(CU_SEQLENS_K + b)
        seqlen_q = tl.load(CU_SEQLENS_Q + b + 1) - q_start
        seqlen_k = tl.load(CU_SEQLENS_K + b + 1) - k_start
        q_start = q_start.to(tl.int64)
        k_start = k_start.to(tl.int64)
    else:
        q_start = tl.full([], 0, tl.int64)
        k_start = tl.full([], 0, tl.int64)
    return q_start, k_start, seqlen_q, seqlen_k


@triton.jit
def attn_bwd_preprocess_kernel(
    O, DO, LSE, DLSE, DELTA, LSE2, CU_SEQLENS_Q,
    stride_ob, stride_oh, stride_os,
    stride_db, stride_dh, stride_ds,
    stride_lb, stride_lh,
    stride_wb, stride_wh,
    seqlen_q, num_heads_q, store_len,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr,
    HAS_DLSE: tl.constexpr,
):
    """``DELTA``/``LSE2`` have their own strides (``stride_w*``) and, dense, rows up to ``store_len`` >= seqlen_q:
    the Hopper dK/dV kernel copies them in whole 64-row tiles, so the rows past the end get delta 0 and lse2
    +inf (as a query past the end reads them anyway)."""
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_q
    h = pid_bh % num_heads_q
    q_start, _, seqlen_q, _ = _sequence(b, CU_SEQLENS_Q, CU_SEQLENS_Q, seqlen_q, seqlen_q, VARLEN)
    if VARLEN:
        if pid_m * BLOCK_M >= seqlen_q:
            return
    bb, hh = b.to(tl.int64), h.to(tl.int64)
    o_base = bb * stride_ob + q_start * stride_os + hh * stride_oh
    do_base = bb * stride_db + q_start * stride_ds + hh * stride_dh
    l_base = bb * stride_lb + q_start + hh * stride_lh
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _rows(O + o_base + offs_m[:, None] * stride_os + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, EVEN_D)
    do = _rows(DO + do_base + offs_m[:, None] * stride_ds + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM,
               EVEN_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    in_rows = offs_m < seqlen_q
    lse = tl.load(LSE + l_base + offs_m, mask=in_rows, other=float("-inf"))
    seen = lse != float("-inf")
    if HAS_DLSE:
        dlse = tl.load(DLSE + l_base + offs_m, mask=in_rows, other=0.0)
        delta = delta - tl.where(seen, dlse, 0.0)
    w_base = bb * stride_wb + q_start + hh * stride_wh
    if VARLEN:
        out_rows = in_rows
    else:
        out_rows = offs_m < store_len
    tl.store(DELTA + w_base + offs_m, delta, mask=out_rows)
    tl.store(LSE2 + w_base + offs_m, tl.where(seen, lse * 1.4426950408889634, float("inf")), mask=out_rows)


@triton.jit
def _dkdv_step(dk, dv, k, v, Q, DO, DQ, LSE2, DELTA, q_base, do_base, dq_base, l_base, start_m, offs_n, offs_d,
               seqlen_q, seqlen_k, diag, qk_scale, sm_scale, stride_qs, stride_ds, stride_dqs,
               BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, EVEN_D: tl.constexpr, MASK: tl.constexpr,
               CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, PRECISION: tl.constexpr):
    """One query tile against the program's key tile (keys as rows)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _rows(Q + q_base + offs_m[:, None] * stride_qs + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, EVEN_D)
    do = _rows(DO + do_base + offs_m[:, None] * stride_ds + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM,
               EVEN_D)
    lse2 = tl.load(LSE2 + l_base + offs_m, mask=offs_m < seqlen_q, other=float("inf"))
    delta = tl.load(DELTA + l_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
    qk_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # [BLOCK_N, BLOCK_M]
    if MASK:
        valid = offs_n[:, None] < seqlen_k
        if CAUSAL:
            valid = valid & (offs_n[:, None] <= offs_m[None, :] + diag)
        qk_t = tl.where(valid, qk_t, float("-inf"))
    p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
    dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
    dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
    ds_t = p_t * (dp_t - delta[None, :])
    ds_t_in = ds_t.to(q.dtype)
    dk = tl.dot(ds_t_in, q, dk, input_precision=PRECISION)
    if ATOMIC_DQ:
        dq = tl.dot(tl.trans(ds_t_in), k, input_precision=PRECISION) * sm_scale
        tl.atomic_add(DQ + dq_base + offs_m[:, None] * stride_dqs + offs_d[None, :], dq,
                      mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM), sem="relaxed")
    return dk, dv


@triton.jit
def attn_bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, DQ, LSE2, DELTA, CU_SEQLENS_Q, CU_SEQLENS_K,
    qk_scale, sm_scale,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_db, stride_dh, stride_ds,
    stride_dkb, stride_dkh, stride_dks,
    stride_dvb, stride_dvh, stride_dvs,
    stride_dqb, stride_dqh, stride_dqs,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, num_heads_kv, gqa_group,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, ATOMIC_DQ: tl.constexpr, PRECISION: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_kv
    h_kv = pid_bh % num_heads_kv
    start_n = pid_n * BLOCK_N
    q_start, k_start, seqlen_q, seqlen_k = _sequence(b, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q, seqlen_k, VARLEN)
    if VARLEN:
        if start_n >= seqlen_k:
            return
    bb, hk = b.to(tl.int64), h_kv.to(tl.int64)
    q_seq = bb * stride_qb + q_start * stride_qs
    do_seq = bb * stride_db + q_start * stride_ds
    dq_seq = bb * stride_dqb + q_start * stride_dqs
    l_seq = bb * stride_lb + q_start
    k_base = bb * stride_kb + k_start * stride_ks + hk * stride_kh
    v_base = bb * stride_vb + k_start * stride_vs + hk * stride_vh
    dk_base = bb * stride_dkb + k_start * stride_dks + hk * stride_dkh
    dv_base = bb * stride_dvb + k_start * stride_dvs + hk * stride_dvh

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = _rows(K + k_base + offs_n[:, None] * stride_ks + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM, EVEN_D)
    v = _rows(V + v_base + offs_n[:, None] * stride_vs + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM, EVEN_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    diag = seqlen_k - seqlen_q
    q_end = tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M
    if CAUSAL:
        # the first query row that sees key start_n is start_n - diag; from the first row that sees the tile's
        # last key on, every row sees every key of the tile (no causal mask)
        lo = tl.minimum(tl.maximum(start_n - diag, 0) // BLOCK_M * BLOCK_M, q_end)
        full = tl.minimum(tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - diag, 0), BLOCK_M) * BLOCK_M, q_end)
    else:
        lo = 0
        full = 0
    if not EVEN_N:
        if start_n + BLOCK_N > seqlen_k:  # the tile runs past the keys: every step masks them
            full = q_end
    for g in range(0, gqa_group):
        h = h_kv * gqa_group + g
        q_base = q_seq + h.to(tl.int64) * stride_qh
        do_base = do_seq + h.to(tl.int64) * stride_dh
        dq_base = dq_seq + h.to(tl.int64) * stride_dqh
        l_base = l_seq + h.to(tl.int64) * stride_lh
        if CAUSAL or not EVEN_N:  # compiled only where a step can need a mask (v19.2: +17% at D=64 without it)
            for start_m in range(lo, full, BLOCK_M):
                dk, dv = _dkdv_step(dk, dv, k, v, Q, DO, DQ, LSE2, DELTA, q_base, do_base, dq_base, l_base, start_m,
                                    offs_n, offs_d, seqlen_q, seqlen_k, diag, qk_scale, sm_scale, stride_qs,
                                    stride_ds, stride_dqs, BLOCK_M, HEAD_DIM, EVEN_D, True, CAUSAL, ATOMIC_DQ,
                                    PRECISION)
        for start_m in range(full, q_end, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, Q, DO, DQ, LSE2, DELTA, q_base, do_base, dq_base, l_base, start_m,
                                offs_n, offs_d, seqlen_q, seqlen_k, diag, qk_scale, sm_scale, stride_qs, stride_ds,
                                stride_dqs, BLOCK_M, HEAD_DIM, EVEN_D, False, CAUSAL, ATOMIC_DQ, PRECISION)
    dk = dk * sm_scale
    if EVEN_D:
        st_mask = offs_n[:, None] < seqlen_k
    else:
        st_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    tl.store(DK + dk_base + offs_n[:, None] * stride_dks + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=st_mask)
    tl.store(DV + dv_base + offs_n[:, None] * stride_dvs + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=st_mask)


@triton.jit
def _dq_step(dq, q, do, lse2, delta, K, V, k_base, v_base, start_n, offs_m, offs_d, seqlen_k, diag, qk_scale,
             stride_ks, stride_vs, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, EVEN_D: tl.constexpr,
             MASK: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """One key tile against the program's query tile."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _rows(K + k_base + offs_n[:, None] * stride_ks + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM, EVEN_D)
    v = _rows(V + v_base + offs_n[:, None] * stride_vs + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM, EVEN_D)
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if MASK:
        valid = offs_n[None, :] < seqlen_k
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None] + diag)
        qk = tl.where(valid, qk, float("-inf"))
    p = tl.math.exp2(qk * qk_scale - lse2[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    ds = p * (dp - delta[:, None])
    return tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)


@triton.jit
def attn_bwd_dq_kernel(
    Q, K, V, DO, DQ, LSE2, DELTA, CU_SEQLENS_Q, CU_SEQLENS_K,
    qk_scale, sm_scale,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_db, stride_dh, stride_ds,
    stride_dqb, stride_dqh, stride_dqs,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, num_heads_q, gqa_group,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, PRECISION: tl.constexpr,
):
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_q
    h = pid_bh % num_heads_q
    h_kv = h // gqa_group
    if CAUSAL:  # the tiles near the end see the most keys: schedule them first
        start_m = (tl.num_programs(0) - 1 - pid_m) * BLOCK_M
    else:
        start_m = pid_m * BLOCK_M
    q_start, k_start, seqlen_q, seqlen_k = _sequence(b, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q, seqlen_k, VARLEN)
    if VARLEN:
        if start_m >= seqlen_q:
            return
    bb, hh, hk = b.to(tl.int64), h.to(tl.int64), h_kv.to(tl.int64)
    q_base = bb * stride_qb + q_start * stride_qs + hh * stride_qh
    do_base = bb * stride_db + q_start * stride_ds + hh * stride_dh
    dq_base = bb * stride_dqb + q_start * stride_dqs + hh * stride_dqh
    l_base = bb * stride_lb + q_start + hh * stride_lh
    k_base = bb * stride_kb + k_start * stride_ks + hk * stride_kh
    v_base = bb * stride_vb + k_start * stride_vs + hk * stride_vh

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _rows(Q + q_base + offs_m[:, None] * stride_qs + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, EVEN_D)
    do = _rows(DO + do_base + offs_m[:, None] * stride_ds + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM,
               EVEN_D)
    lse2 = tl.load(LSE2 + l_base + offs_m, mask=offs_m < seqlen_q, other=float("inf"))
    delta = tl.load(DELTA + l_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    diag = seqlen_k - seqlen_q
    if CAUSAL:
        hi = tl.minimum(seqlen_k, tl.maximum(start_m + BLOCK_M + diag, 0))
        full = tl.minimum(tl.maximum(start_m + diag + 1, 0) // BLOCK_N * BLOCK_N, seqlen_k // BLOCK_N * BLOCK_N)
    else:
        hi = seqlen_k
        full = seqlen_k // BLOCK_N * BLOCK_N
    for start_n in range(0, full, BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, delta, K, V, k_base, v_base, start_n, offs_m, offs_d, seqlen_k, diag, qk_scale,
                      stride_ks, stride_vs, BLOCK_N, HEAD_DIM, EVEN_D, False, CAUSAL, PRECISION)
    for start_n in range(full, hi, BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, delta, K, V, k_base, v_base, start_n, offs_m, offs_d, seqlen_k, diag, qk_scale,
                      stride_ks, stride_vs, BLOCK_N, HEAD_DIM, EVEN_D, True, CAUSAL, PRECISION)
    dq = dq * sm_scale
    if EVEN_D:
        st_mask = offs_m[:, None] < seqlen_q
    else:
        st_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    tl.store(DQ + dq_base + offs_m[:, None] * stride_dqs + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=st_mask)


CAPABILITIES = Capabilities(
    name="triton_bwd", module=__name__,
    role="backward, portable: dK/dV over key tiles, dQ by its own kernel (deterministic) or by atomics",
    dtypes=("fp16", "bf16", "fp32"), head_dims=tuple(range(8, 257, 8)), archs=None,
    features=("causal", "gqa", "varlen", "lse", "deterministic", "any_strides"),
    secret=("Q", "K", "V", "DO"), secret_varlen=("CU_SEQLENS_Q", "CU_SEQLENS_K"))
