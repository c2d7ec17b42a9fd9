"""Hopper (sm_90a) attention backward, the dK/dV kernel, in Gluon: warp-specialised, TMA-fed, wgmma, with the
probabilities and dS kept in registers as the left operand of the dV and dK products.

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
  ``dS^T = P^T (dP^T - delta)`` is computed; then ``dK += dS^T Q``. The dV and dK products are left in flight
  into the next step and waited for under its ``S^T``; only then are their operands (the P and dS registers,
  the slot) released.

dQ is not computed here in the planner's forms: the Triton dQ kernel runs after this one (deterministic; seven
products per tile pair in all instead of five, perf-notes v29 says what that costs). ``FUSED_DQ`` (only by explicit
configuration) adds dQ from here instead, by atomics or the TMA reduce-add (``DQ_TMA``): correct, not
deterministic, and measured slower (perf-notes v29.4-v29.5); see ``_consumer``. lse2 and delta come in whole query tiles: the
pre-pass pads them to a tile multiple with lse2 = +inf and delta = 0, so a query row past the end (Q = dO = 0 from
the copy engine's zero fill) has probability 0, as does a row that saw no key. Key rows past the end read zeros;
their dK/dV rows are never stored and no other row depends on them.

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
from .gluon_compat import async_atomic_add, async_load


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
def _steps(seqlen_q, seqlen_k, num_heads_kv, group, BLOCK_M: gl.constexpr, KEY_ROWS: gl.constexpr,
           CAUSAL: gl.constexpr):
    """This program's (batch entry, K/V head, first key, first query tile, query tiles per head, steps)."""
    pid_bh = gl.program_id(1)
    b = pid_bh // num_heads_kv
    hkv = pid_bh % num_heads_kv
    n0 = gl.program_id(0) * KEY_ROWS
    num_m = gl.cdiv(seqlen_q, BLOCK_M)
    if CAUSAL:  # the first query that sees key n0 is n0 - (seqlen_k - seqlen_q) (bottom-right)
        m_first = gl.minimum(gl.maximum(n0 - (seqlen_k - seqlen_q), 0) // BLOCK_M, num_m)
    else:
        m_first = num_m * 0
    n_m = num_m - m_first
    return b, hkv, n0, m_first, n_m, n_m * group


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, q_smem, do_smem, k_smem, v_smem, lse2_smem,
            delta_smem, ready, empty, kv_ready, seqlen_q, seqlen_k, num_heads_kv, group, BLOCK_M: gl.constexpr,
            STAGES: gl.constexpr, NUM_WG: gl.constexpr, CAUSAL: gl.constexpr):
    """The loader partition (one warp): each consumer's 64 K and V rows once, then every step's Q and dO tiles
    through the ring, a slot refilled once every consumer has released it."""
    b, hkv, n0, m_first, n_m, n_steps = _steps(seqlen_q, seqlen_k, num_heads_kv, group, BLOCK_M, NUM_WG * 64,
                                               CAUSAL)
    mbarrier.expect(kv_ready, NUM_WG * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for w in gl.static_range(NUM_WG):
        async_load(k_desc, [b, hkv, n0 + w * 64, 0], kv_ready, k_smem.index(w))
        async_load(v_desc, [b, hkv, n0 + w * 64, 0], kv_ready, v_smem.index(w))
    hq0 = hkv * group
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
def _out_dq(dq, dq_base, dq_desc, dq_smem, b, hq, m0, dq_row, dq_col, scale, seqlen_q, stride_dqh, stride_dqs,
            BLOCK_M: gl.constexpr, DQ_COLS: gl.constexpr, DQ_TMA: gl.constexpr, WG: gl.constexpr):
    """One step's dQ share out: by the copy engine's reduce-add from shared memory (DQ_TMA; rows past the end are
    clipped by it), or by per-thread atomics."""
    if DQ_TMA:
        tma.store_wait(0)  # the previous reduce has read the staging tile
        dq_smem.index(WG).reshape([BLOCK_M, DQ_COLS]).store(dq * scale)
        fence_async_shared()
        async_atomic_add(dq_desc, [b, hq, m0, WG * DQ_COLS], dq_smem.index(WG))
    else:
        _add_dq(dq, dq_base, hq, m0, dq_row, dq_col, scale, seqlen_q, stride_dqh, stride_dqs)


@gluon.jit
def _consumer(q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem, delta_smem,
              ds_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale, scale, seqlen_q, seqlen_k,
              num_heads_kv, group, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_dqb,
              stride_dqh, stride_dqs, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
              NUM_WG: gl.constexpr, CAUSAL: gl.constexpr, FUSED_DQ: gl.constexpr, DQ_TMA: gl.constexpr,
              WG: gl.constexpr):
    """A consumer partition (warpgroup ``WG``): dK and dV of key rows ``n0 + 64 WG ...`` over every step.

    FUSED_DQ: each step also adds its dQ contribution, ``scale * dS K`` over this program's keys, into the fp32
    ``dq_ptr`` buffer with atomics (not deterministic: the order of the additions varies). Every warpgroup writes
    its dS^T tile to shared memory (``ds_smem``, two sets by step parity) and computes the dQ columns
    ``WG * HEAD_DIM / NUM_WG ...`` from all of them (its registers hold only that share); its atomics run in the
    next step, once the product is waited for under that step's S^T. DQ_TMA: instead of per-thread atomics, the
    share is staged in shared memory (``dq_smem``) and added by the copy engine (TMA reduce-add, ``dq_desc``)."""
    dtype: gl.constexpr = q_desc.dtype
    KEYS: gl.constexpr = 64
    # keys are the rows of every product here
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    DQ_COLS: gl.constexpr = HEAD_DIM // NUM_WG
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_COLS, 16])

    b, hkv, n0, m_first, n_m, n_steps = _steps(seqlen_q, seqlen_k, num_heads_kv, group, BLOCK_M, NUM_WG * KEYS,
                                               CAUSAL)
    n0 = n0 + WG * KEYS
    diag = seqlen_k - seqlen_q
    hq0 = hkv * group
    k_t = k_smem.index(WG).reshape([KEYS, HEAD_DIM])
    v_t = v_smem.index(WG).reshape([KEYS, HEAD_DIM])
    key = n0 + gl.arange(0, KEYS, layout=row_layout)
    col = gl.arange(0, BLOCK_M, layout=col_layout)
    s_zero = gl.zeros([KEYS, BLOCK_M], gl.float32, layout=s_layout)
    dk = warpgroup_mma_init(gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=kv_layout))
    dv = warpgroup_mma_init(gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=kv_layout))
    # the previous step's left operands, kept alive until the products that read them are waited for
    p_op = gl.zeros([KEYS, BLOCK_M], dtype, layout=op_layout)
    ds_op = gl.zeros([KEYS, BLOCK_M], dtype, layout=op_layout)
    dq_zero = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, layout=dq_layout)
    dq = warpgroup_mma_init(dq_zero)
    dq_row = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    dq_col = WG * DQ_COLS + gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, dq_layout))
    dq_base = dq_ptr + b.to(gl.int64) * stride_dqb
    mbarrier.wait(kv_ready, 0)

    for j in range(n_steps):
        s = j % STAGES
        hq = hq0 + j // n_m
        m0 = (m_first + j % n_m) * BLOCK_M
        qi = m0 + col
        mbarrier.wait(ready.index(s), (j // STAGES) & 1)
        q_t = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
        do_t = do_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
        st = warpgroup_mma(k_t, q_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_t, do_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        # in flight here: the previous step's dV and dK products, then S^T and dP^T; this waits for all but dP^T
        if FUSED_DQ:
            st, p_op, ds_op, dq = warpgroup_mma_wait(1, deps=(st, p_op, ds_op, dq))
        else:
            st, p_op, ds_op = warpgroup_mma_wait(1, deps=(st, p_op, ds_op))
        if j > 0:  # the previous step's slot is free in this warpgroup
            mbarrier.arrive(empty.index((j - 1) % STAGES), count=1)
            if FUSED_DQ:  # and so is its dS^T set; then its dQ share goes out
                mbarrier.arrive(ds_free.index((j - 1) % 2), count=1)
                _out_dq(dq, dq_base, dq_desc, dq_smem, b, hq0 + (j - 1) // n_m, (m_first + (j - 1) % n_m) * BLOCK_M,
                        dq_row, dq_col, scale, seqlen_q, stride_dqh, stride_dqs, BLOCK_M, DQ_COLS, DQ_TMA, WG)
        # (rows past the end: the pre-pass wrote lse2 = +inf and delta = 0 up to the padded length)
        lse2 = lse2_smem.index(s).reshape([BLOCK_M]).load(col_layout)
        pt = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
        if CAUSAL:
            if m0 + diag < n0 + KEYS - 1:  # the tile straddles the diagonal: key > query + diag is masked
                ok = gl.expand_dims(key, 1) <= gl.expand_dims(qi + diag, 0)
                pt = gl.where(ok, pt, 0.0)
        if FUSED_DQ:  # keys past the end (zeros from the copy engine) must add nothing to dQ, not even 0 * inf
            if n0 + KEYS > seqlen_k:
                pt = gl.where(gl.expand_dims(key < seqlen_k, 1), pt, 0.0)
        p_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
        delta = delta_smem.index(s).reshape([BLOCK_M]).load(col_layout)
        dpt = warpgroup_mma_wait(1, deps=(dpt, ))
        dst = pt * (dpt - gl.expand_dims(delta, 0))
        ds16 = dst.to(dtype)
        if FUSED_DQ:  # this warpgroup's dS^T into the parity's set, once step j - 2 has read it everywhere
            dp = j % 2
            if j >= 2:
                mbarrier.wait(ds_free.index(dp), (j // 2 - 1) & 1)
            ds_smem.index(dp * NUM_WG + WG).store(ds16)
            fence_async_shared()
            mbarrier.arrive(ds_ready.index(dp), count=1)
        ds_op = gl.convert_layout(ds16, op_layout)
        dk = warpgroup_mma(ds_op, q_t, dk, is_async=True)
        if FUSED_DQ:  # dQ[:, this share] = dS K[:, this share], over every warpgroup's keys
            mbarrier.wait(ds_ready.index(dp), (j // 2) & 1)
            for w in gl.static_range(NUM_WG):
                k_cols = k_smem.index(w).reshape([KEYS, HEAD_DIM]).slice(WG * DQ_COLS, DQ_COLS, dim=1)
                dq = warpgroup_mma(ds_smem.index(dp * NUM_WG + w).permute((1, 0)), k_cols,
                                   dq_zero if w == 0 else dq, use_acc=w > 0, is_async=True)

    if FUSED_DQ:
        dk, dv, p_op, ds_op, dq = warpgroup_mma_wait(0, deps=(dk, dv, p_op, ds_op, dq))
        if n_steps > 0:
            _out_dq(dq, dq_base, dq_desc, dq_smem, b, hq0 + (n_steps - 1) // n_m,
                    (m_first + (n_steps - 1) % n_m) * BLOCK_M, dq_row, dq_col, scale, seqlen_q, stride_dqh,
                    stride_dqs, BLOCK_M, DQ_COLS, DQ_TMA, WG)
        if DQ_TMA:  # the last reduce must have read its tile before the program exits
            tma.store_wait(0)
    else:
        dk, dv, p_op, ds_op = warpgroup_mma_wait(0, deps=(dk, dv, p_op, ds_op))
    o_row = n0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, kv_layout))
    o_col = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
    ok = gl.expand_dims(o_row < seqlen_k, 1)
    rows = gl.expand_dims(o_row.to(gl.int64), 1)
    cols = gl.expand_dims(o_col, 0)
    dk_base = dk_ptr + b.to(gl.int64) * stride_dkb + hkv.to(gl.int64) * stride_dkh
    dv_base = dv_ptr + b.to(gl.int64) * stride_dvb + hkv.to(gl.int64) * stride_dvh
    gl.store(dk_base + rows * stride_dks + cols, (dk * scale).to(dtype), mask=ok)
    gl.store(dv_base + rows * stride_dvs + cols, dv.to(dtype), mask=ok)


@gluon.jit
def attn_bwd_dkdv_hopper_kernel(q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr,
                                qk_scale, scale, seqlen_q, seqlen_k, num_heads_kv, group, stride_dkb, stride_dkh,
                                stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs,
                                BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                                CAUSAL: gl.constexpr, NUM_WG: gl.constexpr, CONSUMER_WG_REGS: gl.constexpr,
                                LOADER_WG_REGS: gl.constexpr, FUSED_DQ: gl.constexpr = False,
                                DQ_TMA: gl.constexpr = False):
    """One program per (key tile of ``64 NUM_WG`` keys, batch entry x K/V head); see the module's docstring."""
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
    if FUSED_DQ:  # every warpgroup's dS^T of a step, two sets (step parity), and their ready/free barriers
        ds_smem = gl.allocate_shared_memory(dtype, [2 * NUM_WG, 64, BLOCK_M],
                                            gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
        ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(ds_ready.index(i), count=NUM_WG)
            mbarrier.init(ds_free.index(i), count=NUM_WG)
    else:  # unused
        ds_smem = q_smem
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
    # extended there turns the constexprs in it into tensors)
    if NUM_WG == 2:
        gl.warp_specialize([
            (_consumer, (q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem,
                         delta_smem, ds_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale, scale,
                         seqlen_q, seqlen_k, num_heads_kv, group, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                         stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs, BLOCK_M, HEAD_DIM, STAGES, NUM_WG,
                         CAUSAL, FUSED_DQ, DQ_TMA, 0)),
            (_consumer, (q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem,
                         delta_smem, ds_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale, scale,
                         seqlen_q, seqlen_k, num_heads_kv, group, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                         stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs, BLOCK_M, HEAD_DIM, STAGES, NUM_WG,
                         CAUSAL, FUSED_DQ, DQ_TMA, 1)),
            (_loader, (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                       lse2_smem, delta_smem, ready, empty, kv_ready, seqlen_q, seqlen_k, num_heads_kv, group, BLOCK_M,
                       STAGES, NUM_WG, CAUSAL)),
        ], [4, 1], [CONSUMER_WG_REGS, LOADER_WG_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (q_desc, dq_desc, dk_ptr, dv_ptr, dq_ptr, q_smem, do_smem, k_smem, v_smem, lse2_smem,
                         delta_smem, ds_smem, dq_smem, ready, empty, kv_ready, ds_ready, ds_free, qk_scale, scale,
                         seqlen_q, seqlen_k, num_heads_kv, group, stride_dkb, stride_dkh, stride_dks, stride_dvb,
                         stride_dvh, stride_dvs, stride_dqb, stride_dqh, stride_dqs, BLOCK_M, HEAD_DIM, STAGES, NUM_WG,
                         CAUSAL, FUSED_DQ, DQ_TMA, 0)),
            (_loader, (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                       lse2_smem, delta_smem, ready, empty, kv_ready, seqlen_q, seqlen_k, num_heads_kv, group, BLOCK_M,
                       STAGES, NUM_WG, CAUSAL)),
        ], [1], [LOADER_WG_REGS])


CAPABILITIES = Capabilities(
    name="sm90_bwd", module=__name__,
    role="backward dK/dV, Hopper: warp-specialised (TMA loader warp, wgmma consumer warpgroups with P and dS as "
         "register operands); the pre-pass and dQ stay the portable kernels'",
    dtypes=("fp16", "bf16"), head_dims=(64, 128), archs=(9,), features=("causal", "gqa", "deterministic"),
    needs=("tma",), secret=("q_desc", "k_desc", "v_desc", "do_desc"))
