"""Hopper (sm_90a) attention backward, the dK/dV kernel, in Gluon: warp-specialised, TMA-fed, wgmma; with
``FUSED_DQ`` it adds dQ too (five products per tile pair, the FA3 form).

Why a second dK/dV kernel: the portable Triton one (``kernels/triton/bwd.py``) holds dK and dV of a 128-key tile
at 8 warps only by spilling and issues its loads between products (perf-notes v19). Here a program holds
``64 * NUM_WG`` keys of one K/V head and walks the query tiles that see them, for every query head of its GQA group
(no cross-program reduction, so dK/dV are deterministic). It is split into partitions, as the forward kernel is:

* a 1-warp **loader** copies each consumer's K and V rows once, then streams every step's Q and dO tiles and their
  rows of the pre-pass's lse2 and delta through a ring of ``STAGES`` slots (TMA; a slot is refilled once every
  consumer has released it);
* ``NUM_WG`` 4-warp **consumers**, each owning 64 key rows (the M of every product here), per step:
  ``S^T = K Q^T`` and ``dP^T = V dO^T`` issued together; ``P^T = exp2(S^T * scale * log2e - lse2)``, masked by the
  bottom-right causal diagonal where the tile straddles it; ``dV += P^T dO`` runs while
  ``dS^T = P^T (dP^T - delta)`` is computed; then ``dK += dS^T Q``. P^T and dS^T are the left operands of those
  two products: from registers, or stored to shared memory first (``OPERANDS_SMEM``; faster with two consumer
  warpgroups at D=128, slower with one at D=64, perf-notes v33). The dV and dK products are left in flight into
  the next step and waited for under its ``S^T``; only then are their operands (and the slot) released.

dQ: without ``FUSED_DQ`` the Triton dQ kernel runs after this one (deterministic; seven products per tile pair in
all). With it (the planner's D=128 form), every consumer also writes its dS^T to a shared set, and one step later
computes its columns of that step's dQ over every consumer's keys, which the copy engine adds into an fp32 buffer
(TMA reduce-add; the order of the additions varies); see :func:`_consumer_fused_dq`. ``DQ_ORDERED`` (the planner's
``deterministic=True`` form at D=128 without GQA) fixes that order: the consumers stage their shares for a fifth
partition, a **dQ-writer** warp, which adds each query tile's shares when its program's turn there has come (a
counter per query tile in global memory, key tiles in a fixed order: :func:`_dq_turn`), so the fp32 sums come out
bitwise the same in every run. With GQA (``SPLIT_GROUP``) a fused program takes one query head instead
of the whole group and adds its share of dK/dV into fp32 buffers (the group's programs of one key tile would
otherwise be one long program: v33.7). lse2 and delta come in whole query tiles: the pre-pass pads them to a tile
multiple with lse2 = +inf and delta = 0, so a query row past the end (Q = dO = 0 from the copy engine's zero fill)
has probability 0, as does a row that saw no key. Key rows past the end read zeros; their dK/dV rows are never
stored, and with FUSED_DQ their probabilities are cleared so that they add nothing to dQ.

Device code only: the host side is ``flashcore.launch.sm90_bwd``."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from ..capabilities import Capabilities
from .gluon_compat import async_atomic_add, async_load, thread_barrier
from .mma_layouts import acc_layout

# The ordered dQ's hand-off (DQ_ORDERED): hardware named barriers of a consumer warpgroup and the dQ-writer warp, one
# pair per warpgroup (FULL: its share is staged; EMPTY: the writer is done with the staging tile). Gluon's own
# partition barriers take the low ids
DQ_FULL_BAR: gl.constexpr = gl.constexpr(8)
DQ_EMPTY_BAR: gl.constexpr = gl.constexpr(10)


@gluon.jit
def _issue_step(q_desc, do_desc, lse2_desc, delta_desc, q_smem, do_smem, lse2_smem, delta_smem, ready, j, b, hq0,
                m_first, n_m, STAGES: gl.constexpr, BLOCK_M: gl.constexpr):
    """Step ``j``'s Q and dO tiles and their rows of lse2 and delta (query head ``hq0 + j // n_m``, query tile
    ``m_first + j % n_m``) into ring slot ``j % STAGES``."""
    s = j % STAGES
    hq = hq0 + j // n_m
    m0 = (m_first + j % n_m) * BLOCK_M
    bar = ready.index(s)
    mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes + lse2_desc.block_type.nbytes
                    + delta_desc.block_type.nbytes)
    async_load(q_desc, [b, hq, m0, 0], bar, q_smem.index(s))
    async_load(do_desc, [b, hq, m0, 0], bar, do_smem.index(s))
    async_load(lse2_desc, [b, hq, m0], bar, lse2_smem.index(s))
    async_load(delta_desc, [b, hq, m0], bar, delta_smem.index(s))


@gluon.jit
def _steps(seqlen_q, seqlen_k, num_heads_kv, group, head_chunk, BLOCK_M: gl.constexpr, KEY_ROWS: gl.constexpr,
           CAUSAL: gl.constexpr, SPLIT_GROUP: gl.constexpr, KEYS_DOWN: gl.constexpr = False):
    """This program's (batch entry, K/V head, first query head, first key, first query tile, query tiles per head,
    steps). SPLIT_GROUP: a program takes one query head of a GQA group instead of all of them (its K/V head's
    dK/dV are then added up across the group's programs).

    The grid is one-dimensional, in chunks of ``head_chunk`` (batch entry x head) pairs (K/V heads, or query heads
    with SPLIT_GROUP): within a chunk the key tiles are the outer order, so a causal chunk's long programs (the first
    key tiles see the most query tiles) all start before its short ones, and the short ones fill the end. Chunks,
    not the whole grid, keep the programs that run at once on a few heads: their Q/dO tiles and (fused dQ) the fp32
    dQ rows they add into stay in L2 (v33: the key tiles outer over every head at once cost +33% at 4x32x4096x128
    causal). ``head_chunk`` = 1 is head-major order. KEYS_DOWN: the key tiles in descending order instead (the
    ordered causal dQ's, :func:`_dq_turn`: a tile's first contributor is its last key tile)."""
    pid = gl.program_id(0)
    n_kt = gl.cdiv(seqlen_k, KEY_ROWS)
    num_bh = gl.num_programs(0) // n_kt
    per_chunk = head_chunk * n_kt
    chunk = pid // per_chunk
    r = pid % per_chunk
    width = gl.minimum(head_chunk, num_bh - chunk * head_chunk)
    pid_bh = chunk * head_chunk + r % width
    if SPLIT_GROUP:  # (batch entry, query head) pairs
        b = pid_bh // (num_heads_kv * group)
        hq0 = pid_bh % (num_heads_kv * group)
        hkv = hq0 // group
    else:
        b = pid_bh // num_heads_kv
        hkv = pid_bh % num_heads_kv
        hq0 = hkv * group
    if KEYS_DOWN:
        n0 = (n_kt - 1 - r // width) * KEY_ROWS
    else:
        n0 = (r // width) * KEY_ROWS
    num_m = gl.cdiv(seqlen_q, BLOCK_M)
    if CAUSAL:  # the first query that sees key n0 is n0 - (seqlen_k - seqlen_q) (bottom-right)
        m_first = gl.minimum(gl.maximum(n0 - (seqlen_k - seqlen_q), 0) // BLOCK_M, num_m)
    else:
        m_first = num_m * 0
    n_m = num_m - m_first
    if SPLIT_GROUP:
        n_steps = n_m
    else:
        n_steps = n_m * group
    return b, hkv, hq0, n0, m_first, n_m, n_steps


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
            lse2_smem, delta_smem, ready, empty, kv_ready, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk,
            BLOCK_M: gl.constexpr, STAGES: gl.constexpr, NUM_WG: gl.constexpr, CAUSAL: gl.constexpr,
            SPLIT_GROUP: gl.constexpr, DQ_ORDERED: gl.constexpr):
    """The loader partition (one warp): each consumer's 64 K and V rows once, then every step's Q and dO tiles
    through the ring, a slot refilled once every consumer has released it."""
    b, hkv, hq0, n0, m_first, n_m, n_steps = _steps(seqlen_q, seqlen_k, num_heads_kv, group, head_chunk,
                                               BLOCK_M, NUM_WG * 64, CAUSAL, SPLIT_GROUP, CAUSAL and DQ_ORDERED)
    mbarrier.expect(kv_ready, NUM_WG * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for w in gl.static_range(NUM_WG):
        async_load(k_desc, [b, hkv, n0 + w * 64, 0], kv_ready, k_smem.index(w))
        async_load(v_desc, [b, hkv, n0 + w * 64, 0], kv_ready, v_smem.index(w))
    for j in range(n_steps):
        if j >= STAGES:
            mbarrier.wait(empty.index(j % STAGES), (j // STAGES - 1) & 1)
        _issue_step(q_desc, do_desc, lse2_desc, delta_desc, q_smem, do_smem, lse2_smem, delta_smem, ready, j, b, hq0,
                    m_first, n_m, STAGES, BLOCK_M)


@gluon.jit
def _add_dq(dq, dq_base, hq, m0, dq_row, dq_col, scale, seqlen_q, stride_dqh, stride_dqs):
    """``scale * dq`` (one step's dQ share: query rows ``m0 ...`` of head ``hq``) added into the fp32 buffer."""
    rows = m0 + dq_row
    ptrs = (dq_base + hq.to(gl.int64) * stride_dqh + gl.expand_dims(rows.to(gl.int64) * stride_dqs, 1)
            + gl.expand_dims(dq_col, 0))
    gl.atomic_add(ptrs, dq * scale, mask=gl.expand_dims(rows < seqlen_q, 1), sem="relaxed")


@gluon.jit
def _dq_turns_row(turns_ptr, b, hq, seqlen_q, num_heads_q, BLOCK_M: gl.constexpr):
    """The ordered dQ's counters of query head ``hq``, one per query tile, in a zeroed int32 buffer of a counter per
    (batch entry, query head, query tile)."""
    return turns_ptr + (b * num_heads_q + hq) * gl.cdiv(seqlen_q, BLOCK_M)


@gluon.jit
def _dq_turn(turns_row, m_tile, key_tile, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, KEY_TILE: gl.constexpr,
             CAUSAL: gl.constexpr):
    """The ordered dQ (deterministic): (the counter of query tile ``m_tile``'s share, and this program's turn there).
    Every program whose key tile sees the query tile adds its share once, in a fixed order of key tiles, so the fp32
    sums come out the same in every run: ascending without a mask (every key tile adds to every query tile),
    descending when causal (the last key tile that sees the query tile goes first; the programs then take the key
    tiles downwards, :func:`_steps`' KEYS_DOWN, so a program reaches each of its query tiles a few steps after the
    one before it in the order, which is shorter and started no later). A program waits only for programs with
    lower ids (the grid is in this order, :func:`_steps`), which the hardware starts first, as a CUDA grid's blocks
    go in practice (FA3/FA4's deterministic backward and CUB's decoupled look-back rely on the same): a wait never
    waits for a program that has no SM."""
    if CAUSAL:  # key tiles 0 ... last see this query tile (bottom-right diagonal)
        last = gl.minimum(((m_tile + 1) * BLOCK_M + (seqlen_k - seqlen_q) - 1) // KEY_TILE,
                          gl.cdiv(seqlen_k, KEY_TILE) - 1)
        turn = last - key_tile
    else:
        turn = key_tile
    return turns_row + m_tile, turn


@gluon.jit
def _dq_turn_wait(ptr, turn):
    """Every thread waits (acquire, GPU scope) until ``turn`` shares have been added to the tile counted at ``ptr``;
    the proxy fence orders what they added (the copy engine's writes) before this warpgroup's reduce-add."""
    gl.inline_asm_elementwise("{ .reg .pred p; .reg .b32 v; WAIT_TURN: ld.global.acquire.gpu.b32 v, [$1]; "
                              "setp.ne.s32 p, v, $2; @p bra WAIT_TURN; mov.b32 $0, v; fence.proxy.async.global; }",
                              "=r,l,r", [ptr, turn], gl.int32, False, 1)


@gluon.jit
def _dq_turn_pass(ptr):
    """This warp's reduce-adds are complete (their writes done, not only their reads of shared memory; several lanes
    issue a tile's copies, so every lane waits): one lane counts this program's turn at ``ptr`` done (a fence at GPU
    scope, then the add: a release)."""
    gl.inline_asm_elementwise("{ .reg .pred p; .reg .b32 t; cp.async.bulk.wait_group 0; fence.proxy.async.global; "
                              "bar.warp.sync -1; mov.u32 t, %laneid; setp.eq.u32 p, t, 0; @p fence.acq_rel.gpu; "
                              "@p red.relaxed.gpu.global.add.s32 [$1], 1; mov.b32 $0, 0; }",
                              "=r,l", [ptr], gl.int32, False, 1)


@gluon.jit
def _named_barrier(bar_id, ARRIVE: gl.constexpr):
    """Hardware named barrier ``bar_id`` of 160 threads (a consumer warpgroup and the dQ-writer warp), in inline PTX
    (Gluon has no barrier between partitions but mbarriers): ARRIVE counts this warp's threads in and goes on, else
    waits for all 160 (FA3/FA4's dQ hand-off)."""
    if ARRIVE:
        gl.inline_asm_elementwise("bar.arrive $1, 160; mov.u32 $0, 0;", "=r,r", [bar_id], gl.int32, False, 1)
    else:
        gl.inline_asm_elementwise("bar.sync $1, 160; mov.u32 $0, 0;", "=r,r", [bar_id], gl.int32, False, 1)


@gluon.jit
def _stage_dq(dq, dq_smem, TILE_ROWS: gl.constexpr, DQ_COLS: gl.constexpr, WG: gl.constexpr):
    """One step's dQ share (scaled) into warpgroup ``WG``'s staging tile for the dQ-writer warp (DQ_ORDERED): wait
    until the writer is done with the tile, store, fence, and signal without waiting."""
    zero = gl.program_id(0) * 0  # (the barrier ids as values: inline PTX takes no constexpr operands)
    _named_barrier(zero + (DQ_EMPTY_BAR + WG), False)
    dq_smem.index(WG).reshape([TILE_ROWS, DQ_COLS]).store(dq)
    fence_async_shared()
    _named_barrier(zero + (DQ_FULL_BAR + WG), True)


@gluon.jit
def _dq_writer(dq_desc, dq_smem, turns_ptr, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk,
               BLOCK_M: gl.constexpr, NUM_WG: gl.constexpr, CAUSAL: gl.constexpr, DQ_COLS: gl.constexpr,
               SPLIT_GROUP: gl.constexpr, DQ_ORDERED: gl.constexpr):
    """The dQ-writer partition of the ordered dQ (one warp, DQ_ORDERED): every step, once this program's turn at the
    step's query tile has come (:func:`_dq_turn`; waited for while the consumers still compute the share), each
    consumer warpgroup's staged share is added into the fp32 buffer by the copy engine; the staging tiles go back
    to the consumers once read, and the turn passes on once the additions are complete (written). The consumers
    stage and go on: only this warp waits, on the other programs and on the copy engine (FA3/FA4's deterministic
    form)."""
    b, hkv, hq0, n0, m_first, n_m, n_steps = _steps(seqlen_q, seqlen_k, num_heads_kv, group, head_chunk,
                                               BLOCK_M, NUM_WG * 64, CAUSAL, SPLIT_GROUP, CAUSAL and DQ_ORDERED)
    key_tile = n0 // (NUM_WG * 64)
    turns_row = _dq_turns_row(turns_ptr, b, hq0, seqlen_q, num_heads_kv * group, BLOCK_M)
    zero = b * 0
    for w in gl.static_range(NUM_WG):  # the staging tiles are free
        _named_barrier(zero + (DQ_EMPTY_BAR + w), True)
    for j in range(n_steps):
        if DQ_ORDERED:  # (no GQA: every step's query head is hq0, its query tile m_first + j)
            turn_ptr, turn = _dq_turn(turns_row, m_first + j, key_tile, seqlen_q, seqlen_k, BLOCK_M, NUM_WG * 64,
                                      CAUSAL)
            _dq_turn_wait(turn_ptr, turn)
        for w in gl.static_range(NUM_WG):
            _named_barrier(zero + (DQ_FULL_BAR + w), False)
            async_atomic_add(dq_desc, [b, hq0 + j // n_m, (m_first + j % n_m) * BLOCK_M, w * DQ_COLS],
                             dq_smem.index(w))
        tma.store_wait(0)  # (read: the tiles are free)
        if j + 1 < n_steps:
            for w in gl.static_range(NUM_WG):
                _named_barrier(zero + (DQ_EMPTY_BAR + w), True)
        if DQ_ORDERED:
            _dq_turn_pass(turn_ptr)


@gluon.jit
def _out_dq(dq, dq_base, dq_desc, dq_smem, b, hq, m0, dq_row, dq_col, scale, seqlen_q, stride_dqh, stride_dqs,
            TILE_ROWS: gl.constexpr, DQ_COLS: gl.constexpr, DQ_TMA: gl.constexpr, WG: gl.constexpr,
            ROW0: gl.constexpr, COL0: gl.constexpr):
    """One step's dQ share out (this warpgroup's ``TILE_ROWS x DQ_COLS`` tile at query row ``m0 + ROW0``, column
    ``COL0``): by the copy engine's reduce-add from shared memory (DQ_TMA; rows past the end are clipped by it), or
    by per-thread atomics."""
    if DQ_TMA:
        # the previous reduce has read the staging tile: its wait is the issuing thread's, the barrier everyone's
        tma.store_wait(0)
        thread_barrier()
        dq_smem.index(WG).reshape([TILE_ROWS, DQ_COLS]).store(dq * scale)
        fence_async_shared()
        thread_barrier()  # every warp's rows are staged before the one thread issues the reduce
        async_atomic_add(dq_desc, [b, hq, m0 + ROW0, COL0], dq_smem.index(WG))
    else:
        _add_dq(dq, dq_base, hq, m0, dq_row, dq_col, scale, seqlen_q, stride_dqh, stride_dqs)


@gluon.jit
def _consumer(q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem, delta_smem,
              ds_smem, p_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale, scale, seqlen_q, seqlen_k,
              num_heads_kv, group, head_chunk, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
              stride_dqb, stride_dqh, stride_dqs, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
              NUM_WG: gl.constexpr, CAUSAL: gl.constexpr, FUSED_DQ: gl.constexpr, DQ_TMA: gl.constexpr,
              OPERANDS_SMEM: gl.constexpr, DS_SETS: gl.constexpr, SPLIT_GROUP: gl.constexpr, WG: gl.constexpr,
              RS_DV: gl.constexpr, DQ_SPLIT_Q: gl.constexpr = False, P_BF16: gl.constexpr = False,
              BIAS_IN_ACC: gl.constexpr = False, WIDEN_ASM: gl.constexpr = False, DQ_ORDERED: gl.constexpr = False,
              DQ_WRITER: gl.constexpr = False):
    """A consumer partition (warpgroup ``WG``): dK and dV of key rows ``n0 + 64 WG ...`` over every step, and with
    FUSED_DQ this warpgroup's columns of every step's dQ as well (:func:`_consumer_fused_dq`)."""
    if FUSED_DQ:
        _consumer_fused_dq(q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem,
                           delta_smem, ds_smem, p_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale,
                           scale, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk, stride_dkb, stride_dkh,
                           stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs, BLOCK_M,
                           HEAD_DIM, STAGES, NUM_WG, CAUSAL, DQ_TMA, DS_SETS, SPLIT_GROUP, WG, RS_DV, DQ_SPLIT_Q,
                           P_BF16, BIAS_IN_ACC, WIDEN_ASM, DQ_ORDERED, DQ_WRITER)
    else:
        _consumer_dkdv(q_desc, dk_ptr, dv_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem, delta_smem, ds_smem,
                       p_smem, ready, empty, kv_ready, qk_scale, scale, seqlen_q, seqlen_k, num_heads_kv, group,
                       head_chunk, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, BLOCK_M,
                       HEAD_DIM, STAGES, NUM_WG, CAUSAL, OPERANDS_SMEM, WG)


@gluon.jit
def _store_dkdv(dk, dv, dk_ptr, dv_ptr, b, hkv, n0, scale, seqlen_k, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                stride_dvh, stride_dvs, KEYS: gl.constexpr, HEAD_DIM: gl.constexpr, kv_layout: gl.constexpr,
                ADD: gl.constexpr = False):
    """dK (scaled) and dV of key rows ``n0 ...`` out, rows past the end left alone. ADD: added into fp32 buffers
    instead (one program per query head of a GQA group adds its share; once per program, so per-thread atomics are
    cheap here)."""
    o_row = n0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, kv_layout))
    o_col = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
    ok = gl.expand_dims(o_row < seqlen_k, 1)
    rows = gl.expand_dims(o_row.to(gl.int64), 1)
    cols = gl.expand_dims(o_col, 0)
    dk_ptrs = dk_ptr + b.to(gl.int64) * stride_dkb + hkv.to(gl.int64) * stride_dkh + rows * stride_dks + cols
    dv_ptrs = dv_ptr + b.to(gl.int64) * stride_dvb + hkv.to(gl.int64) * stride_dvh + rows * stride_dvs + cols
    if ADD:
        gl.atomic_add(dk_ptrs, dk * scale, mask=ok, sem="relaxed")
        gl.atomic_add(dv_ptrs, dv, mask=ok, sem="relaxed")
    else:
        dtype: gl.constexpr = dk_ptr.dtype.element_ty
        gl.store(dk_ptrs, (dk * scale).to(dtype), mask=ok)
        gl.store(dv_ptrs, dv.to(dtype), mask=ok)


