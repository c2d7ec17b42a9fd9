"""Hopper (sm_90a) constant-time attention forward in Gluon: wgmma overlap without warp specialisation.

Why not the fast path's warp-specialised kernel (``hopper_fwd.py``)? Its partitions hand tiles over
through mbarriers, and an mbarrier wait is a *retry loop* (``TRYWAIT`` + branch) whose trip count
depends on how long the other partition took. Measured on the H100 (2026-11-21, ncu, 2x8x1024x128,
same input four times): the executed instruction and branch counts of that kernel differ from run to
run (by ~120 instructions / 30 branches), so its instruction stream is a function of timing, and
timing is not secret-free on this GPU (docs/security.md §5.4). The secure mode's gate 2 demands
identical counts, so this kernel uses only waits the hardware resolves without a software loop:

* K/V tiles arrive by ``cp.async`` issued by all 256 threads, completed with ``cp.async.wait_group``
  and one CTA barrier per key block (``BAR.SYNC``) - a ring of ``STAGES`` slots for K and for V;
* S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued as asynchronous wgmma and waited for with
  ``wgmma.wait_group`` (``WARPGROUP.DEPBAR``): the softmax of block j runs while P_{j-1} V_{j-1}
  executes on the tensor cores (FlashAttention-3's intra-warpgroup overlap), which the Triton
  kernel cannot express (docs/perf-notes.md v3).

Secure semantics are those of the Triton kernel's ``SECURE`` path (``attention_fwd.py``): the true
lengths are read on the device and only enter selects; every key block of the padded length is
visited (causal blocks are skipped only on the public diagonal, ``PUBLIC_DIAG``); V is the secure
pre-pass's copy, whose padding holds a public fill; rows past the true length output zeros.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

NUM_WARPS = 8  # two warpgroups of 64 query rows


@gluon.jit
def _tile_offsets(rows, cols, stride_s):
    """int32 element offsets of a [rows, cols] tile whose rows are ``stride_s`` apart."""
    return gl.expand_dims(rows, 1) * stride_s + gl.expand_dims(cols, 0)


@gluon.jit
def _copy_tile(smem, base, offs, rows, n_rows):
    """cp.async a tile into ``smem``: rows >= ``n_rows`` (a public count) are zero-filled, not read."""
    async_copy.async_copy_global_to_shared(smem, base + offs, mask=gl.expand_dims(rows < n_rows, 1))


@gluon.jit
def _issue_kv(t, n_blocks, k_base, v_base, k_smem, v_smem, k_offs, v_offs, ld_rows, stride_ks, stride_vs, seqlen_k,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Copy group t = {K_t, V_(t-1)} (each only if it exists: ``n_blocks`` is public), then commit.

    Group t is what step t consumes (S_t needs K_t, and O += P_(t-1) V_(t-1) runs in the same step),
    so one ``wait_group`` per step covers both tiles. An empty group is still committed, so the
    group count per step stays fixed."""
    if t < n_blocks:
        row0 = t * BLOCK_N
        _copy_tile(k_smem.index(t % STAGES), k_base + row0.to(gl.int64) * stride_ks, k_offs, ld_rows, seqlen_k - row0)
    if t >= 1:
        if t <= n_blocks:
            row0 = (t - 1) * BLOCK_N
            _copy_tile(v_smem.index((t - 1) % STAGES), v_base + row0.to(gl.int64) * stride_vs, v_offs, ld_rows,
                       seqlen_k - row0)
    async_copy.commit_group()


