"""Secure-mode pre-passes: a copy of V whose rows at or past the secret true length carry no data
(the Triton kernel, and the Gluon kernel's causal form), and for the Gluon kernel's non-causal form
sanitised copies of K and V plus 0/1 key weights (``attn_secure_sanitize_kv_kernel``, below).

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
from triton.language.extra.cuda import gdc_launch_dependents

from ..capabilities import Capabilities

# Rows of the key-weight tensor W (attn_secure_sanitize_kv_kernel): the N of the narrowest wgmma.
W_ROWS = 8
# Magnitude of the cancelling V padding pattern (attn_secure_sanitize_kv_kernel): exact in 16-bit, small.
PAD_SCALE: tl.constexpr = tl.constexpr(1.0 / 64)
# K_PAD_SCALED: the largest shrink of key 0 in a padding key. A padding score is then within K_PAD_EPS *
# sum_d |q_d k0_d| * scale of key 0's own (valid) score, so the row max exceeds the valid one by at most that.
K_PAD_EPS: tl.constexpr = tl.constexpr(1.0 / 16)


@triton.jit
def _hash(a, b, salt):
    """A public 32-bit hash of (salt, a, b) (integer tensors that broadcast): data-independent."""
    h = (a.to(tl.uint32) * 0x9E3779B1) ^ (b.to(tl.uint32) * 0x85EBCA77) ^ (salt.to(tl.uint32) * 0xC2B2AE3D)
    h = (h ^ (h >> 15)) * 0x2C1B3C6D
    return h ^ (h >> 12)


@triton.jit
def _position_noise(rows, cols, salt):
    """Finite values in [-2, 2) from a hash of (salt, row, col): public, data-independent."""
    h = _hash(rows[:, None], cols[None, :], salt)
    return ((h >> 8) & 0xFFFF).to(tl.float32) * (4.0 / 65536.0) - 2.0


@triton.jit
def _row_unit(rows, salt):
    """One public value in [0, 1) per row (a hash of the row and ``salt``)."""
    return ((_hash(rows, rows * 0 + 0x5BD1, salt) >> 8) & 0xFFFF).to(tl.float32) * (1.0 / 65536.0)


@triton.jit
def _let_dependent_launch(PDL_TRIGGER: tl.constexpr):
    """With PDL_TRIGGER (sm_90, before the secure Gluon kernel: launch.secure_prepass), the next kernel, launched as
    a programmatic dependent of this one, may start now: its programs set up and load Q beside this pass's and wait
    (``griddepcontrol.wait``, which returns once this whole grid has completed and its writes are visible) before
    they read its output. Unconditional, at entry: no secret anywhere near it."""
    if PDL_TRIGGER:
        gdc_launch_dependents()


@triton.jit
def _prepass_tile(SEQLENS_K, seqlen_k, num_heads_kv, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's tile of a pre-pass: (batch*head, batch, head, the secret key length clamped
    arithmetically into [0, seqlen_k], its rows, its head-dim offsets)."""
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads_kv
    h = pid_bh % num_heads_kv
    len_k = tl.minimum(tl.maximum(tl.load(SEQLENS_K + b), 0), seqlen_k)
    rows = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    return pid_bh, b, h, len_k, rows, tl.arange(0, BLOCK_D)