@gluon.jit
def _own_keys(k_smem, v_smem, n0, WG: gl.constexpr, KEYS: gl.constexpr, HEAD_DIM: gl.constexpr,
              BLOCK_M: gl.constexpr, row_layout: gl.constexpr, col_layout: gl.constexpr):
    """Warpgroup ``WG``'s share of the program's keys (from ``n0``): (its first key, its K and V tiles, its key
    indices, the query tile's column indices)."""
    n0 = n0 + WG * KEYS
    key = n0 + gl.arange(0, KEYS, layout=row_layout)
    col = gl.arange(0, BLOCK_M, layout=col_layout)
    return (n0, k_smem.index(WG).reshape([KEYS, HEAD_DIM]), v_smem.index(WG).reshape([KEYS, HEAD_DIM]), key, col)


@gluon.jit
def _issue_scores(k_t, v_t, q_smem, do_smem, ready, s_zero, j, STAGES: gl.constexpr, BLOCK_M: gl.constexpr,
                  HEAD_DIM: gl.constexpr):
    """Step ``j``'s ring slot once loaded, and its ``S^T = K Q^T`` and ``dP^T = V dO^T`` issued (not waited for):
    (slot, Q tile, dO tile, S^T, dP^T)."""
    s = j % STAGES
    mbarrier.wait(ready.index(s), (j // STAGES) & 1)
    q_t = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
    do_t = do_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
    st = warpgroup_mma(k_t, q_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_t, do_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return s, q_t, do_t, st, dpt


@gluon.jit
def _issue_scores_biased(k_t, v_t, q_smem, do_smem, lse2_smem, delta_smem, ready, j, inv_qk_scale, STAGES: gl.constexpr,
                         BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, s_layout: gl.constexpr,
                         col_layout: gl.constexpr):
    """:func:`_issue_scores` with the step's row statistics as the products' starting values: ``S^T - lse2 / scale``
    and ``dP^T - delta`` come out of the tensor cores, so lse2 and delta are held only while the products are issued,
    not through the exponentials and dS^T (the registers a 128-query step lacks, perf-notes v38). ``inv_qk_scale``
    is 1 / scale, taken once: a division here is a reciprocal and its range fix-ups per query row (v39)."""
    s = j % STAGES
    mbarrier.wait(ready.index(s), (j // STAGES) & 1)
    q_t = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
    do_t = do_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
    lse2 = lse2_smem.index(s).reshape([BLOCK_M]).load(col_layout)
    delta = delta_smem.index(s).reshape([BLOCK_M]).load(col_layout)
    zero = gl.zeros([64, BLOCK_M], gl.float32, layout=s_layout)
    # (lse2 = +inf past the last query row: -inf, whose probabilities are 0)
    st = warpgroup_mma(k_t, q_t.permute((1, 0)), zero - gl.expand_dims(lse2 * inv_qk_scale, 0), is_async=True)
    dpt = warpgroup_mma(v_t, do_t.permute((1, 0)), zero - gl.expand_dims(delta, 0), is_async=True)
    return s, q_t, do_t, st, dpt


@gluon.jit
def _round_pairs(x, dtype: gl.constexpr):
    """``x.to(dtype)`` (bf16 or fp16, round to nearest even), two values per instruction: ``.to`` rounds one at a
    time where the values are not packed right after (F2F, on the pipe the exponentials run on, perf-notes v39)."""
    if dtype == gl.bfloat16:
        y = gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], gl.bfloat16, True, 2)
    else:
        y = gl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x], gl.float16, True, 2)
    return y


@gluon.jit
def _widen_pairs(y):
    """A 16-bit bf16 tensor back to fp32 (exact), a pair of values per 32-bit word: the low value shifted up, the high
    one masked, two integer operations per pair. ``.to(float32)`` split each pair with a byte permute and widened
    each value with an IMAD on the FMA pipe, then permuted the pairs together again for dV's register operand
    (perf-notes v40)."""
    return gl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r", [y],
                                     gl.float32, True, 2)