@gluon.jit
def _ready(OUTSTANDING: gl.constexpr):
    """Wait for this thread's copies of the step's group, then make everyone's visible to every warp
    and to the tensor cores (async proxy). Hardware waits only: no retry loop."""
    async_copy.wait_group(OUTSTANDING)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _masked_softmax(s, m_i, l_i, col0, rows, len_k, diag, qk_scale, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
                    s_layout: gl.constexpr):
    """Online softmax of one raw score tile with the secret masks applied by select, on every block.

    A row that has seen no visible key keeps m = -inf and is shifted by 0, so exp2 gives exact
    zeros (never NaN); its l stays 0 and the epilogue outputs zeros."""
    col = col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    ok = gl.expand_dims(col < len_k, 0)
    if CAUSAL:
        ok = ok & (gl.expand_dims(col, 0) <= gl.expand_dims(rows + diag, 1))
    s = gl.where(ok, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_use, 1))
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.jit
def attn_fwd_hopper_secure_kernel(
    Q, K, V, O, LSE, SEQLENS_Q, SEQLENS_K,
    qk_scale,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, num_heads_q, gqa_group,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, PUBLIC_DIAG: gl.constexpr, RETURN_LSE: gl.constexpr,
):
    dtype: gl.constexpr = Q.dtype.element_ty
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    # copies: 16-byte vectors along D, consecutive threads on consecutive vectors of a row
    VEC: gl.constexpr = 8
    TPW_D: gl.constexpr = HEAD_DIM // VEC
    ld_layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // TPW_D, TPW_D], [8, 1], [1, 0])
    q_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # causal: the longest rows first
    bh = gl.program_id(1)
    b = bh // num_heads_q
    h = bh % num_heads_q
    hk = h // gqa_group
    m0 = pid_m * BLOCK_M

    # Secret lengths: clamped arithmetically, used only in selects.
    len_q = gl.minimum(gl.maximum(gl.load(SEQLENS_Q + b), 0), seqlen_q)
    len_k = gl.minimum(gl.maximum(gl.load(SEQLENS_K + b), 0), seqlen_k)
    diag = len_k - len_q
    if CAUSAL and PUBLIC_DIAG:
        # seqlens_q is seqlens_k and Sq == Sk: diag == 0 whatever the lengths, so the blocks past
        # this tile's last row are publicly invisible
        n_blocks = gl.cdiv(gl.minimum(seqlen_k, m0 + BLOCK_M), BLOCK_N)
    else:
        n_blocks = gl.cdiv(seqlen_k, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_shared)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_shared)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_shared)

    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ld_layout))
    q_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld_layout))
    ld_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
    k_offs = _tile_offsets(ld_rows, cols, stride_ks)
    v_offs = _tile_offsets(ld_rows, cols, stride_vs)
    q_base = Q + b.to(gl.int64) * stride_qb + h.to(gl.int64) * stride_qh + m0.to(gl.int64) * stride_qs
    k_base = K + b.to(gl.int64) * stride_kb + hk.to(gl.int64) * stride_kh
    v_base = V + b.to(gl.int64) * stride_vb + hk.to(gl.int64) * stride_vh

    # Group 0 = {Q, K_0}; groups 1..STAGES-1 = {K_t, V_(t-1)}.
    _copy_tile(q_smem, q_base, _tile_offsets(q_rows, cols, stride_qs), q_rows, seqlen_q - m0)
    for t in gl.static_range(STAGES):
        _issue_kv(t, n_blocks, k_base, v_base, k_smem, v_smem, k_offs, v_offs, ld_rows, stride_ks, stride_vs, seqlen_k,
                  BLOCK_N, STAGES)

    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

    # Step 0: S_0 and its softmax.
    _ready(STAGES - 1)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    p, alpha, m_i, l_i = _masked_softmax(s, m_i, l_i, 0, rows, len_k, diag, qk_scale, CAUSAL, BLOCK_N, s_layout)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_blocks):
        # Group j (K_j, V_(j-1)) has landed for everyone, and every warp has finished step j-1, so
        # the slots of K_(j-1) and V_(j-2) are free for group j+STAGES-1.
        _ready(STAGES - 2)
        kj = k_smem.index(j % STAGES).permute((1, 0))
        s_tok = warpgroup_mma(q_smem, kj, s_zero, use_acc=False, is_async=True)
        vj = v_smem.index((j - 1) % STAGES)
        acc_tok = warpgroup_mma(p_op, vj, acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))
        p, alpha, m_i, l_i = _masked_softmax(s, m_i, l_i, j * BLOCK_N, rows, len_k, diag, qk_scale, CAUSAL, BLOCK_N,
                                             s_layout)
        # Refill the slots of K_(j-1) and V_(j-2) (free since the barrier above). Issued here, its
        # public branches also end the basic block: ptxas otherwise hoists the wait below above
        # the exponentials (measured: 0.64x of fast at D=128), and they would no longer overlap
        # P_(j-1) V_(j-1).
        _issue_kv(j + STAGES - 1, n_blocks, k_base, v_base, k_smem, v_smem, k_offs, v_offs, ld_rows, stride_ks, stride_vs,
                  seqlen_k, BLOCK_N, STAGES)
        p_next = gl.convert_layout(p.to(dtype), p_layout)
        acc, p_op, p_next = warpgroup_mma_wait(0, deps=(acc_tok, p_op, p_next))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p_op = p_next

    # Last step: O += P_(n-1) V_(n-1) (group n_blocks).
    _ready(0)
    vl = v_smem.index((n_blocks - 1) % STAGES)
    acc = warpgroup_mma(p_op, vl, acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc, ))

    # Rows that saw no key have l == 0 and acc == 0: divide by 1. Approximate divide: no slow path.
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    inv_l = gl.fdiv(gl.full([BLOCK_M], 1.0, gl.float32, layout=gl.SliceLayout(1, s_layout)), l_safe,
                    ieee_rounding=False)
    row_valid = rows < len_q
    out = acc * gl.expand_dims(gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout)), 1)
    out = gl.where(gl.expand_dims(gl.convert_layout(row_valid, gl.SliceLayout(1, o_layout)), 1), out, 0.0)
    out = gl.convert_layout(out.to(dtype), ld_layout)
    o_ptrs = O + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh + m0.to(gl.int64) * stride_os \
        + _tile_offsets(q_rows, cols, stride_os)
    gl.store(o_ptrs, out, mask=gl.expand_dims(m0 + q_rows < seqlen_q, 1))
    if RETURN_LSE:
        lse = (m_i + gl.log2(l_i)) * 0.6931471805599453  # log2 -> natural log
        lse = gl.where(row_valid, lse, float("-inf"))
        gl.store(LSE + b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh + rows, lse, mask=rows < seqlen_q)


