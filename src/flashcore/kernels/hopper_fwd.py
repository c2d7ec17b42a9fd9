"""Hopper (sm_90a) attention forward in Gluon: warp-specialised, TMA-fed, wgmma.

Why a second kernel: the portable Triton kernel (``attention_fwd.py``) runs softmax and the two
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

# Register budgets per partition (setmaxnreg): the loader needs almost nothing, the consumers get
# the rest. 12 warps x MAXNREG must fit the 64K-register file.
LOADER_REGS = 24
CONSUMER_REGS = 240
MAXNREG = 168
# Three consumer warpgroups (16 warps with the padded loader group): 3 x 128 x 160 + 128 x 24 fits.
CONSUMER_REGS_3WG = 160
MAXNREG_3WG = 128
# One consumer warpgroup (8 warps with the padded loader group) at 128 registers: two programs fit an
# SM's 64K registers; the loader gives 104 of its 128 back, which the consumer takes (128 + 104 = 232).
CONSUMER_REGS_1WG = 232
MAXNREG_1WG = 128
# consumer warpgroups -> (worker consumer registers, launch register cap); programs resident per SM
REGISTERS = {1: (CONSUMER_REGS_1WG, MAXNREG_1WG), 2: (CONSUMER_REGS, MAXNREG), 3: (CONSUMER_REGS_3WG, MAXNREG_3WG)}
PROGRAMS_PER_SM = {1: 2, 2: 1, 3: 1}


# Debug timeline (``GluonLaunch.trace``, scripts/kernel_timeline.py, perf-notes v15): with TRACE each consumer
# warpgroup writes SM clock readings at fixed points into its own row of TRACE_SLOTS int64, in place of the
# secure-only lengths pointer. Row (program * NUM_WG + warpgroup): slot 0/1 the consumer's first/last clock,
# 2/3 the global timer (ns) at the same points (to convert clocks), 4 the loader's first clock, 5 the clock
# when the first Q load was issued, 6/7 the global timer and the clock at kernel entry (4-7: in the row of
# warpgroup 0); from TRACE_ITEM0 on, TRACE_ITEM_SLOTS per work item (up to TRACE_MAX_ITEMS items):
# +0 Q ready, +1 S_0 ready, +2j S_j ready and +2j+1 P_(j-1) V_(j-1) done (1 <= j < TRACE_MAX_STEPS),
# +20 O ready, +21 O store issued, +22 last P V done, +23 item done. Off (the default), no code is emitted.
TRACE_SLOTS = 256
TRACE_ITEM0 = 8
TRACE_ITEM_SLOTS = 24
TRACE_MAX_STEPS = 10
TRACE_MAX_ITEMS = (TRACE_SLOTS - TRACE_ITEM0) // TRACE_ITEM_SLOTS
_TRACE_SLOTS = gl.constexpr(TRACE_SLOTS)
_TRACE_ITEM0 = gl.constexpr(TRACE_ITEM0)
_TRACE_ITEM_SLOTS = gl.constexpr(TRACE_ITEM_SLOTS)
_TRACE_MAX_STEPS = gl.constexpr(TRACE_MAX_STEPS)


@gluon.jit
def _stamp(trace_ptr, slot, TRACE: gl.constexpr, WG: gl.constexpr, NUM_WG: gl.constexpr, GLOBAL: gl.constexpr = False):
    if TRACE:
        if GLOBAL:
            t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], gl.int64, False, 1)
        else:
            t = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], gl.int64, False, 1)
        gl.store(trace_ptr + (gl.program_id(0) * NUM_WG + WG) * _TRACE_SLOTS + slot, t, mask=slot < _TRACE_SLOTS)


@gluon.jit
def _stamp_step(trace_ptr, tb, j, odd, TRACE: gl.constexpr, WG: gl.constexpr, NUM_WG: gl.constexpr):
    if TRACE:
        if j < _TRACE_MAX_STEPS:
            _stamp(trace_ptr, tb + 2 * j + odd, TRACE, WG, NUM_WG)


@gluon.jit
def _kv_blocks(pid_m, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
               NUM_WG: gl.constexpr):
    """K/V tiles the item's NUM_WG*BLOCK_M query rows visit (at least 1: an all-masked tile yields zeros)."""
    if CAUSAL:
        # bottom-right alignment: row i sees keys j <= i + Sk - Sq
        hi = gl.minimum((pid_m + 1) * NUM_WG * BLOCK_M + seqlen_k - seqlen_q, seqlen_k)
    else:
        hi = seqlen_k
    return gl.maximum(gl.cdiv(hi, BLOCK_N), 1)