@gluon.jit
def _probabilities(st, lse2_smem, s, key, qi, m0, n0, diag, qk_scale, seqlen_k, KEYS: gl.constexpr,
                   BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr, CLEAR_PAST_END: gl.constexpr,
                   col_layout: gl.constexpr, BIASED: gl.constexpr = False):
    """``P^T = exp2(S^T * scale * log2e - lse2)`` of slot ``s``'s query rows, 0 above the bottom-right causal
    diagonal where the tile straddles it, and (CLEAR_PAST_END) 0 for keys past the end: they are the copy engine's
    zeros, and must add nothing to dQ, not even 0 * inf. Rows past the end: the pre-pass wrote lse2 = +inf there."""
    if BIASED:  # st is S^T - lse2 / scale already
        pt = gl.exp2(st * qk_scale)
    else:
        lse2 = lse2_smem.index(s).reshape([BLOCK_M]).load(col_layout)
        pt = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
    if CAUSAL:
        if m0 + diag < n0 + KEYS - 1:  # the tile straddles the diagonal: key > query + diag is masked
            ok = gl.expand_dims(key, 1) <= gl.expand_dims(qi + diag, 0)
            pt = gl.where(ok, pt, 0.0)
    if CLEAR_PAST_END:
        if n0 + KEYS > seqlen_k:
            pt = gl.where(gl.expand_dims(key < seqlen_k, 1), pt, 0.0)
    return pt


