"""Fused attention forward (FlashAttention-2 style online softmax) in Triton.

One kernel, specialised by ``constexpr`` flags rather than copied:

* fast path: key blocks that need no mask run an unmasked stage; only the blocks that straddle
  the causal diagonal or the end of the keys run the masked stage. Loop bounds come from the
  (public) lengths, so a packed ``VARLEN`` launch has length-dependent trip counts.
* ``SECURE``: the constant-time path. V's padding (which may hold NaN/Inf) is zeroed either by
  the pre-pass in ``kernels/secure/prepass.py`` (then V here is that clean copy) or, with
  ``ZERO_V_IN_LOOP``, by a select on every V tile. True lengths are read on the device from ``SEQLENS_*``
  and only ever enter arithmetic selects; the loop covers every key block of the padded
  ``seqlen_k`` (causal block skipping only on the public diagonal, see ``SECURE_PUBLIC_DIAG``),
  every load is bounded by the public padded shape, and rows past the true length are zeroed by
  a select before an unconditional (publicly bounded) store.

Scores are kept in base 2: ``qk_scale = scale * log2(e)``, so the softmax uses ``exp2``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..capabilities import Capabilities

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _load_rows(ptrs, rows, row_bound, offs_d, HEAD_DIM: tl.constexpr, MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    """Load a [rows, BLOCK_D] tile; masks only what the constexpr flags say can be out of range."""
    if MASK_ROWS:
        if EVEN_D:
            t = tl.load(ptrs, mask=rows[:, None] < row_bound, other=0.0)
        else:
            t = tl.load(ptrs, mask=(rows[:, None] < row_bound) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    else:
        if EVEN_D:
            t = tl.load(ptrs)
        else:
            t = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return t


@triton.jit
def _load_kv(src, base, start_n, offs_n, seqlen_k, stride_s, b, h_kv, offs_d,
             BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
             MASK_LOADS: tl.constexpr, EVEN_D: tl.constexpr, USE_TMA: tl.constexpr):
    """A [BLOCK_N, BLOCK_D] tile of K or V starting at key ``start_n``.

    TMA: the descriptor spans [B, H, S, D], so rows past S and columns past D arrive as zeros
    and the copy engine computes addresses (no pointer tensors held in registers)."""
    if USE_TMA:
        t = src.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
    else:
        ptrs = src + base + (start_n + offs_n)[:, None] * stride_s + offs_d[None, :]
        t = _load_rows(ptrs, start_n + offs_n, seqlen_k, offs_d, HEAD_DIM, MASK_LOADS, EVEN_D)
    return t


@triton.jit
def _attn_step(acc, l_i, m_i, q, K, V, k_base, v_base, b, h_kv, start_n, offs_m, offs_n, offs_d,
               seqlen_k, key_limit, diag, qk_scale, stride_ks, stride_vs,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               MASK_KEYS: tl.constexpr, MASK_CAUSAL: tl.constexpr, MASK_LOADS: tl.constexpr,
               ZERO_V: tl.constexpr, EVEN_D: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr):
    """One key block of the online softmax.

    ``seqlen_k`` bounds the loads (public); ``key_limit`` bounds the keys that count (the true
    length in secure mode, equal to ``seqlen_k`` otherwise); ``diag`` is the causal offset.
    Masking selects -inf on the raw scores, so masked and unmasked blocks share the one FFMA
    that scales and shifts (-inf * qk_scale stays -inf because qk_scale > 0).
    """
    cols = start_n + offs_n
    k = _load_kv(K, k_base, start_n, offs_n, seqlen_k, stride_ks, b, h_kv, offs_d,
                 BLOCK_N, HEAD_DIM, BLOCK_D, MASK_LOADS, EVEN_D, USE_TMA)
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if MASK_KEYS or MASK_CAUSAL:
        if MASK_KEYS and MASK_CAUSAL:
            valid = (cols[None, :] < key_limit) & (cols[None, :] <= offs_m[:, None] + diag)
        elif MASK_KEYS:
            valid = cols[None, :] < key_limit
        else:
            valid = cols[None, :] <= offs_m[:, None] + diag
        qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        # a row with no visible key so far keeps m = -inf; shift by 0 so exp2 gives 0, not NaN
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_shift = m_new
    p = tl.math.exp2(qk * qk_scale - m_shift[:, None])
    alpha = tl.math.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = _load_kv(V, v_base, start_n, offs_n, seqlen_k, stride_vs, b, h_kv, offs_d,
                 BLOCK_N, HEAD_DIM, BLOCK_D, MASK_LOADS, EVEN_D, USE_TMA)
    if ZERO_V:
        # padding may hold NaN/Inf and 0 * NaN = NaN inside the MMA: zero it with a select
        v = tl.where((cols < key_limit)[:, None], v, 0.0)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def attn_fwd_kernel(
    Q, K, V, O, LSE, SEQLENS_Q, SEQLENS_K, CU_SEQLENS_Q, CU_SEQLENS_K,
    qk_scale,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, num_heads_q, gqa_group,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, SECURE: tl.constexpr, SECURE_PUBLIC_DIAG: tl.constexpr,
    EVEN_N: tl.constexpr, RETURN_LSE: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
    ZERO_V_IN_LOOP: tl.constexpr,
):
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_q
    h = pid_bh % num_heads_q
    h_kv = h // gqa_group
    if CAUSAL:
        # the blocks near the end do the most work under a causal mask: schedule them first
        start_m = tl.num_programs(0) - 1 - pid_m
    else:
        start_m = pid_m

    if VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + b)
        k_start = tl.load(CU_SEQLENS_K + b)
        seqlen_q = tl.load(CU_SEQLENS_Q + b + 1) - q_start
        seqlen_k = tl.load(CU_SEQLENS_K + b + 1) - k_start
        if start_m * BLOCK_M >= seqlen_q:
            return
        q_base = q_start.to(tl.int64) * stride_qs
        k_base = k_start.to(tl.int64) * stride_ks
        v_base = k_start.to(tl.int64) * stride_vs
        o_base = q_start.to(tl.int64) * stride_os
        lse_base = q_start.to(tl.int64)
    else:
        q_base = b.to(tl.int64) * stride_qb
        k_base = b.to(tl.int64) * stride_kb
        v_base = b.to(tl.int64) * stride_vb
        o_base = b.to(tl.int64) * stride_ob
        lse_base = b.to(tl.int64) * stride_lb
    q_base += h.to(tl.int64) * stride_qh
    k_base += h_kv.to(tl.int64) * stride_kh
    v_base += h_kv.to(tl.int64) * stride_vh
    o_base += h.to(tl.int64) * stride_oh
    lse_base += h.to(tl.int64) * stride_lh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    if USE_TMA:
        q = Q.load([b, h, start_m * BLOCK_M, 0]).reshape(BLOCK_M, BLOCK_D)
    else:
        q_ptrs = Q + q_base + offs_m[:, None] * stride_qs + offs_d[None, :]
        q = _load_rows(q_ptrs, offs_m, seqlen_q, offs_d, HEAD_DIM, True, EVEN_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if SECURE:
        # Secret lengths: clamped arithmetically, used only in selects below.
        len_q = tl.minimum(tl.maximum(tl.load(SEQLENS_Q + b), 0), seqlen_q)
        len_k = tl.minimum(tl.maximum(tl.load(SEQLENS_K + b), 0), seqlen_k)
        diag = len_k - len_q
        key_limit = len_k
        if CAUSAL and SECURE_PUBLIC_DIAG:
            # len_q == len_k and Sq == Sk, so diag == 0 whatever the lengths: the diagonal is
            # public, and so are the blocks wholly below it (they need only the length mask).
            hi = tl.minimum(seqlen_k, (start_m + 1) * BLOCK_M)
            full = tl.minimum((start_m * BLOCK_M + 1) // BLOCK_N * BLOCK_N, hi)
        elif CAUSAL:
            hi = seqlen_k
            full = 0
        else:
            hi = seqlen_k
            full = seqlen_k
    else:
        diag = seqlen_k - seqlen_q
        key_limit = seqlen_k
        if CAUSAL:
            hi = tl.minimum(seqlen_k, tl.maximum(start_m * BLOCK_M + BLOCK_M + diag, 0))
            # blocks wholly below the diagonal of the block's first row need no mask
            full = tl.minimum(tl.maximum(start_m * BLOCK_M + diag + 1, 0) // BLOCK_N * BLOCK_N,
                              seqlen_k // BLOCK_N * BLOCK_N)
        else:
            hi = seqlen_k
            full = seqlen_k // BLOCK_N * BLOCK_N
    # Stage 1: no causal mask (fast: no mask at all; secure: the secret length mask only).
    for start_n in range(0, full, BLOCK_N):
        acc, l_i, m_i = _attn_step(acc, l_i, m_i, q, K, V, k_base, v_base, b, h_kv, start_n, offs_m, offs_n, offs_d,
                                   seqlen_k, key_limit, diag, qk_scale, stride_ks, stride_vs,
                                   BLOCK_N, HEAD_DIM, BLOCK_D, SECURE, False, SECURE and not EVEN_N,
                                   SECURE and ZERO_V_IN_LOOP, EVEN_D, USE_TMA, PRECISION)
    # Stage 2: blocks on the causal diagonal or past the end of the keys.
    for start_n in range(full, hi, BLOCK_N):
        acc, l_i, m_i = _attn_step(acc, l_i, m_i, q, K, V, k_base, v_base, b, h_kv, start_n, offs_m, offs_n, offs_d,
                                   seqlen_k, key_limit, diag, qk_scale, stride_ks, stride_vs,
                                   BLOCK_N, HEAD_DIM, BLOCK_D, True, CAUSAL, not (SECURE and EVEN_N),
                                   SECURE and ZERO_V_IN_LOOP, EVEN_D, USE_TMA, PRECISION)

    # Rows that saw no key have l == 0 and acc == 0: divide by 1 to output exact zeros.
    # fdiv without IEEE rounding is the approximate divide: no data-dependent slow path.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    inv_l = tl.fdiv(tl.full([BLOCK_M], 1.0, tl.float32), l_safe, ieee_rounding=False)
    out = acc * inv_l[:, None]
    if SECURE:
        row_valid = offs_m < len_q
        out = tl.where(row_valid[:, None], out, 0.0)
    o_ptrs = O + o_base + offs_m[:, None] * stride_os + offs_d[None, :]
    if EVEN_D:
        o_mask = offs_m[:, None] < seqlen_q
    else:
        o_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=o_mask)
    if RETURN_LSE:
        if SECURE:
            # log2's denormal rescaling (x < 2^-126: x * 2^23) is a predicated multiply on the secret row sum, and
            # ptxas may spill such a conditionally updated value with a predicated store (triton 3.9, fp32 D=256:
            # audit sass). A non-zero row sum is >= ~1 (the row maximum's own term), so log2 gets max(l_safe,
            # 2^-125): the compiler folds the rescaling away and no predicate on the row sum is left. The values do
            # not change: rows that saw no key keep m_i = -inf (lse = -inf), and a NaN row sum, which maxnum drops,
            # comes back through the added l_safe - l_safe (0 otherwise; arithmetic, not a select: a select on the
            # row sum gets the same predicated spill store).
            lse = m_i + tl.math.log2(tl.maximum(l_safe, 2.350988701644575e-38)) + (l_safe - l_safe)
            lse = tl.where(row_valid, lse * 0.6931471805599453, float("-inf"))
        else:
            lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # log2 -> natural log
        tl.store(LSE + lse_base + offs_m, lse, mask=offs_m < seqlen_q)


CAPABILITIES = Capabilities(
    name="triton_fwd", module=__name__, role="forward, portable: every CUDA GPU and the CPU interpreter",
    dtypes=("fp16", "bf16", "fp32"), head_dims=tuple(range(8, 257, 8)), archs=None,
    features=("causal", "gqa", "varlen", "secure", "lse", "any_strides"),
    secret=("Q", "K", "V"), secret_secure=("SEQLENS_Q", "SEQLENS_K"), secret_varlen=("CU_SEQLENS_Q", "CU_SEQLENS_K"))