@gluon.jit
def _row_tile(r, HALF: gl.constexpr, num_m_tiles, CAUSAL: gl.constexpr, PAIRED: gl.constexpr):
    """(row-tile index, valid) of work item ``HALF`` of the ``r``-th scheduling unit of a head."""
    if PAIRED:
        heavy = num_m_tiles - 1 - r
        if HALF == 0:
            return heavy, True
        return r, r != heavy
    if CAUSAL:
        return num_m_tiles - 1 - r, True
    return r, True


@gluon.jit
def _units_per_head(num_m_tiles, PAIRED: gl.constexpr):
    if PAIRED:
        return (num_m_tiles + 1) // 2
    return num_m_tiles


@gluon.jit
def _tile_coords(unit, HALF: gl.constexpr, num_m_tiles, CAUSAL: gl.constexpr, PAIRED: gl.constexpr):
    """(row-tile index, batch*head, valid) of work item ``HALF`` of scheduling unit ``unit``.
    Consecutive units share a head (K/V stay in L2). Causal row tiles run last-first, so the heaviest
    (the most keys) go first; PAIRED (persistent causal) units are two row tiles of a head, the i-th
    heaviest with the i-th lightest, so every unit costs the same number of key tiles (+-1) and a
    static round-robin over units stays balanced. An odd tile count leaves the middle tile unpaired."""
    per_head = _units_per_head(num_m_tiles, PAIRED)
    pid_m, valid = _row_tile(unit % per_head, HALF, num_m_tiles, CAUSAL, PAIRED)
    return pid_m, unit // per_head, valid


@gluon.jit
def _loader(q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty, k_ready,
            v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q, seqlen_k, num_heads, group,
            lse_stride_b, lse_stride_h, num_m_tiles, num_tiles,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, K_STAGES: gl.constexpr,
            V_STAGES: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, NUM_WG: gl.constexpr,
            PAIRED: gl.constexpr, SECURE: gl.constexpr, SUM_MMA: gl.constexpr, TRACE: gl.constexpr,
            EARLY_LOADS: gl.constexpr, STAGGER: gl.constexpr, WG: gl.constexpr):
    kc = 0  # K/V tiles loaded so far, over all work items: ring slot and phase
    it = 0  # work items so far: Q slot and phase
    _stamp(seqlens_q_ptr, 4, TRACE, WG, NUM_WG)
    for unit in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        for half in gl.static_range(2 if PAIRED else 1):
            pid_m, bh, valid = _tile_coords(unit, half, num_m_tiles, CAUSAL, PAIRED)
            if valid:
                n = _load_item(pid_m, bh, kc, it, q_desc, k_desc, v_desc, w_desc, q_smem, k_smem, v_smem, w_smem,
                               q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, seqlen_q, seqlen_k, num_heads,
                               group, BLOCK_M, BLOCK_N, K_STAGES, V_STAGES, CAUSAL, NUM_WG, SUM_MMA,
                               EARLY_LOADS, seqlens_q_ptr, TRACE)
                kc += n
                it += 1


@gluon.jit
def _head_coords(bh, num_heads, group):
    """(batch, query head, K/V head) of a flat batch*head index."""
    b = bh // num_heads
    h = bh % num_heads
    return b, h, h // group


@gluon.jit
def _issue_q(q_desc, q_smem, q_ready, qs, b, h, m0, BLOCK_M: gl.constexpr, NUM_WG: gl.constexpr):
    """One work item's Q tiles (one per consumer warpgroup) into Q slot ``qs``."""
    mbarrier.expect(q_ready.index(qs), NUM_WG * q_desc.block_type.nbytes)
    for w in gl.static_range(NUM_WG):
        tma.async_copy_global_to_shared(q_desc, [b, h, m0 + w * BLOCK_M, 0], q_ready.index(qs),
                                        q_smem.index(NUM_WG * qs + w))


@gluon.jit
def _issue_k(k_desc, k_smem, k_ready, ks, b, hk, j, BLOCK_N: gl.constexpr):
    mbarrier.expect(k_ready.index(ks), k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [b, hk, j * BLOCK_N, 0], k_ready.index(ks), k_smem.index(ks))