@gluon.jit
def _accumulate(a, a_smem, b_t, acc, a_op, OPERANDS_SMEM: gl.constexpr, op_layout: gl.constexpr):
    """``acc += a b_t`` issued (not waited for), its left operand ``a`` (16-bit, in the accumulator layout) stored
    to ``a_smem`` first (OPERANDS_SMEM) or converted to the register operand layout: (acc, the register operand,
    which must stay alive until the product is waited for; ``a_op`` unchanged with OPERANDS_SMEM)."""
    if OPERANDS_SMEM:
        a_smem.store(a)
        fence_async_shared()
        acc = warpgroup_mma(a_smem, b_t, acc, is_async=True)
    else:
        a_op = gl.convert_layout(a, op_layout)
        acc = warpgroup_mma(a_op, b_t, acc, is_async=True)
    return acc, a_op


@gluon.jit
def _consumer_dkdv(q_desc, dk_ptr, dv_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem, delta_smem, ds_smem, p_smem,
                   ready, empty, kv_ready, qk_scale, scale, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk,
                   stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, BLOCK_M: gl.constexpr,
                   HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, NUM_WG: gl.constexpr, CAUSAL: gl.constexpr,
                   OPERANDS_SMEM: gl.constexpr, WG: gl.constexpr):
    """dK and dV only (dQ is the Triton kernel's). The left operands of the dV and dK products, P^T and dS^T, are
    stored to shared memory (OPERANDS_SMEM) or kept in registers: shared memory is 4-6% faster at D=128 with two
    warpgroups, registers 7-10% faster at D=64 with one (v33, H200)."""
    dtype: gl.constexpr = q_desc.dtype
    KEYS: gl.constexpr = 64
    s_layout: gl.constexpr = acc_layout(BLOCK_M)
    kv_layout: gl.constexpr = acc_layout(HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    b, hkv, hq0, n0, m_first, n_m, n_steps = _steps(seqlen_q, seqlen_k, num_heads_kv, group, head_chunk,
                                               BLOCK_M, NUM_WG * KEYS, CAUSAL, False)
    n0, k_t, v_t, key, col = _own_keys(k_smem, v_smem, n0, WG, KEYS, HEAD_DIM, BLOCK_M, row_layout, col_layout)
    diag = seqlen_k - seqlen_q
    s_zero = gl.zeros([KEYS, BLOCK_M], gl.float32, layout=s_layout)
    dk = warpgroup_mma_init(gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=kv_layout))
    dv = warpgroup_mma_init(gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=kv_layout))
    p_t = p_smem.index(WG)
    ds_t = ds_smem.index(WG)
    # the previous step's left operands (registers form), kept alive until the products that read them are waited for
    p_op = gl.zeros([KEYS, BLOCK_M], dtype, layout=op_layout)
    ds_op = gl.zeros([KEYS, BLOCK_M], dtype, layout=op_layout)
    mbarrier.wait(kv_ready, 0)

    for j in range(n_steps):
        m0 = (m_first + j % n_m) * BLOCK_M
        s, q_t, do_t, st, dpt = _issue_scores(k_t, v_t, q_smem, do_smem, ready, s_zero, j, STAGES, BLOCK_M, HEAD_DIM)
        # in flight here: the previous step's dV and dK products, then S^T and dP^T; this waits for all but dP^T
        st, p_op, ds_op = warpgroup_mma_wait(1, deps=(st, p_op, ds_op))
        if j > 0:  # the previous step's slot (and P^T, dS^T) have been read by this warpgroup
            mbarrier.arrive(empty.index((j - 1) % STAGES), count=1)
        pt = _probabilities(st, lse2_smem, s, key, m0 + col, m0, n0, diag, qk_scale, seqlen_k, KEYS, BLOCK_M, CAUSAL,
                            False, col_layout)
        dv, p_op = _accumulate(pt.to(dtype), p_t, do_t, dv, p_op, OPERANDS_SMEM, op_layout)
        delta = delta_smem.index(s).reshape([BLOCK_M]).load(col_layout)
        dpt = warpgroup_mma_wait(1, deps=(dpt, ))
        dst = pt * (dpt - gl.expand_dims(delta, 0))
        dk, ds_op = _accumulate(dst.to(dtype), ds_t, q_t, dk, ds_op, OPERANDS_SMEM, op_layout)

    dk, dv, p_op, ds_op = warpgroup_mma_wait(0, deps=(dk, dv, p_op, ds_op))
    _store_dkdv(dk, dv, dk_ptr, dv_ptr, b, hkv, n0, scale, seqlen_k, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                stride_dvh, stride_dvs, KEYS, HEAD_DIM, kv_layout)