@triton.jit
def attn_secure_zero_v_padding_kernel(
    V, VS, SEQLENS_K,
    stride_vb, stride_vh, stride_vs,
    seqlen_k, num_heads_kv,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, PDL_TRIGGER: tl.constexpr = False,
):
    _let_dependent_launch(PDL_TRIGGER)
    pid_bh, b, h, len_k, rows, offs_d = _prepass_tile(SEQLENS_K, seqlen_k, num_heads_kv, BLOCK_S, BLOCK_D)
    in_bounds = (rows[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)  # public shape only
    src = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh + rows[:, None] * stride_vs + offs_d[None, :]
    x = tl.load(src, mask=in_bounds, other=0.0)
    x = tl.where(rows[:, None] < len_k, x, _position_noise(rows, offs_d, pid_bh).to(x.dtype))
    # VS is contiguous [B, Hkv, S, HEAD_DIM]
    dst = VS + (pid_bh.to(tl.int64) * seqlen_k + rows[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(dst, x, mask=in_bounds)


@triton.jit
def attn_secure_gather_v_padding_kernel(
    V, VS, SEQLENS_K, PAGE_TABLE,
    stride_vp, stride_vh, stride_vt, stride_pt,
    seqlen_k, num_heads_kv, num_pages,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, PAGE_SIZE: tl.constexpr,
):
    """The V pre-pass of :func:`attn_secure_zero_v_padding_kernel` over a paged cache ``[num_pages, PAGE_SIZE, Hkv,
    D]`` (secure chunked prefill, ``plan.prefill``): row ``r`` of sequence ``b`` is row ``r % PAGE_SIZE`` of page
    ``PAGE_TABLE[b, r // PAGE_SIZE]``, and the copy VS is contiguous ``[B, Hkv, seqlen_k, D]`` (``seqlen_k``: the
    capacity, the table's width times PAGE_SIZE), its rows at or past the secret length the public position pattern.

    Constant time as the V pre-pass: every row of the capacity read and written; the page indices are public (the
    table and the page size are), clamped to real pages by arithmetic as the decode kernel does; the length only in
    the select."""
    pid_bh, b, h, len_k, rows, offs_d = _prepass_tile(SEQLENS_K, seqlen_k, num_heads_kv, BLOCK_S, BLOCK_D)
    in_bounds = (rows[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)  # public shape only
    col = tl.minimum(rows // PAGE_SIZE, seqlen_k // PAGE_SIZE - 1)  # (rows past the capacity: the last column)
    page = tl.load(PAGE_TABLE + b.to(tl.int64) * stride_pt + col)
    page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
    src = (V + page[:, None] * stride_vp + h.to(tl.int64) * stride_vh + (rows % PAGE_SIZE)[:, None] * stride_vt
           + offs_d[None, :])
    x = tl.load(src, mask=in_bounds, other=0.0)
    x = tl.where(rows[:, None] < len_k, x, _position_noise(rows, offs_d, pid_bh).to(x.dtype))
    dst = VS + (pid_bh.to(tl.int64) * seqlen_k + rows[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(dst, x, mask=in_bounds)


@triton.jit
def attn_secure_sanitize_kv_kernel(
    K, V, KS, VS, W, SEQLENS_K,
    stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    seqlen_k, num_heads_kv, w_len,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, W_ROWS: tl.constexpr,
    V_PAD_PAIRS: tl.constexpr = True, K_PAD_SCALED: tl.constexpr = True, W_PAD_PAIRS: tl.constexpr = True,
    PDL_TRIGGER: tl.constexpr = False,
):
    """The pre-pass of the secure Gluon kernel's non-causal form, which masks no key (kernels/sm90/fwd.py):

    * KS: K with every padding row replaced by a public shrink of the sequence's first key, ``(1 - eps) * key0``
      with eps in [0, K_PAD_EPS), the same for both keys of a pair (counted from the length). A padding
      key's score is then within K_PAD_EPS * sum_d |q_d key0_d| * scale of a valid one (key 0's), so the
      unmasked row max exceeds the true one by at most that, every probability is finite, and the two
      keys of a pair have equal probabilities, whatever the padding held. Not plain copies of key 0
      (``K_PAD_SCALED`` False, an audit knob): a tile of one repeated key made the tensor cores' time
      follow the length (docs/security.md 5.4). With no valid key (length 0) the rows get the public
      position pattern: the kernel's row sum is 0 then and the row outputs zeros.
    * VS: V whose padding rows add nothing to P V although their probabilities are not zero: the rows
      come in pairs (counted from the length) of a small public pattern and its exact negation, and a
      padding key's probability is the same for every padding key of a row (all are copies of key 0),
      so each pair's products cancel. Not zeros, because the tensor cores run faster on zero operands
      (docs/security.md §5.4), so zero rows would make P V's time follow the length. The cancellation is
      exact in real arithmetic; the MMA's fp32 accumulation rounds, which leaves at most about
      n_pad * 2^-22 * PAD_SCALE * 2 in an output (PAD_SCALE keeps the pattern small). An odd last
      padding row has no partner and is zero.
    * W: ``[B, W_ROWS, w_len]``, 1 where a key is valid, and on padding keys pairs ``(c, -c)`` like V's
      (``W_PAD_PAIRS``; zeros with the knob off), 0 for an odd last padding key and past ``seqlen_k`` up
      to ``w_len``; all rows alike: the kernel's row sum is the MMA ``P W``, so padding keys drop out of
      the softmax denominator (their pairs cancel) without a select per score. Written by the programs
      of head 0.

    Constant time as the V pre-pass above: whole tiles read and written, the length only in selects."""
    _let_dependent_launch(PDL_TRIGGER)
    pid_bh, b, h, len_k, rows, offs_d = _prepass_tile(SEQLENS_K, seqlen_k, num_heads_kv, BLOCK_S, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    in_bounds = (rows[:, None] < seqlen_k) & d_ok[None, :]  # public shape only
    valid = rows[:, None] < len_k
    k_base = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    key0 = tl.load(k_base + offs_d, mask=d_ok, other=0.0)  # row 0 of the sequence: a public address
    kx = tl.load(k_base + rows[:, None] * stride_ks + offs_d[None, :], mask=in_bounds, other=0.0)
    # one public pattern per pair of padding rows (counted from the length), computed once for K and V
    pair_first = rows - ((rows - len_k) & 1)
    noise = _position_noise(pair_first, offs_d, pid_bh)
    key_pad = key0[None, :]
    if K_PAD_SCALED:  # each pair of padding keys a public shrink of key 0: (1 - eps) * key0, eps in [0, K_PAD_EPS)
        shrink = 1.0 - _row_unit(pair_first, pid_bh) * K_PAD_EPS
        key_pad = (key0[None, :].to(tl.float32) * shrink[:, None]).to(kx.dtype)
    kx = tl.where(valid, kx, tl.where(len_k > 0, key_pad, noise.to(kx.dtype)))
    vx = tl.load(V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh + rows[:, None] * stride_vs
                 + offs_d[None, :], mask=in_bounds, other=0.0)
    rel = rows[:, None] - len_k  # >= 0 on padding
    n_pad = seqlen_k - len_k
    pattern = tl.where((rel & 1) == 0, noise, -noise) * PAD_SCALE
    pattern = tl.where((rel == n_pad - 1) & ((n_pad & 1) == 1), 0.0, pattern)
    if not V_PAD_PAIRS:  # audit knob (plan.knobs.SECURE_V_PAD_ENV): zero rows, for the timing comparison
        pattern = tl.zeros_like(pattern)
    vx = tl.where(valid, vx, pattern.to(vx.dtype))
    # KS, VS are contiguous [B, Hkv, S, HEAD_DIM]
    dst = (pid_bh.to(tl.int64) * seqlen_k + rows[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(KS + dst, kx, mask=in_bounds)
    tl.store(VS + dst, vx, mask=in_bounds)
    if h == 0:  # public: one head per batch writes the key weights
        w_rows = tl.arange(0, W_ROWS)
        w_pad = tl.zeros([BLOCK_S], tl.float32)
        if W_PAD_PAIRS:  # pairs (pattern, -pattern) like V's: a pair's probabilities are equal, so they cancel
            w_rel = rows - len_k
            w_pad = (0.5 + _row_unit(pair_first, pid_bh + 0x2F)) * PAD_SCALE
            w_pad = tl.where((w_rel & 1) == 0, w_pad, -w_pad)
            w_pad = tl.where((rows < seqlen_k) & ((w_rel != n_pad - 1) | ((n_pad & 1) == 0)), w_pad, 0.0)
        w = tl.where(rows[None, :] < len_k, 1.0, w_pad[None, :]) + tl.zeros([W_ROWS, BLOCK_S], tl.float32)
        dst_w = W + (b.to(tl.int64) * W_ROWS + w_rows[:, None]) * w_len + rows[None, :]
        tl.store(dst_w, w.to(W.dtype.element_ty), mask=rows[None, :] < w_len)


@triton.jit
def attn_secure_fill_rows_kernel(
    X, XS, SEQLENS,
    stride_b, stride_h, stride_s,
    seqlen, num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """A copy of X ``[B, H, S, D]`` (contiguous XS) whose rows at or past the secret length ``SEQLENS[b]``
    hold data-like public stand-ins instead of the caller's padding: row 0 of the sequence with its head dim
    permuted (``d XOR m``, m a public hash of the row) and public signs flipped. So padding rows have the
    magnitudes of real data whatever the caller padded with (zeros make the tensor cores faster,
    docs/security.md 5.4). Used for Q (rows past the query length are computed, then replaced by zeros)
    and, in the causal self-attention form, for K (only rows past the length see padding keys). With
    length 0 the rows get the public position pattern.

    Constant time as the pre-passes above: whole tiles read and written, row 0 at a public address, the
    length only in selects."""
    pid_bh, b, h, length, rows, offs_d = _prepass_tile(SEQLENS, seqlen, num_heads, BLOCK_S, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    in_bounds = (rows[:, None] < seqlen) & d_ok[None, :]  # public shape only
    base = X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    x = tl.load(base + rows[:, None] * stride_s + offs_d[None, :], mask=in_bounds, other=0.0)
    perm = offs_d[None, :] ^ (_hash(rows, rows * 0 + 0x71, pid_bh) & (BLOCK_D - 1))[:, None]
    row0 = tl.load(base + perm, mask=perm < HEAD_DIM, other=0.0).to(tl.float32)
    flip = (_hash(rows[:, None], offs_d[None, :], pid_bh + 0x3C) & 0x100) != 0
    noise = _position_noise(rows, offs_d, pid_bh)
    stand_in = tl.where(flip, -row0, row0)
    stand_in = tl.where((length > 0) & (perm < HEAD_DIM), stand_in, noise)
    x = tl.where(rows[:, None] < length, x, stand_in.to(x.dtype))
    dst = (pid_bh.to(tl.int64) * seqlen + rows[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(XS + dst, x, mask=in_bounds)


V_CAPABILITIES = Capabilities(
    name="secure_prepass_v", module=__name__,
    role="secure mode: a copy of V whose padding carries no data (before the Triton kernel, the sm_90 causal form)",
    dtypes=("fp16", "bf16", "fp32"), head_dims=tuple(range(8, 257, 8)), archs=None, features=("secure",),
    secret=("V", "VS", "SEQLENS_K"))
KV_CAPABILITIES = Capabilities(
    name="secure_prepass_kv", module=__name__,
    role="secure mode: sanitised K/V copies and 0/1 key weights (before the sm_90 non-causal form)",
    dtypes=("fp16", "bf16"), head_dims=(64, 128), archs=None, features=("secure",),
    secret=("K", "V", "KS", "VS", "W", "SEQLENS_K"))
PAGED_V_CAPABILITIES = Capabilities(
    name="secure_prepass_paged_v", module=__name__,
    role="secure mode: a contiguous copy of a paged cache's V whose padding carries no data (before secure chunked "
         "prefill's V_PREPASS form)",
    dtypes=("fp16", "bf16"), head_dims=(64, 128), archs=None, features=("secure", "paged"),
    secret=("V", "VS", "SEQLENS_K"))
ROWS_CAPABILITIES = Capabilities(
    name="secure_fill_rows", module=__name__,
    role="secure mode: a copy of Q (or of K and V, causal form) whose padding rows hold data-like public stand-ins",
    dtypes=("fp16", "bf16", "fp32"), head_dims=tuple(range(8, 257, 8)), archs=None, features=("secure",),
    secret=("X", "XS", "SEQLENS"))
