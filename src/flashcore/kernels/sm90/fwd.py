"""Hopper (sm_90a) attention forward in Gluon: warp-specialised, TMA-fed, wgmma.

Why a second kernel: the portable Triton kernel (``kernels/triton/fwd.py``) runs softmax and the two
MMAs of a tile one after another in all warps, so the tensor cores idle during softmax (~0.8x
cuDNN at D=128, docs/perf-notes.md). This one splits each program into three partitions:

* a 1-warp **loader** that streams K/V tiles into a ring of shared-memory slots with TMA;
* ``NUM_WG`` 4-warp **consumers** (one warpgroup each, ``BLOCK_M`` = 64 query rows each) that share
  the ring: two, or three at D=64 for long sequences, where the extra warps hide more of each
  softmax's dependency chain (160 registers each instead of 240 still fit D=64 without spills), or
  one at D=64 for small problems, where two programs then share an SM (perf-notes v14).

Inside a consumer the S = QK^T of tile j+1 is issued asynchronously before the softmax of tile j
and the P@V of tile j runs while the next softmax is computed, so one warpgroup keeps the tensor
cores busy while the other does exponentials (the warp scheduler interleaves the two).

Persistent where work items cost the same (non-causal): one program per SM loops over work items
(NUM_WG x BLOCK_M query rows of one head), with Q double-buffered so the next item's Q and first K/V
tiles load while the consumers finish the current one; causal items each get a program.

The fast path skips causal blocks by length-dependent bounds; ``SECURE`` is the constant-time
variant of the same code (secure mode's kernel on Hopper since v11; docs/security.md). Both support
bf16/fp16, head dims 64 and 128, any Sq/Sk, GQA,
and any 16-byte aligned strides (rank-4 TMA descriptors, so a tile never reads
a neighbouring head: out-of-range rows are zero-filled by the copy engine and clipped on store).

Device code only: the host side (grid, descriptors, switches) is ``flashcore.launch.sm90_fwd``; the shared
device parts are ``tile_scheduler``, ``pipeline`` (the loader), ``softmax`` and ``trace`` beside this file.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..capabilities import Capabilities
from .clear_rows import _zero_rows_past
from .gluon_compat import async_store, thread_barrier
from .partition import Form, Shared
from .pipeline import _issue_first_loads, _loader
from .softmax import _softmax_step
from .tile_scheduler import _kv_blocks, _row_tile, _units_per_head
from .trace import _TRACE_ITEM0, _TRACE_ITEM_SLOTS, _stamp, _stamp_step


@gluon.jit
def _consumer(shared, form, WG: gl.constexpr):
    """A consumer partition (warpgroup ``WG``): its 64 query rows of each of this program's work items."""
    BLOCK_M: gl.constexpr = form.BLOCK_M
    BLOCK_N: gl.constexpr = form.BLOCK_N
    HEAD_DIM: gl.constexpr = form.HEAD_DIM
    K_STAGES: gl.constexpr = form.K_STAGES
    V_STAGES: gl.constexpr = form.V_STAGES
    CAUSAL: gl.constexpr = form.CAUSAL
    RETURN_LSE: gl.constexpr = form.RETURN_LSE
    NUM_WG: gl.constexpr = form.NUM_WG
    PAIRED: gl.constexpr = form.PAIRED
    SECURE: gl.constexpr = form.SECURE
    SUM_MMA: gl.constexpr = form.SUM_MMA
    TRACE: gl.constexpr = form.TRACE
    STAGGER: gl.constexpr = form.STAGGER
    KEY_LENS: gl.constexpr = form.KEY_LENS
    SECRET_DIAG: gl.constexpr = form.SECRET_DIAG
    q_desc = shared.q_desc
    o_desc = shared.o_desc
    q_smem = shared.q_smem
    k_smem = shared.k_smem
    v_smem = shared.v_smem
    w_smem = shared.w_smem
    q_ready = shared.q_ready
    q_empty = shared.q_empty
    k_ready = shared.k_ready
    v_ready = shared.v_ready
    k_empty = shared.k_empty
    v_empty = shared.v_empty
    stagger = shared.stagger
    v_clean = shared.v_clean
    lse_ptr = shared.lse_ptr
    seqlens_q_ptr = shared.seqlens_q_ptr
    seqlens_k_ptr = shared.seqlens_k_ptr
    qk_scale = shared.qk_scale
    seqlen_q = shared.seqlen_q
    seqlen_k = shared.seqlen_k
    num_heads = shared.num_heads
    lse_stride_b = shared.lse_stride_b
    lse_stride_h = shared.lse_stride_h
    num_m_tiles = shared.num_m_tiles
    num_tiles = shared.num_tiles
    kc = 0
    it = 0
    _stamp(seqlens_q_ptr, 0, TRACE, WG, NUM_WG)
    _stamp(seqlens_q_ptr, 2, TRACE, WG, NUM_WG, True)
    # this program's units advance by the grid size: (unit-in-head r, batch b, head h) step by carries instead
    # of two integer divisions per item (on the critical path between items). Not with three warpgroups: at 160
    # registers the carried state spills (one STL, seven LDL); nor in secure mode, where it changes register
    # allocation so that a register that once held the clamped secret length reaches the O store's coordinate
    # vector on some path (audit sass, D=128 causal): the secure kernel keeps the form the gate has passed
    CARRY: gl.constexpr = NUM_WG < 3 and not SECURE
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    per_head = _units_per_head(num_m_tiles, PAIRED)
    r = pid % per_head
    b = (pid // per_head) // num_heads
    h = (pid // per_head) % num_heads
    dq = nprog // per_head
    dr = nprog - dq * per_head
    db0 = dq // num_heads
    dh0 = dq - db0 * num_heads
    db1 = (dq + 1) // num_heads
    dh1 = dq + 1 - db1 * num_heads
    for unit in range(pid, num_tiles, nprog):
        if not CARRY:
            r = unit % per_head
            b = (unit // per_head) // num_heads
            h = (unit // per_head) % num_heads
        for half in gl.static_range(2 if PAIRED else 1):
            pid_m, valid = _row_tile(r, half, num_m_tiles, CAUSAL, PAIRED)
            if valid:
                n = _consume_tile(pid_m, b, h, kc, it, q_desc, o_desc, q_smem, k_smem, v_smem, w_smem, q_ready,
                                  q_empty, k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr,
                                  qk_scale, seqlen_q, seqlen_k, num_heads, lse_stride_b, lse_stride_h, BLOCK_M,
                                  BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, SECURE, SUM_MMA,
                                  TRACE, STAGGER, WG, KEY_LENS, v_clean, seqlens_k_ptr, SECRET_DIAG)
                kc += n
                it += 1
        if CARRY:
            r += dr
            carry = r >= per_head
            r = gl.where(carry, r - per_head, r)
            h += gl.where(carry, dh1, dh0)
            b += gl.where(carry, db1, db0)
            wrap = h >= num_heads
            h = gl.where(wrap, h - num_heads, h)
            b += wrap.to(gl.int32)
    tma.store_wait(0)  # the last item's O store must have read shared memory before the program exits
    _stamp(seqlens_q_ptr, 1, TRACE, WG, NUM_WG)
    _stamp(seqlens_q_ptr, 3, TRACE, WG, NUM_WG, True)


@gluon.jit
def _stagger_wait(stagger, it, STAGGER: gl.constexpr, WG: gl.constexpr):
    """STAGGER (perf-notes v16): the consumer warpgroups of a program that start their first item together
    stay in step (both softmaxes at once, then both MMAs) and each key-tile step takes ~1.5 us instead of ~1.2
    (4x16x1024x64); once offset by a fraction of a step they keep the offset. So warpgroup WG > 0 starts
    its first item only after warpgroup WG - 1 has passed its first S (STAGGER 1) or its first softmax (2)."""
    if STAGGER > 0:
        if WG > 0:
            if it == 0:
                mbarrier.wait(stagger.index(WG - 1), 0)


@gluon.jit
def _stagger_arrive(stagger, it, POINT: gl.constexpr, STAGGER: gl.constexpr, WG: gl.constexpr,
                    NUM_WG: gl.constexpr):
    """Warpgroup WG's first item has reached point POINT (1: its first S, 2: its first softmax): where that is
    the STAGGER point, the next warpgroup may start (_stagger_wait)."""
    if STAGGER == POINT:
        if WG < NUM_WG - 1:
            if it == 0:
                mbarrier.arrive(stagger.index(WG), count=1)


@gluon.jit
def _consume_tile(pid_m, b, h, kc, it, q_desc, o_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty, k_ready,
                  v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q, seqlen_k, num_heads,
                  lse_stride_b, lse_stride_h, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                  K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr,
                  NUM_WG: gl.constexpr, SECURE: gl.constexpr, SUM_MMA: gl.constexpr, TRACE: gl.constexpr,
                  STAGGER: gl.constexpr, WG: gl.constexpr, KEY_LENS: gl.constexpr, v_clean, seqlens_k_ptr,
                  SECRET_DIAG: gl.constexpr):
    """One work item for this warpgroup: BLOCK_M query rows against all their key tiles. ``kc`` is the
    ring position of the item's first K/V tile, ``it`` the item's index (Q slot and phase). Returns the
    number of K/V tiles it consumed (where the next item's tiles start in the rings).

    SECURE: every trip count and address above is a function of the public shape (the padded lengths),
    and no key is masked by a secret length. Non-causal, the pre-pass (kernels/secure/prepass.py,
    ``attn_secure_sanitize_kv_kernel``) made every padding key a copy of the first key and V's padding
    rows cancel in pairs, so the unmasked row max is the true one and padding adds nothing to P V; the row sum is the
    MMA ``P W`` against the pre-pass's 0/1 key weights (SUM_MMA), which replaces the per-score adds.
    Causal, the self-attention form (len_q == len_k, Sq == Sk, public diagonal): a row i < len sees keys
    j <= i < len only. Either way the loop is the fast kernel's, and the true query length enters only the
    epilogue's selects: rows at or past it output zeros. (A secret diagonal: SECRET_DIAG below.)

    KEY_LENS (chunked prefill against a KV cache, ``plan.prefill``): the pointer argument holds each sequence's key
    length, and keys at or past it are what keys past ``seqlen_k`` are otherwise: never visited beyond the last
    tile, masked within it; causal stays bottom-right, per sequence. With SECURE the lengths are secret: the item
    visits the tiles up to the public capacity's diagonal, every tile is masked by select with the secret length
    and diagonal, the queries are all real (no query lengths), and the loader warpgroup has cleared V's rows past
    the length in every tile (``pipeline._sanitise_v``). Unlike rows past
    ``seqlen_k``, which the copy engine fills with zeros, the last tile's rows past a key length are cache memory
    that may hold anything (NaN in a stale or never-written slot, and 0 * NaN = NaN in P V), so the consumers clear
    those rows of V before the last P V (_clear_rows_past_length).

    SECRET_DIAG (SECURE, causal attention whose diagonal is secret: explicit query lengths, or Sq != Sk): query row i
    sees key j iff j < len_k and j <= i + len_k - len_q, both lengths secret (``seqlens_q_ptr``, ``seqlens_k_ptr``).
    That offset can be anything in [-Sq, Sk], so the item visits every key tile (the form's CAUSAL is False: the
    non-causal trip counts and schedule) and every tile is masked by select with the secret length and diagonal,
    as SECURE with KEY_LENS is. V's padding rows come finite from the V pre-pass or the loader (SANITISE), K as given
    (a masked score is a select); rows at or past len_q output zeros, as in the other secure forms."""
    dtype: gl.constexpr = q_desc.dtype
    W_ROWS: gl.constexpr = 8  # the narrowest wgmma (N = 8); = kernels.secure.prepass.W_ROWS, the host's key-weight rows
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, W_ROWS, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    # SECURE with KEY_LENS (chunked prefill in secure mode): the key lengths are secret. The item visits the tiles of
    # the whole cache (seqlen_k, the capacity: public), and its key length enters the masks only (every tile masked,
    # by select); the loader warpgroup has cleared V's rows past the length in every tile (pipeline._sanitise_v)
    SECRET_KEY_LENS: gl.constexpr = SECURE and KEY_LENS
    # (SECRET_DIAG: the same masked step on every tile, the diagonal from both secret lengths; see above)
    MASK_EVERY_TILE: gl.constexpr = SECRET_KEY_LENS or (SECURE and SECRET_DIAG)
    MASK_CAUSAL: gl.constexpr = CAUSAL or SECRET_DIAG
    m_wg = pid_m * NUM_WG * BLOCK_M + WG * BLOCK_M
    row = m_wg + gl.arange(0, BLOCK_M, layout=row_layout)
    if SECRET_KEY_LENS:  # clamped into the cache arithmetically
        len_k = gl.minimum(gl.maximum(gl.load(seqlens_q_ptr + b), 0), seqlen_k)
        diag_k = len_k - seqlen_q
    elif KEY_LENS:  # clamped into the cache (an unchecked length under CUDA-graph replay reads nothing outside it)
        seqlen_k = gl.minimum(gl.maximum(gl.load(seqlens_q_ptr + b), 0), seqlen_k)
    diag = seqlen_k - seqlen_q
    if SECURE and not KEY_LENS:  # secret: clamped arithmetically into [0, padded length]
        len_q = gl.minimum(gl.maximum(gl.load(seqlens_q_ptr + b), 0), seqlen_q)
        if SECRET_DIAG:  # the key length too, and the diagonal from both
            len_k = gl.minimum(gl.maximum(gl.load(seqlens_k_ptr + b), 0), seqlen_k)
            diag_k = len_k - len_q

    n_blocks = _kv_blocks(pid_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL, NUM_WG)
    # Tiles before n_full need no mask for any of this warpgroup's rows.
    if CAUSAL:
        n_full = gl.minimum(gl.maximum(m_wg + 1 + diag, 0), seqlen_k) // BLOCK_N
    else:
        n_full = seqlen_k // BLOCK_N

    qs = it % 2
    q_slot = q_smem.index(NUM_WG * qs + WG)
    q = q_slot.reshape([BLOCK_M, HEAD_DIM])
    mbarrier.wait(q_ready.index(qs), (it // 2) & 1)
    tb = _TRACE_ITEM0 + it * _TRACE_ITEM_SLOTS
    _stamp(seqlens_q_ptr, tb, TRACE, WG, NUM_WG)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=row_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    if SUM_MMA:  # the row sums, as W_ROWS equal columns
        acc_l = gl.zeros([BLOCK_M, W_ROWS], gl.float32, layout=l_layout)

    # Prologue: tile 0's scores and softmax.
    _stagger_wait(stagger, it, STAGGER, WG)
    ks0 = kc % K_STAGES
    mbarrier.wait(k_ready.index(ks0), (kc // K_STAGES) & 1)
    k0 = k_smem.index(ks0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    s = warpgroup_mma(q, k0, s_zero, use_acc=False, is_async=True)
    if not SECURE:
        if it > 0:  # the previous item's O store (from the other Q slot) is waited for here, under this MMA
            tma.store_wait(0)
            mbarrier.arrive(q_empty.index(1 - qs), count=1)
    s = warpgroup_mma_wait(0, deps=(s, ))
    _stamp(seqlens_q_ptr, tb + 1, TRACE, WG, NUM_WG)
    mbarrier.arrive(k_empty.index(ks0), count=1)
    _stagger_arrive(stagger, it, 1, STAGGER, WG, NUM_WG)
    if MASK_EVERY_TILE:
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, row, len_k, diag_k, qk_scale, True, MASK_CAUSAL,
                                           not SUM_MMA, BLOCK_N, s_layout)
    elif n_full > 0:
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, row, seqlen_k, diag, qk_scale, False, False, not SUM_MMA,
                                           BLOCK_N, s_layout)
    else:
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, row, seqlen_k, diag, qk_scale, True, CAUSAL, not SUM_MMA,
                                           BLOCK_N, s_layout)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    _stagger_arrive(stagger, it, 2, STAGGER, WG, NUM_WG)

    for j in range(1, n_blocks):
        c = kc + j
        ks = c % K_STAGES
        vp = (c - 1) % V_STAGES
        # issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1}; both run while we wait for S_j only (with
        # SUM_MMA the small P_{j-1} W_{j-1} goes between them, so that wait covers it too)
        mbarrier.wait(k_ready.index(ks), (c // K_STAGES) & 1)
        kj = k_smem.index(ks).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s_tok = warpgroup_mma(q, kj, s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(vp), ((c - 1) // V_STAGES) & 1)
        vj = v_smem.index(vp).reshape([BLOCK_N, HEAD_DIM])
        if SUM_MMA:
            wj = w_smem.index(vp).reshape([W_ROWS, BLOCK_N]).permute((1, 0))
            l_tok = warpgroup_mma(p_op, wj, acc_l, is_async=True)
            acc_tok = warpgroup_mma(p_op, vj, acc, is_async=True)
            s, acc_l = warpgroup_mma_wait(1, deps=(s_tok, l_tok))
        else:
            acc_tok = warpgroup_mma(p_op, vj, acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok, ))
        _stamp_step(seqlens_q_ptr, tb, j, 0, TRACE, WG, NUM_WG)
        mbarrier.arrive(k_empty.index(ks), count=1)
        if MASK_EVERY_TILE:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, row, len_k, diag_k, qk_scale, True,
                                               MASK_CAUSAL, not SUM_MMA, BLOCK_N, s_layout)
        elif j < n_full:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, row, seqlen_k, diag, qk_scale, False, False,
                                               not SUM_MMA, BLOCK_N, s_layout)
        else:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, row, seqlen_k, diag, qk_scale, True, CAUSAL,
                                               not SUM_MMA, BLOCK_N, s_layout)
        acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))
        _stamp_step(seqlens_q_ptr, tb, j, 1, TRACE, WG, NUM_WG)
        mbarrier.arrive(v_empty.index(vp), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        if SUM_MMA:
            acc_l = acc_l * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, l_layout)), 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)

    cl = kc + n_blocks - 1
    last = cl % V_STAGES
    mbarrier.wait(v_ready.index(last), (cl // V_STAGES) & 1)
    vl = v_smem.index(last).reshape([BLOCK_N, HEAD_DIM])
    if KEY_LENS and not SECURE:
        _clear_rows_past_length(vl, v_clean, it, seqlen_k - (n_blocks - 1) * BLOCK_N, BLOCK_N, HEAD_DIM, NUM_WG, WG)
    if SUM_MMA:
        wl = w_smem.index(last).reshape([W_ROWS, BLOCK_N]).permute((1, 0))
        acc_l = warpgroup_mma(p_op, wl, acc_l, is_async=True)
        acc = warpgroup_mma(p_op, vl, acc, is_async=True)
        acc, acc_l = warpgroup_mma_wait(0, deps=(acc, acc_l))
        l_i = gl.convert_layout(gl.max(acc_l, axis=1), row_layout)
    else:
        acc = warpgroup_mma(p_op, vl, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
    _stamp(seqlens_q_ptr, tb + 22, TRACE, WG, NUM_WG)
    mbarrier.arrive(v_empty.index(last), count=1)

    # a row that saw no key has l == 0 and acc == 0: divide by 1 for exact zeros. ``/`` is the approximate
    # divide (div.full.f32): no data-dependent slow path. One reciprocal per row, then multiplies: dividing all
    # 32 accumulators per thread made the epilogue 248 instructions instead of 74 (perf-notes v15.1)
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    o = acc * gl.expand_dims(gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, o_layout)), 1)
    if SECURE and not KEY_LENS:  # rows past the true length output exact zeros, whatever their padding held
        row_o = m_wg + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        o = gl.where(gl.expand_dims(row_o < len_q, 1), o, 0.0)
    if RETURN_LSE:
        lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
        if SECURE and not KEY_LENS:
            lse = gl.where(row < len_q, lse, float("-inf"))
        gl.store(lse_ptr + b * lse_stride_b + h * lse_stride_h + row, lse, mask=row < seqlen_q)
    # Q is dead: its slot stages the output tile for the TMA store (which clips rows >= Sq). On the fast path the
    # store is not waited for here: the next item waits for it under its first MMA and then gives the slot back
    # to the loader (the wait cost ~0.28 us per item at the boundary; perf-notes v15.2), the last one at exit.
    _stamp(seqlens_q_ptr, tb + 20, TRACE, WG, NUM_WG)
    q_slot.reshape([BLOCK_M, HEAD_DIM]).store(o.to(dtype))
    fence_async_shared()
    async_store(o_desc, [b, h, m_wg, 0], q_slot)
    _stamp(seqlens_q_ptr, tb + 21, TRACE, WG, NUM_WG)
    if SECURE:  # (secure: as the gate has passed it, waited for here; see _consumer)
        tma.store_wait(0)
        mbarrier.arrive(q_empty.index(qs), count=1)
    _stamp(seqlens_q_ptr, tb + 23, TRACE, WG, NUM_WG)
    return n_blocks


@gluon.jit
def _clear_rows_past_length(v_tile, v_clean, it, valid_rows, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                            NUM_WG: gl.constexpr, WG: gl.constexpr):
    """KEY_LENS: zero the rows at or past ``valid_rows`` of an item's last V tile (``v_tile``, [BLOCK_N, HEAD_DIM] in
    shared memory), so that a NaN or Inf in the cache past the key length cannot reach P V (its probabilities there
    are 0, but 0 * NaN = NaN). The consumer warpgroups share the tile: each rewrites its share of 32-row chunks, then
    all meet at ``v_clean`` (one phase per item, count NUM_WG: none can start the next item's phase before all have
    arrived for this one) before any of them multiplies the tile. Every item, whether its last tile is partial or
    not (so the phases count items): one read and write of a tile per item, against its dozens of key tiles."""
    _zero_rows_past(v_tile, valid_rows, 32, WG, NUM_WG, BLOCK_N)
    fence_async_shared()  # these generic-proxy writes, before the wgmma (async proxy) reads them
    thread_barrier()  # every warp of this warpgroup has written its rows
    if NUM_WG > 1:
        mbarrier.arrive(v_clean.index(0), count=1)
        mbarrier.wait(v_clean.index(0), it & 1)


@gluon.jit
def attn_fwd_hopper_kernel(q_desc, k_desc, v_desc, o_desc, w_desc, lse_ptr, seqlens_q_ptr, page_table, seqlens_k_ptr,
                           qk_scale, seqlen_q, seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles,
                           num_tiles, table_stride, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           HEAD_DIM: gl.constexpr, K_STAGES: gl.constexpr, V_STAGES: gl.constexpr,
                           CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, NUM_WG: gl.constexpr, PAIRED: gl.constexpr,
                           SECURE: gl.constexpr, SUM_MMA: gl.constexpr, CONSUMER_WG_REGS: gl.constexpr,
                           LOADER_WG_REGS: gl.constexpr, TRACE: gl.constexpr, EARLY_LOADS: gl.constexpr = False,
                           STAGGER: gl.constexpr = 0, KEY_LENS: gl.constexpr = False, PAGE_SIZE: gl.constexpr = 0,
                           SANITISE: gl.constexpr = False, SECRET_DIAG: gl.constexpr = False,
                           PDL_WAIT: gl.constexpr = False, V_PREPASS: gl.constexpr = False):
    """Persistent: program i takes scheduling units i, i + grid, ... (a unit = one work item of
    NUM_WG*BLOCK_M query rows of one head, or with PAIRED two causal items of equal total cost), so one
    item's epilogue and the next one's loads overlap instead of costing a launch.

    SECURE (docs/security.md, perf-notes v9-v11): the constant-time mode. K and V
    come sanitised from a pre-pass (non-causal with the key weights ``w_desc``, unused otherwise; see
    _consume_tile), or with SANITISE (causal; perf-notes v34) V as the caller gave it, its padding rows rewritten in
    shared memory by the loader warpgroup from the secret key lengths ``seqlens_k_ptr`` (None otherwise;
    kernels/sm90/secure_pad.py); the true query lengths (``seqlens_q_ptr``, unused otherwise) are read on the device
    and enter only the epilogue's selects. Its waits are retry loops whose trip counts
    follow timing, not data: the mbarrier waits (``SYNCS.PHASECHK.TRANS64.TRYWAIT`` + branch) and the
    register reallocation at partition entry (``USETMAXREG.TRY_ALLOC`` + branch). Gate 2 checks every
    other instruction's count per address (``flashcore audit counters --per-pc``).

    KEY_LENS: ``seqlens_q_ptr`` holds int32 key lengths per sequence (secret with SECURE; see _consume_tile).
    PAGE_SIZE > 0 (with KEY_LENS): K and V are a paged cache, ``[num_pages, Hkv, PAGE_SIZE, D]`` descriptors whose
    box is one page (or one tile of a larger page), read through ``page_table`` (int32 ``[B, table_stride]``
    rows of physical page indices; ``seqlen_k`` is the capacity, the table's width times PAGE_SIZE). Otherwise
    ``page_table`` and ``table_stride`` are None.

    SECRET_DIAG (SECURE, causal with a secret diagonal; CAUSAL is then False: every key tile is visited):
    ``seqlens_k_ptr`` holds the secret key lengths beside the query lengths, and every tile is masked by select
    (_consume_tile).

    ``CONSUMER_WG_REGS`` / ``LOADER_WG_REGS``: the register requests per worker warpgroup (setmaxnreg).

    PDL_WAIT (secure, after a pre-pass; launched as its programmatic dependent, ``launch_pdl``): the program starts
    while the pre-pass runs; the loader requests its first Q tile, then waits for the pre-pass's grid
    (``griddepcontrol.wait``) before its first K/V copy, and nothing else reads what the pre-pass writes.

    V_PREPASS (SECURE with KEY_LENS): ``v_desc`` is the V pre-pass's contiguous copy of the cache ``[B, Hkv, seqlen_k,
    D]`` (also where K is a paged cache), whose rows at or past each secret key length already hold its public pattern
    (``attn_secure_zero_v_padding_kernel``, ``attn_secure_gather_v_padding_kernel``), so the loader is a warp that
    copies, as on the fast path, instead of a warpgroup that clears every V tile in shared memory
    (``pipeline._sanitise_v``); the consumers mask every tile as before.
    """
    _stamp(seqlens_q_ptr, 6, TRACE, 0, NUM_WG, True)
    _stamp(seqlens_q_ptr, 7, TRACE, 0, NUM_WG)
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2 * NUM_WG] + q_desc.block_type.shape, q_desc.layout)  # [Q slot][WG]
    # (a paged cache's descriptors have a box of one page: the slots are whole key tiles either way)
    k_smem = gl.allocate_shared_memory(dtype, [K_STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [V_STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    if SUM_MMA:  # the key weights of each V tile (see _consume_tile)
        w_smem = gl.allocate_shared_memory(dtype, [V_STAGES] + w_desc.block_type.shape, w_desc.layout)
    else:  # unused
        w_smem = v_smem
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    # STAGGER: warpgroup w > 0 starts its first item once warpgroup w - 1 has reached the point STAGGER names
    if STAGGER > 0:
        stagger = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    else:  # unused
        stagger = q_ready
    # KEY_LENS: the consumer warpgroups clear the last V tile's rows past the key length, each its share, and
    # meet here before any of them multiplies it (_clear_rows_past_length)
    if KEY_LENS and not SECURE:
        v_clean = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    else:  # unused (None: an alias of another barrier would be one more value the partitions capture)
        v_clean = None
    # SECURE with KEY_LENS: a V tile's copy lands on v_landed; the loader warpgroup clears its rows past the key length
    # and then arrives on v_ready, which the consumers wait for as always (pipeline._sanitise_v)
    # (SANITISE likewise: the loader warpgroup writes V's padding rows, pipeline._pad_v)
    # (V_PREPASS: V comes clean from the pre-pass, nothing to rewrite)
    LOADER_REWRITES: gl.constexpr = SECURE and ((KEY_LENS and not V_PREPASS) or SANITISE)
    if LOADER_REWRITES:
        v_landed = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    else:  # unused
        v_landed = None
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=NUM_WG)  # one arrival per consumer warpgroup
    for i in gl.static_range(K_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NUM_WG)
    for i in gl.static_range(V_STAGES):
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=NUM_WG)
    if STAGGER > 0:
        for i in gl.static_range(NUM_WG):
            mbarrier.init(stagger.index(i), count=1)
    if KEY_LENS and not SECURE:
        mbarrier.init(v_clean.index(0), count=NUM_WG)
    if LOADER_REWRITES:
        for i in gl.static_range(V_STAGES):
            mbarrier.init(v_landed.index(i), count=1)
    if EARLY_LOADS:
        _issue_first_loads(q_desc, k_desc, v_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, k_ready, v_ready,
                           num_heads, group, num_m_tiles, page_table, table_stride, seqlen_k, BLOCK_M, BLOCK_N, NUM_WG,
                           CAUSAL, PAIRED, SUM_MMA, PAGE_SIZE)
        _stamp(seqlens_q_ptr, 5, TRACE, 0, NUM_WG)

    # Every partition takes what they share as two aggregates (kernels/sm90/partition.py): the runtime values
    # and the compile-time form (the same machine code as spelling out the 42 arguments:
    # tests/test_machine_code.py). The partition list itself stays literal, one per layout: Triton 3.6's
    # warp_specialize needs it so.
    form = Form(BLOCK_M, BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE, SUM_MMA,
                TRACE, EARLY_LOADS, STAGGER, KEY_LENS, PAGE_SIZE, SANITISE, SECRET_DIAG, PDL_WAIT, V_PREPASS)
    shared = Shared(q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty, k_ready,
                    v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q, seqlen_k, num_heads,
                    group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, v_clean, page_table, table_stride,
                    v_landed, seqlens_k_ptr)
    # the loader is a warpgroup where it rewrites tiles: its four warps clear V's rows past the key length (secure,
    # key lengths), or write secure mode's V padding (SANITISE)
    if LOADER_REWRITES:
        if NUM_WG == 1:
            gl.warp_specialize([
                (_consumer, (shared, form, 0)),
                (_loader, (shared, form, 0)),
            ], [4], [LOADER_WG_REGS])
        elif NUM_WG == 3:
            gl.warp_specialize([
                (_consumer, (shared, form, 0)),
                (_consumer, (shared, form, 1)),
                (_consumer, (shared, form, 2)),
                (_loader, (shared, form, 0)),
            ], [4, 4, 4], [CONSUMER_WG_REGS, CONSUMER_WG_REGS, LOADER_WG_REGS])
        else:
            gl.warp_specialize([
                (_consumer, (shared, form, 0)),
                (_consumer, (shared, form, 1)),
                (_loader, (shared, form, 0)),
            ], [4, 4], [CONSUMER_WG_REGS, LOADER_WG_REGS])
    elif NUM_WG == 3:
        gl.warp_specialize([
            (_consumer, (shared, form, 0)),
            (_consumer, (shared, form, 1)),
            (_consumer, (shared, form, 2)),
            (_loader, (shared, form, 0)),
        ], [4, 4, 1], [CONSUMER_WG_REGS, CONSUMER_WG_REGS, LOADER_WG_REGS])
    elif NUM_WG == 2:
        gl.warp_specialize([
            (_consumer, (shared, form, 0)),
            (_consumer, (shared, form, 1)),
            (_loader, (shared, form, 0)),
        ], [4, 1], [CONSUMER_WG_REGS, LOADER_WG_REGS])
    else:  # one consumer warpgroup (64-row items; two programs share an SM)
        gl.warp_specialize([
            (_consumer, (shared, form, 0)),
            (_loader, (shared, form, 0)),
        ], [1], [LOADER_WG_REGS])


CAPABILITIES = Capabilities(
    name="sm90_fwd", module=__name__,
    role="forward, Hopper: warp-specialised (TMA loader warp, wgmma consumer warpgroups), persistent",
    dtypes=("fp16", "bf16"), head_dims=(64, 128), archs=(9,),
    features=("causal", "gqa", "secure", "lse", "secure_secret_diagonal", "key_lens", "paged",
              "secure_key_lens"),
    needs=("tma",),
    secret=("q_desc", "k_desc", "v_desc"), secret_secure=("w_desc", "seqlens_q_ptr", "seqlens_k_ptr"))