# ---------------------------------------------------------------------------------------------
# Host side: planned once per input signature; a launch only swaps pointers.

def eligible(q, k, v, o, head_dim: int) -> bool:
    """What this kernel supports (besides the caller's: sm_90, secure, dense): 16-bit dtypes, D in
    {64, 128}, and 16-byte aligned bases and outer strides, so every copy is one 16-byte cp.async."""
    from .hopper_fwd import eligible as tma_addressable

    return tma_addressable(q, k, v, o, head_dim)


SMEM_BYTES = 200 * 1024  # of the 227 KiB an H100 block may use; the rest for layout-conversion scratch


class SecureGluonLaunch:
    """A planned launch of :func:`attn_fwd_hopper_secure_kernel`. ``run`` takes the Triton
    kernel's pointer list (q, k, v, o, lse, seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k); v is
    the secure pre-pass's copy."""
    __slots__ = ("step", )

    def __init__(self, q, k, v, o, lse, *, scale: float, causal: bool, secure_public_diag: bool, seqlen_q: int,
                 seqlen_k: int, batch: int, num_heads_q: int, num_heads_kv: int, q_strides, k_strides, v_strides,
                 o_strides, lse_strides, cfg):
        from . import LOG2E, _Step, triton_cdiv

        D = q.shape[-1]
        smem = (cfg.block_m + 2 * cfg.num_stages * cfg.block_n) * D * q.element_size()
        if (cfg.block_m != 128 or cfg.block_n not in (64, 128) or cfg.num_warps != NUM_WARPS or cfg.num_stages < 2
                or smem > SMEM_BYTES):
            raise ValueError(f"gluon_secure config {cfg} unsupported: block_m must be 128 (two 64-row warpgroups), "
                             f"block_n 64 or 128, num_warps {NUM_WARPS}, num_stages >= 2, and Q plus the K/V rings "
                             f"must fit {SMEM_BYTES} bytes of shared memory")
        grid = (triton_cdiv(seqlen_q, cfg.block_m), batch * num_heads_q)
        args = [q, k, v, o, lse if lse is not None else q, q, q, scale * LOG2E, *q_strides, *k_strides, *v_strides,
                *o_strides, *lse_strides, seqlen_q, seqlen_k, num_heads_q, num_heads_q // num_heads_kv]
        constexprs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=D, STAGES=cfg.num_stages,
                          CAUSAL=bool(causal), PUBLIC_DIAG=bool(causal and secure_public_diag),
                          RETURN_LSE=lse is not None)
        self.step = _Step(attn_fwd_hopper_secure_kernel, grid, args, 7, constexprs, NUM_WARPS, 1)

    def run(self, ptrs, device) -> None:
        self.step.run(ptrs[:7], device)