@gluon.jit
def _dq_product(ds_smem, k_smem, dq_zero, ds_set, KEYS: gl.constexpr, HEAD_DIM: gl.constexpr, DQ_COLS: gl.constexpr,
                NUM_WG: gl.constexpr, WG: gl.constexpr, DQ_ROWS: gl.constexpr = 0):
    """dQ columns ``WG * DQ_COLS ...`` of one step: ``dS K`` over every warpgroup's dS^T in set ``ds_set`` (issued,
    not waited for). DQ_ROWS > 0: query rows ``WG * DQ_ROWS ...`` instead, every column (dQ split along the queries)."""
    for w in gl.static_range(NUM_WG):
        if DQ_ROWS > 0:
            k_cols = k_smem.index(w).reshape([KEYS, HEAD_DIM])
            ds = ds_smem.index(ds_set * NUM_WG + w).slice(WG * DQ_ROWS, DQ_ROWS, dim=1).permute((1, 0))
        else:
            k_cols = k_smem.index(w).reshape([KEYS, HEAD_DIM]).slice(WG * DQ_COLS, DQ_COLS, dim=1)
            ds = ds_smem.index(ds_set * NUM_WG + w).permute((1, 0))
        if w == 0:
            dq = warpgroup_mma(ds, k_cols, dq_zero, use_acc=False, is_async=True)
        else:
            dq = warpgroup_mma(ds, k_cols, dq, is_async=True)
    return dq