@gluon.jit
def _issue_v(v_desc, w_desc, v_smem, w_smem, v_ready, vs, b, hk, j, BLOCK_N: gl.constexpr, SUM_MMA: gl.constexpr):
    """V tile ``j`` (with SUM_MMA also its key weights) into V slot ``vs``."""
    if SUM_MMA:
        mbarrier.expect(v_ready.index(vs), v_desc.block_type.nbytes + w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [b, 0, j * BLOCK_N], v_ready.index(vs), w_smem.index(vs))
    else:
        mbarrier.expect(v_ready.index(vs), v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(v_desc, [b, hk, j * BLOCK_N, 0], v_ready.index(vs), v_smem.index(vs))


@gluon.jit
def _load_q(q_desc, q_smem, q_ready, q_empty, it, b, h, m0, BLOCK_M: gl.constexpr, NUM_WG: gl.constexpr):
    """Item ``it``'s Q, once its slot is free. Q is double-buffered: the next item's Q arrives while the
    consumers finish this one."""
    qs = it % 2
    mbarrier.wait(q_empty.index(qs), ((it // 2) & 1) ^ 1)
    _issue_q(q_desc, q_smem, q_ready, qs, b, h, m0, BLOCK_M, NUM_WG)


@gluon.jit
def _load_k(k_desc, k_smem, k_ready, k_empty, c, b, hk, j, BLOCK_N: gl.constexpr, K_STAGES: gl.constexpr):
    """The program's ``c``-th K tile (tile ``j`` of its item), once its ring slot is free."""
    ks = c % K_STAGES
    mbarrier.wait(k_empty.index(ks), ((c // K_STAGES) & 1) ^ 1)
    _issue_k(k_desc, k_smem, k_ready, ks, b, hk, j, BLOCK_N)


@gluon.jit
def _load_v(v_desc, w_desc, v_smem, w_smem, v_ready, v_empty, c, b, hk, j, BLOCK_N: gl.constexpr,
            V_STAGES: gl.constexpr, SUM_MMA: gl.constexpr):
    vs = c % V_STAGES
    mbarrier.wait(v_empty.index(vs), ((c // V_STAGES) & 1) ^ 1)
    _issue_v(v_desc, w_desc, v_smem, w_smem, v_ready, vs, b, hk, j, BLOCK_N, SUM_MMA)


@gluon.jit
def _issue_first_loads(q_desc, k_desc, v_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, k_ready, v_ready,
                       num_heads, group, num_m_tiles, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       NUM_WG: gl.constexpr, CAUSAL: gl.constexpr, PAIRED: gl.constexpr, SUM_MMA: gl.constexpr):
    """EARLY_LOADS: the program's first work item's Q, K_0 and V_0, requested at kernel entry by the
    default warps instead of by the loader once the partitions have started (~1.1 us later: perf-notes
    v16). The first item is unit program_id's half 0, which always exists and has >= 1 key tile; the
    loader skips exactly these loads (Q of item 0, K/V tile 0 of the program)."""
    pid_m, bh, valid = _tile_coords(gl.program_id(0), 0, num_m_tiles, CAUSAL, PAIRED)
    b, h, hk = _head_coords(bh, num_heads, group)
    fence_async_shared()  # the barriers' initialisation, before the copy engine signals them
    _issue_q(q_desc, q_smem, q_ready, 0, b, h, pid_m * NUM_WG * BLOCK_M, BLOCK_M, NUM_WG)
    _issue_k(k_desc, k_smem, k_ready, 0, b, hk, 0, BLOCK_N)
    _issue_v(v_desc, w_desc, v_smem, w_smem, v_ready, 0, b, hk, 0, BLOCK_N, SUM_MMA)


@gluon.jit
def _load_item(pid_m, bh, kc, it, q_desc, k_desc, v_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
               k_ready, v_ready, k_empty, v_empty, seqlen_q, seqlen_k, num_heads, group, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
               NUM_WG: gl.constexpr, SUM_MMA: gl.constexpr, EARLY_LOADS: gl.constexpr, trace_ptr,
               TRACE: gl.constexpr):
    """The loader's side of one work item: its Q tiles, then its K/V tiles through the rings (with
    SUM_MMA each V tile brings its key weights along). Returns the number of K/V tiles loaded. With
    EARLY_LOADS the program's first Q and K/V tile 0 were requested at kernel entry (_issue_first_loads)."""
    b, h, hk = _head_coords(bh, num_heads, group)
    m0 = pid_m * NUM_WG * BLOCK_M
    if EARLY_LOADS:  # (constexpr branches: without EARLY_LOADS the code is the form the secure gate passed)
        if it > 0:
            _load_q(q_desc, q_smem, q_ready, q_empty, it, b, h, m0, BLOCK_M, NUM_WG)
    else:
        _load_q(q_desc, q_smem, q_ready, q_empty, it, b, h, m0, BLOCK_M, NUM_WG)
        if it == 0:
            _stamp(trace_ptr, 5, TRACE, 0, NUM_WG)

    n_blocks = _kv_blocks(pid_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL, NUM_WG)
    for j in range(n_blocks):
        # K and V have separate rings: K_j is free once both S_j = Q K_j^T are done (early in step
        # j), V_j only after both P_j V_j (step j+1), so K can run further ahead.
        c = kc + j
        if EARLY_LOADS:
            if c > 0:
                _load_k(k_desc, k_smem, k_ready, k_empty, c, b, hk, j, BLOCK_N, K_STAGES)
        else:
            _load_k(k_desc, k_smem, k_ready, k_empty, c, b, hk, j, BLOCK_N, K_STAGES)
        if NUM_WG == 1:
            if c == 0:
                # the program's first tiles: with two programs per SM, letting Q and K_0 land before the rest of
                # the rings are requested starts the first S earlier (perf-notes v15.3: +1-2% at 1-2 x 16 x 1024 x 64)
                mbarrier.wait(k_ready.index(0), 0)
        if EARLY_LOADS:
            if c > 0:
                _load_v(v_desc, w_desc, v_smem, w_smem, v_ready, v_empty, c, b, hk, j, BLOCK_N, V_STAGES, SUM_MMA)
        else:
            _load_v(v_desc, w_desc, v_smem, w_smem, v_ready, v_empty, c, b, hk, j, BLOCK_N, V_STAGES, SUM_MMA)
    return n_blocks


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


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty, k_ready,
              v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q, seqlen_k, num_heads,
              group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, K_STAGES: gl.constexpr,
              V_STAGES: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, NUM_WG: gl.constexpr,
              PAIRED: gl.constexpr, SECURE: gl.constexpr, SUM_MMA: gl.constexpr, TRACE: gl.constexpr,
              EARLY_LOADS: gl.constexpr, STAGGER: gl.constexpr, WG: gl.constexpr):
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
                                  TRACE, STAGGER, WG)
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
                  STAGGER: gl.constexpr, WG: gl.constexpr):
    """One work item for this warpgroup: BLOCK_M query rows against all their key tiles. ``kc`` is the
    ring position of the item's first K/V tile, ``it`` the item's index (Q slot and phase). Returns the
    number of K/V tiles it consumed (where the next item's tiles start in the rings).

    SECURE: every trip count and address above is a function of the public shape (the padded lengths),
    and no key is masked by a secret length. Non-causal, the pre-pass (secure_prepass.py,
    ``attn_secure_sanitize_kv_kernel``) made every padding key a copy of the first key and V's padding
    rows cancel in pairs, so the unmasked row max is the true one and padding adds nothing to P V; the row sum is the
    MMA ``P W`` against the pre-pass's 0/1 key weights (SUM_MMA), which replaces the per-score adds.
    Causal runs here only in the self-attention form (len_q == len_k, Sq == Sk, public diagonal), where a
    row i < len sees keys j <= i < len only. Either way the loop is the fast kernel's, and the true query
    length enters only the epilogue's selects: rows at or past it output zeros."""
    dtype: gl.constexpr = q_desc.dtype
    W_ROWS: gl.constexpr = 8  # the narrowest wgmma (N = 8); = secure_prepass.W_ROWS, the host's key-weight rows
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, W_ROWS, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    m_wg = pid_m * NUM_WG * BLOCK_M + WG * BLOCK_M
    row = m_wg + gl.arange(0, BLOCK_M, layout=row_layout)
    diag = seqlen_k - seqlen_q
    if SECURE:  # secret: clamped arithmetically into [0, padded length]
        len_q = gl.minimum(gl.maximum(gl.load(seqlens_q_ptr + b), 0), seqlen_q)

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
    if n_full > 0:
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
        if j < n_full:
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
    if SECURE:  # rows past the true length output exact zeros, whatever their padding held
        row_o = m_wg + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        o = gl.where(gl.expand_dims(row_o < len_q, 1), o, 0.0)
    if RETURN_LSE:
        lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
        if SECURE:
            lse = gl.where(row < len_q, lse, float("-inf"))
        gl.store(lse_ptr + b * lse_stride_b + h * lse_stride_h + row, lse, mask=row < seqlen_q)
    # Q is dead: its slot stages the output tile for the TMA store (which clips rows >= Sq). On the fast path the
    # store is not waited for here: the next item waits for it under its first MMA and then gives the slot back
    # to the loader (the wait cost ~0.28 us per item at the boundary; perf-notes v15.2), the last one at exit.
    _stamp(seqlens_q_ptr, tb + 20, TRACE, WG, NUM_WG)
    q_slot.reshape([BLOCK_M, HEAD_DIM]).store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, m_wg, 0], q_slot)
    _stamp(seqlens_q_ptr, tb + 21, TRACE, WG, NUM_WG)
    if SECURE:  # (secure: as the gate has passed it, waited for here; see _consumer)
        tma.store_wait(0)
        mbarrier.arrive(q_empty.index(qs), count=1)
    _stamp(seqlens_q_ptr, tb + 23, TRACE, WG, NUM_WG)
    return n_blocks


@gluon.jit
def attn_fwd_hopper_kernel(q_desc, k_desc, v_desc, o_desc, w_desc, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q,
                           seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles,
                           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                           K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                           RETURN_LSE: gl.constexpr, NUM_WG: gl.constexpr, PAIRED: gl.constexpr, SECURE: gl.constexpr,
                           SUM_MMA: gl.constexpr, CONSUMER_WG_REGS: gl.constexpr, LOADER_WG_REGS: gl.constexpr,
                           TRACE: gl.constexpr, EARLY_LOADS: gl.constexpr = False, STAGGER: gl.constexpr = 0):
    """Persistent: program i takes scheduling units i, i + grid, ... (a unit = one work item of
    NUM_WG*BLOCK_M query rows of one head, or with PAIRED two causal items of equal total cost), so one
    item's epilogue and the next one's loads overlap instead of costing a launch.

    SECURE (docs/security.md, perf-notes v9-v11): the constant-time mode. K and V
    come sanitised from a pre-pass (non-causal with the key weights ``w_desc``, unused otherwise; see
    _consume_tile); the true query lengths (``seqlens_q_ptr``, unused otherwise) are read on the device
    and enter only the epilogue's selects. Its waits are retry loops whose trip counts
    follow timing, not data: the mbarrier waits (``SYNCS.PHASECHK.TRANS64.TRYWAIT`` + branch) and the
    register reallocation at partition entry (``USETMAXREG.TRY_ALLOC`` + branch). Gate 2 checks every
    other instruction's count per address (``flashcore audit counters --per-pc``).

    ``CONSUMER_WG_REGS`` / ``LOADER_WG_REGS``: the register requests per worker warpgroup (setmaxnreg).
    """
    _stamp(seqlens_q_ptr, 6, TRACE, 0, NUM_WG, True)
    _stamp(seqlens_q_ptr, 7, TRACE, 0, NUM_WG)
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2 * NUM_WG] + q_desc.block_type.shape, q_desc.layout)  # [Q slot][WG]
    k_smem = gl.allocate_shared_memory(dtype, [K_STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [V_STAGES] + v_desc.block_type.shape, v_desc.layout)
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
    if EARLY_LOADS:
        _issue_first_loads(q_desc, k_desc, v_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, k_ready, v_ready,
                           num_heads, group, num_m_tiles, BLOCK_M, BLOCK_N, NUM_WG, CAUSAL, PAIRED, SUM_MMA)
        _stamp(seqlens_q_ptr, 5, TRACE, 0, NUM_WG)

    # (constexprs are spelled out in each tuple: a tuple held in a variable turns them into tensors, and
    # so does a runtime tuple concatenated with literal constexprs (Triton 3.6: "'int' object has no
    # attribute '_flatten_ir'"); so is the partition list, which is why each layout is one literal list)
    if NUM_WG == 3:
        gl.warp_specialize([
            (_consumer, (q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
                         k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q,
                         seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, BLOCK_M,
                         BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE, SUM_MMA,
                         TRACE, EARLY_LOADS, STAGGER, 0)),
            (_consumer, (q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
                         k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q,
                         seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, BLOCK_M,
                         BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE, SUM_MMA,
                         TRACE, EARLY_LOADS, STAGGER, 1)),
            (_consumer, (q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
                         k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q,
                         seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, BLOCK_M,
                         BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE, SUM_MMA,
                         TRACE, EARLY_LOADS, STAGGER, 2)),
            (_loader, (q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
                       k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q,
                       seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, BLOCK_M, BLOCK_N,
                       HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE, SUM_MMA, TRACE,
                       EARLY_LOADS, STAGGER, 0)),
        ], [4, 4, 1], [CONSUMER_WG_REGS, CONSUMER_WG_REGS, LOADER_WG_REGS])
    elif NUM_WG == 2:
        gl.warp_specialize([
            (_consumer, (q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
                         k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q,
                         seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, BLOCK_M,
                         BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE, SUM_MMA,
                         TRACE, EARLY_LOADS, STAGGER, 0)),
            (_consumer, (q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
                         k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q,
                         seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, BLOCK_M,
                         BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE, SUM_MMA,
                         TRACE, EARLY_LOADS, STAGGER, 1)),
            (_loader, (q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
                       k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q,
                       seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, BLOCK_M, BLOCK_N,
                       HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE, SUM_MMA, TRACE,
                       EARLY_LOADS, STAGGER, 0)),
        ], [4, 1], [CONSUMER_WG_REGS, LOADER_WG_REGS])
    else:  # one consumer warpgroup (64-row items; two programs share an SM)
        gl.warp_specialize([
            (_consumer, (q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
                         k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q,
                         seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, BLOCK_M,
                         BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE, SUM_MMA,
                         TRACE, EARLY_LOADS, STAGGER, 0)),
            (_loader, (q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
                       k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q,
                       seqlen_k, num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, BLOCK_M, BLOCK_N,
                       HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE, SUM_MMA, TRACE,
                       EARLY_LOADS, STAGGER, 0)),
        ], [1], [LOADER_WG_REGS])


# ---------------------------------------------------------------------------------------------
# Host side: descriptors are rebuilt on every call (they hold the base pointer); everything else
# is planned once per input signature.

def eligible(q, k, v, o, head_dim: int) -> bool:
    """What this kernel supports (besides the caller's checks: sm_90, fast path, dense): 16-bit
    dtypes, D in {64, 128}, and tensors the copy engine can address (16-byte aligned base and
    outer strides, unit last stride)."""
    import torch

    if q.dtype not in (torch.float16, torch.bfloat16) or head_dim not in (64, 128):
        return False
    for t in (q, k, v, o):
        es = t.element_size()
        if t.dim() != 4 or t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * es) % 16 for s in t.stride()[:-1]):
            return False
    return True


RING_BYTES = 200 * 1024  # of the 227 KiB an H100 block may use; the rest is headroom for barriers
# One consumer warpgroup: two programs share an SM (228 KiB, 1 KiB of it reserved per block), each with
# Q and its rings in at most this much (barriers take ~130 bytes more).
RING_BYTES_HALF_SM = 112 * 1024


def ring_limit(block_m: int) -> int:
    return RING_BYTES_HALF_SM if block_m == 64 else RING_BYTES


def smem_bytes(k_stages: int, v_stages_: int, block_m: int, block_n: int, head_dim: int) -> int:
    """Shared memory of Q (double-buffered: two work items of ``block_m`` rows) and the K/V rings,
    16-bit tiles; must stay within RING_BYTES."""
    return (2 * block_m + (k_stages + v_stages_) * block_n) * head_dim * 2


def v_stages(k_stages: int, block_m: int, block_n: int, head_dim: int) -> int:
    """V ring depth: as deep as the K ring if shared memory allows, else the deepest that fits (at
    least 1)."""
    limit = ring_limit(block_m)
    fits = [v for v in range(1, k_stages + 1) if smem_bytes(k_stages, v, block_m, block_n, head_dim) <= limit]
    return max(fits) if fits else 1


def _sm_count(device) -> int:
    """SMs of the device (an H100 SXM's 132 for CPU tensors: the audit compiles without a GPU)."""
    import torch

    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def _unwrap_tensordesc_launcher(compiled):
    """(raw launcher, per-descriptor metadata) behind Triton's descriptor-expanding wrapper
    (``triton.backends.nvidia.driver.wrap_handle_tensordesc``), or None where this Triton build does
    not have that shape; the caller then keeps Triton's own path. Reaches into Triton 3.6's launcher
    on purpose: the wrapper re-encodes every TMA descriptor on every launch (``cuTensorMapEncodeTiled``
    four times, ~10 us of host time per call), and a serving loop calls with the same buffers."""
    run = getattr(compiled, "run", None)
    inner = getattr(run, "launch", None)
    code, cells = getattr(inner, "__code__", None), getattr(inner, "__closure__", None)
    if code is None or not cells or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    try:
        free = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
    except ValueError:  # an empty cell
        return None
    launcher, meta, idx = free.get("launcher"), free.get("tensordesc_meta"), free.get("tensordesc_indices")
    if not callable(launcher) or meta is None or len(meta) not in (4, GluonLaunch.DESC_ARGS):
        return None
    if idx != set(range(len(meta))):
        return None
    return launcher, list(meta)


class GluonLaunch:
    """A planned launch of :func:`attn_fwd_hopper_kernel`; ``run`` takes (q, k, v, o, lse, ...)
    in [B, H, S, D] views with the planned shapes/strides and builds the four TMA descriptors (five in
    secure non-causal form: also the pre-pass's key weights, ``[B, 8, w_len]``).

    Host cost: the descriptors depend on the plan (fixed) and the four data pointers, so once the
    kernel is compiled the encoded descriptors are kept per pointer set (``ENCODED_SETS`` of them, the
    oldest dropped first) and the launch goes straight to Triton's compiled launcher. A pointer set
    seen before costs a dict lookup instead of four descriptor encodings."""
    __slots__ = ("step", "geom", "fast", "encoded", "key_weights_shape", "ones", "trace_slots")
    ENCODED_SETS = 16
    DESC_ARGS = 5  # the kernel's descriptor arguments: q, k, v, o and the key weights (None where unused)
    # Causal: persistent over pairs of row tiles (True), or one program per row tile (False)
    causal_pairs = True
    # Fast path: row sums by MMA against a ones tile (True) or by adds (False); see _consume_tile
    fast_sum_mma = False
    # Debug: the timeline trace (TRACE above; fast path only: the buffer takes the secure lengths' argument)
    trace = False
    # Fast path: the first work item's Q, K_0 and V_0 requested at kernel entry (EARLY_LOADS above)
    early_loads = True
    # Fast path, D=64: the consumer warpgroups' first items start staggered (0: off; STAGGER above). At D=128 the
    # same switch measured -1..+2% (noise; perf-notes v16), so it stays off there
    stagger = 1

    def __init__(self, q, k, v, o, lse, *, scale: float, causal: bool, seqlen_q: int, seqlen_k: int,
                 batch: int, num_heads_q: int, num_heads_kv: int, lse_strides, cfg, secure: bool = False,
                 sum_mma: bool | None = None):
        from . import LOG2E, _Step, triton_cdiv

        D = q.shape[-1]
        import torch

        v_depth = v_stages(cfg.num_stages, cfg.block_m, cfg.block_n, D)
        ring = smem_bytes(cfg.num_stages, v_depth, cfg.block_m, cfg.block_n, D)
        if (cfg.block_m not in (64, 128, 192) or (cfg.block_m in (64, 192) and D != 64) or cfg.block_n not in (64, 128)
                or cfg.num_stages < 1 or ring > ring_limit(cfg.block_m)):
            raise ValueError(f"gluon_ws config {cfg} unsupported: block_m must be 128 (two 64-row warpgroups) or, "
                             f"at D=64, 64 (one) or 192 (three), block_n 64 or 128, and the K/V rings must fit "
                             f"{ring_limit(cfg.block_m)} bytes of shared memory")
        num_wg = cfg.block_m // 64

        gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
        bm, bn = 64, cfg.block_n
        lay_m = gl.NVMMASharedLayout.get_default_for([1, 1, bm, D], gdt)
        lay_n = gl.NVMMASharedLayout.get_default_for([1, 1, bn, D], gdt)
        self.geom = tuple((list(t.shape), list(t.stride()), [1, 1, rows, D], lay)
                          for t, rows, lay in ((q, bm, lay_m), (k, bn, lay_n), (v, bn, lay_n), (o, bm, lay_m)))
        # the row sums by MMA against key weights: the secure pre-pass's (non-causal: no key mask), or
        # where asked for on the fast path, all ones (masked probabilities are zero there)
        if sum_mma is None:
            sum_mma = (secure and not causal) or (not secure and self.fast_sum_mma)
        sum_mma = bool(sum_mma)
        self.key_weights_shape, self.ones = None, None
        if sum_mma:
            from .secure_prepass import W_ROWS, key_weights_shape

            ws = key_weights_shape(batch, seqlen_k)
            lay_w = gl.NVMMASharedLayout.get_default_for([1, W_ROWS, bn], gdt)
            self.geom += ((list(ws), [ws[1] * ws[2], ws[2], 1], [1, W_ROWS, bn], lay_w), )
            self.key_weights_shape = ws
        num_m_tiles = triton_cdiv(seqlen_q, cfg.block_m)
        num_tiles = num_m_tiles * batch * num_heads_q
        # Persistent: one program per SM (one fits per SM) loops over scheduling units. Non-causal, a
        # unit is one work item (all cost the same). Causal items range from 1 to n key tiles, and a
        # static round-robin over them left SMs idle (4x32x4096x128: 1067 vs 1004 us non-persistent),
        # so a causal unit pairs a heavy row tile with its light mirror (causal_pairs); without
        # pairing each causal item is its own program and the hardware balances them.
        # (one row tile per head has nothing to pair with; Triton also specialises num_m_tiles == 1 to a
        # constant, which folds the pairing arithmetic into a branch its lowering rejects)
        paired = bool(causal) and self.causal_pairs and num_m_tiles > 1
        units = batch * num_heads_q * -(-num_m_tiles // 2) if paired else num_tiles
        grid = (num_tiles if causal and not paired else min(units, PROGRAMS_PER_SM[num_wg] * _sm_count(q.device)), 1)
        dummy = lse if lse is not None else q  # the lengths pointer is read only in secure mode
        w = torch.empty(self.key_weights_shape, dtype=q.dtype) if self.key_weights_shape else None
        args = [*self._descs(q, k, v, o, w), dummy, dummy, scale * LOG2E, seqlen_q, seqlen_k,
                num_heads_q, num_heads_q // num_heads_kv, *lse_strides, num_m_tiles, units]
        constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, K_STAGES=cfg.num_stages,
                          V_STAGES=v_depth, CAUSAL=bool(causal),
                          RETURN_LSE=lse is not None, NUM_WG=num_wg, PAIRED=paired)
        consumer_regs, maxnreg = REGISTERS[num_wg]
        constexprs.update(SECURE=bool(secure), SUM_MMA=sum_mma, CONSUMER_WG_REGS=consumer_regs,
                          LOADER_WG_REGS=LOADER_REGS, TRACE=bool(self.trace) and not secure,
                          EARLY_LOADS=bool(self.early_loads) and not secure,
                          STAGGER=0 if secure or D != 64 else int(self.stagger))
        self.step = _Step(attn_fwd_hopper_kernel, grid, args, 7, constexprs, cfg.num_warps, 1,
                          options=dict(maxnreg=maxnreg))
        self.trace_slots = grid[0] * num_wg * TRACE_SLOTS if constexprs["TRACE"] else 0
        self.fast = None  # (raw launcher, descriptor metadata) once compiled; False: not available
        self.encoded = {}

    def _descs(self, q, k, v, o, w=None):
        """The kernel's five descriptor arguments for these tensors (``w_desc`` None where the plan has no
        key weights). The plan validated shapes, strides and alignment (the plan key includes pointer
        alignment), so this skips the dataclass's per-call validation."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        descs = []
        for t, (shape, strides, block, layout) in zip((q, k, v, o, w), self.geom):
            d = object.__new__(TensorDescriptor)
            d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding = t, shape, strides, block, layout, "zero"
            descs.append(d)
        return descs + [None] * (self.DESC_ARGS - len(descs))

    def run(self, ptrs, device, key_weights=None) -> None:
        """``ptrs``: q, k, v, o, lse, seqlens_q, ... (unused ones: any tensor); ``key_weights``: the
        pre-pass's, where the plan has them (secure, non-causal)."""
        q, k, v, o, lse, sq = ptrs[:6]
        if self.trace_slots:
            self._check_trace(q, sq)
        w = key_weights
        if w is None and self.key_weights_shape is not None:
            if self.step.constexprs["SECURE"]:
                raise ValueError("the secure Gluon launch needs the pre-pass's key weights (key_weights=)")
            if self.ones is None or self.ones.device != q.device:
                import torch

                self.ones = torch.ones(self.key_weights_shape, dtype=q.dtype, device=q.device)
            w = self.ones
        # (imported here: as module globals of this file these names broke the Gluon kernel's
        # compilation under Triton 3.6, a CompilationError in warp_specialize; cause not traced)
        from . import _current_stream, _launch_hooks_active

        fast, step = self.fast, self.step
        # Triton's own path: until compiled, where its launcher has another shape, and whenever a
        # profiler's hooks want their launch metadata
        if not fast or _launch_hooks_active():
            step.run((*self._descs(q, k, v, o, w), lse, sq), device)
            if fast is None and step.compiled is not None:
                self.fast = _unwrap_tensordesc_launcher(step.compiled) or False
            return
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), w.data_ptr() if w is not None else 0)
        enc = self.encoded.get(key)
        if enc is None:
            enc = self._encode((q, k, v, o, w), fast[1])
            if len(self.encoded) >= self.ENCODED_SETS:
                del self.encoded[next(iter(self.encoded))]
            self.encoded[key] = enc
        c, grid = step.compiled, step.grid
        fast[0](grid[0], grid[1], 1, _current_stream(device), c.function, c.run.launch_cooperative_grid,
                c.run.launch_pdl, None, None, c.packed_metadata, None, None, None, *enc, lse, sq, *step.scalars,
                *step.tail)

    def _check_trace(self, q, trace) -> None:
        """A traced launch writes TRACE_SLOTS int64 per consumer warpgroup through the lengths argument: refuse
        anything else there (a dummy tensor would be overwritten)."""
        import torch

        if not (isinstance(trace, torch.Tensor) and trace.dtype == torch.int64 and trace.is_contiguous()
                and trace.numel() >= self.trace_slots and trace.device == q.device):
            raise ValueError(f"a traced Gluon launch takes its trace buffer (int64, contiguous, >= {self.trace_slots} "
                             f"elements, on {q.device}) in place of the lengths argument; see scripts/kernel_timeline.py")

    def _encode(self, tensors, meta) -> tuple:
        """The launcher's arguments for the descriptors (each: encoded CUtensorMap, shape, strides; an
        absent ``w_desc`` stays None), as Triton's wrapper would build them."""
        from triton.backends.nvidia.driver import make_tensordesc_arg

        out = []
        for d, m in zip(self._descs(*tensors), meta):
            out.extend(make_tensordesc_arg(d, m))
        return tuple(out) + (None, ) * (self.DESC_ARGS - len(meta))