@gluon.jit
def _consumer_fused_dq(q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem,
                       delta_smem, ds_smem, p_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale, scale,
                       seqlen_q, seqlen_k, num_heads_kv, group, head_chunk, stride_dkb, stride_dkh, stride_dks,
                       stride_dvb, stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs, BLOCK_M: gl.constexpr,
                       HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, NUM_WG: gl.constexpr, CAUSAL: gl.constexpr,
                       DQ_TMA: gl.constexpr, DS_SETS: gl.constexpr, SPLIT_GROUP: gl.constexpr,
                       WG: gl.constexpr, RS_DV: gl.constexpr, DQ_SPLIT_Q: gl.constexpr = False,
                       P_BF16: gl.constexpr = False, BIAS_IN_ACC: gl.constexpr = False,
                       WIDEN_ASM: gl.constexpr = False, DQ_ORDERED: gl.constexpr = False,
                       DQ_WRITER: gl.constexpr = False):
    """dK, dV and this warpgroup's share of dQ (five products per tile pair; the order of the additions into the fp32
    ``dq_ptr`` buffer varies, unless DQ_ORDERED: then each step's share is staged for the dQ-writer warp,
    :func:`_stage_dq`, which adds it in turn; DQ_WRITER is that hand-off, measured without the order too).

    dS^T goes through shared memory, and the dK product reads it there: it must be there anyway for the dQ product,
    whose K runs over every warpgroup's keys. P^T goes there too (the dV product's left operand), or, with RS_DV,
    stays in registers as that operand: no store, fence or shared-memory read (the non-causal form, with the 32-byte
    dQ staging tile 2.3-5.6% faster at 4x32x4096x128, perf-notes v35). Both operands in registers make ptxas
    serialise every product of the kernel ("insufficient register resources"; that was v33.2's 7-14% loss).

    dQ is one step behind: at the end of step j this warpgroup issues step j - 1's dQ product, once every
    warpgroup has written that step's dS^T (``ds_ready``), so it waits on the others only if they are more than a
    step behind, and the warpgroups keep their own pace (the tensor cores stay
    busy while one of them computes exponentials; v29.5's form waited for the same step's dS^T and ran 1.16-1.31x
    slower than the dQ kernel). dS^T has ``DS_SETS`` sets: step j writes set j % DS_SETS once every warpgroup's
    dQ product of step j - DS_SETS has read it (``ds_free``). The dQ product is then waited for while step j's dK
    runs on, and its share goes out: staged in shared memory and added by the copy engine (DQ_TMA), else by
    per-thread atomics. Its accumulator lives only in that tail, which is what keeps the form near its registers.

    The 128-query step (BLOCK_M = 64 * NUM_WG, ``launch.sm90_bwd.WIDE_STEP``) needs three register savings to fit:
    DQ_SPLIT_Q (each warpgroup's dQ product covers its own BLOCK_M / NUM_WG query rows and every column, reading its
    rows of every warpgroup's dS^T), P_BF16 (P^T at 16 bits once formed; dS^T from it) and BIAS_IN_ACC (the S^T and
    dP^T products start from -lse2 / scale and -delta: :func:`_issue_scores_biased`); WIDEN_ASM widens the 16-bit
    P^T back to fp32 for dS^T two values at a time (:func:`_widen_pairs`)."""
    dtype: gl.constexpr = q_desc.dtype
    KEYS: gl.constexpr = 64
    s_layout: gl.constexpr = acc_layout(BLOCK_M)
    kv_layout: gl.constexpr = acc_layout(HEAD_DIM)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    # dQ split along the head dimension (each warpgroup DQ_COLS columns of every query row), or with DQ_SPLIT_Q along
    # the queries (each warpgroup its DQ_ROWS rows, every column)
    DQ_COLS: gl.constexpr = HEAD_DIM if DQ_SPLIT_Q else HEAD_DIM // NUM_WG
    DQ_ROWS: gl.constexpr = BLOCK_M // NUM_WG if DQ_SPLIT_Q else 0
    DQ_TILE_ROWS: gl.constexpr = DQ_ROWS if DQ_SPLIT_Q else BLOCK_M
    DQ_ROW0: gl.constexpr = WG * DQ_ROWS  # this warpgroup's tile within the step's [BLOCK_M, HEAD_DIM]
    DQ_COL0: gl.constexpr = 0 if DQ_SPLIT_Q else WG * DQ_COLS
    dq_layout: gl.constexpr = acc_layout(DQ_COLS)

    b, hkv, hq0, n0, m_first, n_m, n_steps = _steps(seqlen_q, seqlen_k, num_heads_kv, group, head_chunk,
                                               BLOCK_M, NUM_WG * KEYS, CAUSAL, SPLIT_GROUP, CAUSAL and DQ_ORDERED)
    n0, k_t, v_t, key, col = _own_keys(k_smem, v_smem, n0, WG, KEYS, HEAD_DIM, BLOCK_M, row_layout, col_layout)
    diag = seqlen_k - seqlen_q
    p_t = p_smem.index(WG)
    s_zero = gl.zeros([KEYS, BLOCK_M], gl.float32, layout=s_layout)
    dk = warpgroup_mma_init(gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=kv_layout))
    dv = warpgroup_mma_init(gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=kv_layout))
    dq_zero = gl.zeros([DQ_TILE_ROWS, DQ_COLS], gl.float32, layout=dq_layout)
    dq_row = DQ_ROW0 + gl.arange(0, DQ_TILE_ROWS, layout=gl.SliceLayout(1, dq_layout))
    dq_col = DQ_COL0 + gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, dq_layout))
    dq_base = dq_ptr + b.to(gl.int64) * stride_dqb
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    inv_qk_scale = 1.0 / qk_scale
    mbarrier.wait(kv_ready, 0)

    for j in range(n_steps):
        m0 = (m_first + j % n_m) * BLOCK_M
        if BIAS_IN_ACC:
            s, q_t, do_t, st, dpt = _issue_scores_biased(k_t, v_t, q_smem, do_smem, lse2_smem, delta_smem, ready, j,
                                                         inv_qk_scale, STAGES, BLOCK_M, HEAD_DIM, s_layout, col_layout)
        else:
            s, q_t, do_t, st, dpt = _issue_scores(k_t, v_t, q_smem, do_smem, ready, s_zero, j, STAGES, BLOCK_M,
                                                  HEAD_DIM)
        # in flight here: step j - 1's dK, then S^T and dP^T; this waits for all but dP^T
        st = warpgroup_mma_wait(1, deps=(st, ))
        if j > 0:  # step j - 1's slot has been read by this warpgroup
            mbarrier.arrive(empty.index((j - 1) % STAGES), count=1)
        pt = _probabilities(st, lse2_smem, s, key, m0 + col, m0, n0, diag, qk_scale, seqlen_k, KEYS, BLOCK_M, CAUSAL,
                            True, col_layout, BIAS_IN_ACC)
        if P_BF16:  # P^T at 16 bits from here on (dS^T from it too): 16 registers per 32 probabilities
            pt = _round_pairs(pt, dtype)
        if RS_DV:  # P^T as dV's register operand (kept alive until dV is waited for)
            p_op = gl.convert_layout(pt.to(dtype), op_layout)
            dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
        else:
            p_t.store(pt.to(dtype))  # (step j - 1's dV product, its reader, was waited for at its end)
            fence_async_shared()
            dv = warpgroup_mma(p_t, do_t, dv, is_async=True)
        if not BIAS_IN_ACC:
            delta = delta_smem.index(s).reshape([BLOCK_M]).load(col_layout)
        dpt = warpgroup_mma_wait(1, deps=(dpt, ))
        if P_BF16:  # (dS^T from the 16-bit P^T)
            if WIDEN_ASM and dtype == gl.bfloat16:
                pt = _widen_pairs(pt)
            else:
                pt = pt.to(gl.float32)
        if BIAS_IN_ACC:  # dpt is dP^T - delta already
            dst = pt * dpt
        else:
            dst = pt * (dpt - gl.expand_dims(delta, 0))
        ds_set = j % DS_SETS
        if j >= DS_SETS:  # every warpgroup's dQ product of step j - DS_SETS has read this set
            mbarrier.wait(ds_free.index(ds_set), (j // DS_SETS - 1) & 1)
        ds_t = ds_smem.index(ds_set * NUM_WG + WG)
        ds_t.store(dst.to(dtype))
        fence_async_shared()
        thread_barrier()  # every warp's rows are written before the arrival (one thread arrives)
        mbarrier.arrive(ds_ready.index(ds_set), count=1)
        # dQ[:, this share] of step j - 1 = dS K[:, this share], over every warpgroup's keys. At j = 0 there is no
        # step j - 1: the product runs on whatever its set holds and is dropped (an accumulator in flight must not
        # pass through a branch: the copies that merge the branches would read it before it is written)
        prev = (j + DS_SETS - 1) % DS_SETS
        if j > 0:
            mbarrier.wait(ds_ready.index(prev), ((j - 1) // DS_SETS) & 1)
        dq = _dq_product(ds_smem, k_smem, dq_zero, prev, KEYS, HEAD_DIM, DQ_COLS, NUM_WG, WG, DQ_ROWS)
        dk = warpgroup_mma(ds_t, q_t, dk, is_async=True)
        # in flight: dV, step j - 1's dQ, dK; dK runs on while that dQ share goes out (this also waits for dV)
        if RS_DV:
            dq, p_op = warpgroup_mma_wait(1, deps=(dq, p_op))
        else:
            dq = warpgroup_mma_wait(1, deps=(dq, ))
        if j > 0:
            mbarrier.arrive(ds_free.index(prev), count=1)
            if DQ_WRITER:  # the dQ-writer warp adds it (in turn, DQ_ORDERED)
                _stage_dq(dq * scale, dq_smem, DQ_TILE_ROWS, DQ_COLS, WG)
            else:
                _out_dq(dq, dq_base, dq_desc, dq_smem, b, hq0 + (j - 1) // n_m, (m_first + (j - 1) % n_m) * BLOCK_M,
                        dq_row, dq_col, scale, seqlen_q, stride_dqh, stride_dqs, DQ_TILE_ROWS, DQ_COLS, DQ_TMA, WG,
                        DQ_ROW0, DQ_COL0)

    dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
    if n_steps > 0:  # the last step's dQ share
        last = (n_steps - 1) % DS_SETS
        mbarrier.wait(ds_ready.index(last), ((n_steps - 1) // DS_SETS) & 1)
        dq = _dq_product(ds_smem, k_smem, dq_zero, last, KEYS, HEAD_DIM, DQ_COLS, NUM_WG, WG, DQ_ROWS)
        dq = warpgroup_mma_wait(0, deps=(dq, ))
        if DQ_WRITER:
            _stage_dq(dq * scale, dq_smem, DQ_TILE_ROWS, DQ_COLS, WG)
        else:
            _out_dq(dq, dq_base, dq_desc, dq_smem, b, hq0 + (n_steps - 1) // n_m,
                    (m_first + (n_steps - 1) % n_m) * BLOCK_M, dq_row, dq_col, scale, seqlen_q, stride_dqh,
                    stride_dqs, DQ_TILE_ROWS, DQ_COLS, DQ_TMA, WG, DQ_ROW0, DQ_COL0)
    if DQ_TMA and not DQ_WRITER:  # the last reduce must have read its tile before the program exits
        tma.store_wait(0)
    # (SPLIT_GROUP: this query head's share of its K/V head's dK/dV, added into fp32 buffers)
    _store_dkdv(dk, dv, dk_ptr, dv_ptr, b, hkv, n0, scale, seqlen_k, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                stride_dvh, stride_dvs, KEYS, HEAD_DIM, kv_layout, SPLIT_GROUP)


@gluon.jit
def attn_bwd_dkdv_hopper_kernel(q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr,
                                turns_ptr, qk_scale, scale, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk,
                                stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_dqb,
                                stride_dqh, stride_dqs, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                                STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_WG: gl.constexpr,
                                CONSUMER_WG_REGS: gl.constexpr,
                                LOADER_WG_REGS: gl.constexpr, FUSED_DQ: gl.constexpr = False,
                                DQ_TMA: gl.constexpr = False, OPERANDS_SMEM: gl.constexpr = False,
                                DS_SETS: gl.constexpr = 2, SPLIT_GROUP: gl.constexpr = False,
                                RS_DV: gl.constexpr = False, DQ_SPLIT_Q: gl.constexpr = False,
                                P_BF16: gl.constexpr = False, BIAS_IN_ACC: gl.constexpr = False,
                                WIDEN_ASM: gl.constexpr = False, DQ_ORDERED: gl.constexpr = False,
                                DQ_WRITER: gl.constexpr = False):
    """One program per (key tile of ``64 NUM_WG`` keys, batch entry x K/V head); see the module's docstring.

    DQ_ORDERED (fused dQ, deterministic): ``turns_ptr`` is a zeroed int32 buffer, a counter per (batch entry, query
    head, query tile), :func:`_dq_turn`; otherwise unused. (Each program's place in the order is its program id: a
    place taken from an atomic ticket instead, so as not to rely on the hardware starting programs in the order of
    their ids, made every value derived from it non-uniform and cost the consumers 10-12 spilled registers, perf-notes
    v41.)"""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_WG] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_WG] + v_desc.block_type.shape, v_desc.layout)
    lse2_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + lse2_desc.block_type.shape, lse2_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + delta_desc.block_type.shape, delta_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    if FUSED_DQ:  # every warpgroup's dS^T of a step (three sets, by step), their ready/free barriers, and its P^T
        tile_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        ds_smem = gl.allocate_shared_memory(dtype, [DS_SETS * NUM_WG, 64, BLOCK_M], tile_layout)
        if RS_DV:  # P^T is dV's register operand: no tile (unused)
            p_smem = ds_smem
        else:
            p_smem = gl.allocate_shared_memory(dtype, [NUM_WG, 64, BLOCK_M], tile_layout)
        ds_ready = gl.allocate_shared_memory(gl.int64, [DS_SETS, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [DS_SETS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(DS_SETS):
            mbarrier.init(ds_ready.index(i), count=NUM_WG)
            mbarrier.init(ds_free.index(i), count=NUM_WG)
    else:
        if OPERANDS_SMEM:  # each warpgroup's dS^T and P^T, the left operands of its dK and dV products
            tile_layout_2: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
            ds_smem = gl.allocate_shared_memory(dtype, [NUM_WG, 64, BLOCK_M], tile_layout_2)
            p_smem = gl.allocate_shared_memory(dtype, [NUM_WG, 64, BLOCK_M], tile_layout_2)
        else:  # unused
            ds_smem = q_smem
            p_smem = q_smem
        ds_ready = ready
        ds_free = ready
    if DQ_TMA:  # each consumer's dQ share, staged for the copy engine's reduce-add
        dq_smem = gl.allocate_shared_memory(gl.float32, [NUM_WG] + dq_desc.block_type.shape, dq_desc.layout)
    else:  # unused
        dq_smem = q_smem
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=NUM_WG)  # one arrival per consumer warpgroup
    mbarrier.init(kv_ready, count=1)
    # (Triton 3.6's warp_specialize wants each partition's arguments spelled out: a tuple built in the kernel and
    # extended there turns the constexprs in it into tensors, and so does one only assigned to a name, v41; hence
    # three lists, alike but for their partitions)
    if NUM_WG == 2 and DQ_WRITER:
        gl.warp_specialize([
            (_consumer, (q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem,
                         delta_smem, ds_smem, p_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale,
                         scale, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk, stride_dkb, stride_dkh, stride_dks,
                         stride_dvb, stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs, BLOCK_M, HEAD_DIM,
                         STAGES, NUM_WG, CAUSAL, FUSED_DQ, DQ_TMA, OPERANDS_SMEM, DS_SETS, SPLIT_GROUP, 0,
                         RS_DV, DQ_SPLIT_Q, P_BF16, BIAS_IN_ACC, WIDEN_ASM, DQ_ORDERED, DQ_WRITER)),
            (_consumer, (q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem,
                         delta_smem, ds_smem, p_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale,
                         scale, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk, stride_dkb, stride_dkh, stride_dks,
                         stride_dvb, stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs, BLOCK_M, HEAD_DIM,
                         STAGES, NUM_WG, CAUSAL, FUSED_DQ, DQ_TMA, OPERANDS_SMEM, DS_SETS, SPLIT_GROUP, 1,
                         RS_DV, DQ_SPLIT_Q, P_BF16, BIAS_IN_ACC, WIDEN_ASM, DQ_ORDERED, DQ_WRITER)),
            (_loader, (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                       lse2_smem, delta_smem, ready, empty, kv_ready, seqlen_q, seqlen_k, num_heads_kv, group,
                       head_chunk, BLOCK_M, STAGES, NUM_WG, CAUSAL, SPLIT_GROUP, DQ_ORDERED)),
            (_dq_writer, (dq_desc, dq_smem, turns_ptr, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk,
                          BLOCK_M, NUM_WG, CAUSAL, HEAD_DIM // NUM_WG, SPLIT_GROUP, DQ_ORDERED)),
        ], [4, 1, 1], [CONSUMER_WG_REGS, LOADER_WG_REGS, LOADER_WG_REGS])
    elif NUM_WG == 2:
        gl.warp_specialize([
            (_consumer, (q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem,
                         delta_smem, ds_smem, p_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale,
                         scale, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk, stride_dkb, stride_dkh, stride_dks,
                         stride_dvb, stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs, BLOCK_M, HEAD_DIM,
                         STAGES, NUM_WG, CAUSAL, FUSED_DQ, DQ_TMA, OPERANDS_SMEM, DS_SETS, SPLIT_GROUP, 0,
                         RS_DV, DQ_SPLIT_Q, P_BF16, BIAS_IN_ACC, WIDEN_ASM, DQ_ORDERED, DQ_WRITER)),
            (_consumer, (q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem,
                         delta_smem, ds_smem, p_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale,
                         scale, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk, stride_dkb, stride_dkh, stride_dks,
                         stride_dvb, stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs, BLOCK_M, HEAD_DIM,
                         STAGES, NUM_WG, CAUSAL, FUSED_DQ, DQ_TMA, OPERANDS_SMEM, DS_SETS, SPLIT_GROUP, 1,
                         RS_DV, DQ_SPLIT_Q, P_BF16, BIAS_IN_ACC, WIDEN_ASM, DQ_ORDERED, DQ_WRITER)),
            (_loader, (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                       lse2_smem, delta_smem, ready, empty, kv_ready, seqlen_q, seqlen_k, num_heads_kv, group,
                       head_chunk, BLOCK_M, STAGES, NUM_WG, CAUSAL, SPLIT_GROUP, DQ_ORDERED)),
        ], [4, 1], [CONSUMER_WG_REGS, LOADER_WG_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem,
                         delta_smem, ds_smem, p_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale,
                         scale, seqlen_q, seqlen_k, num_heads_kv, group, head_chunk, stride_dkb, stride_dkh, stride_dks,
                         stride_dvb, stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs, BLOCK_M, HEAD_DIM,
                         STAGES, NUM_WG, CAUSAL, FUSED_DQ, DQ_TMA, OPERANDS_SMEM, DS_SETS, SPLIT_GROUP, 0,
                         RS_DV, DQ_SPLIT_Q, P_BF16, BIAS_IN_ACC, WIDEN_ASM, DQ_ORDERED, DQ_WRITER)),
            (_loader, (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                       lse2_smem, delta_smem, ready, empty, kv_ready, seqlen_q, seqlen_k, num_heads_kv, group,
                       head_chunk, BLOCK_M, STAGES, NUM_WG, CAUSAL, SPLIT_GROUP, DQ_ORDERED)),
        ], [1], [LOADER_WG_REGS])


CAPABILITIES = Capabilities(
    name="sm90_bwd", module=__name__,
    role="backward dK/dV (and, fused, dQ by the copy engine's reduce-add), Hopper: warp-specialised (TMA loader "
         "warp, wgmma consumer warpgroups); the pre-pass, and dQ where not fused, are the portable kernels'",
    dtypes=("fp16", "bf16"), head_dims=(64, 128), archs=(9,), features=("causal", "gqa", "deterministic"),
    needs=("tma",), secret=("q_desc", "k_desc", "v_desc", "do_desc"))
