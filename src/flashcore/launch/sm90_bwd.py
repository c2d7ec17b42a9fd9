"""Launch builder of the sm_90 Gluon dK/dV kernel (``kernels/sm90/bwd.py``).

Built once per tensor metadata (inside a :class:`~flashcore.launch.triton_bwd.BackwardLaunch`); ``run`` rebuilds
the TMA descriptors (Q, K, V, dO, lse2, delta, and the fp32 dQ buffer in the fused form) from the call's pointers."""
from __future__ import annotations

import torch
from triton.experimental.gluon import language as gl

from ..kernels.sm90.bwd import attn_bwd_dkdv_hopper_kernel
from ..kernels.sm90.gluon_compat import async_atomic_add
from ..plan.tables import triton_minor
from ..runtime import KernelStep, cdiv
from ..runtime.tma import addressable, make_descriptors

DESC_ARGS = 7  # q, k, v, dO, the pre-pass's lse2 and delta, and (fused dQ by the copy engine) the fp32 dQ buffer
KEY_ROWS = 64  # key rows per consumer warpgroup
# Register budgets (setmaxnreg), as the forward's: the loader warp needs almost nothing, each consumer warpgroup holds
# dK and dV of its 64 keys (64 + 64 fp32 registers at D=128) beside the step's S^T and dP^T tiles.
LOADER_REGS = 24
# Program order: (batch entry x K/V head) pairs in chunks of this many, key tiles outer within a chunk (the kernel's
# _steps says why); 1 is head-major order
HEAD_CHUNK = 4
# The planner's form (dQ on its own kernel) stores P^T and dS^T to shared memory for its dV and dK products with these
# consumer warpgroup counts, and keeps them in registers otherwise (v33, H200, same run: two warpgroups at D=128 4-6%
# faster through shared memory, one at D=64 7-10% faster in registers)
OPERANDS_SMEM_WG = (2, )
# Fused dQ: sets of every warpgroup's dS^T in shared memory (how far a warpgroup may run ahead of the others)
DS_SETS = 2
# Fused dQ, by causal: P^T as the dV product's register operand (RS_DV), and the swizzle of the fp32 tile each
# warpgroup stages its dQ share in for the copy engine. The accumulator's 8-byte stores into the 128-byte swizzle meet
# 2-way bank conflicts (ncu: 2x the ideal shared-memory wavefronts), and their addresses made the non-causal form spill
# 9 words; the 32-byte swizzle (eight 8-column boxes, the copy engine's messages issued by four threads) stores
# conflict-free and spills nothing. Non-causal runs both, 2.3-5.6% faster at 4x32x4096x128 (v35, H100, three same-run
# A/Bs); causal keeps the v33 form: the two changes tied or lost 0.3-2.6% at 4x32x4096x128 causal and spill 20 bytes
# there.
FUSED_FORM = {False: dict(rs_dv=True, dq_swizzle=32), True: dict(rs_dv=False, dq_swizzle=128)}
# The ordered (deterministic) fused form's staging tile swizzle: its dQ-writer warp issues the reduce of a 32-byte
# swizzled tile as eight messages in a row from one thread, the 128-byte one as one (v41, H200, same-run A/B at
# 4x32x4096x128: 0.89 -> 0.99x the default's speed; 1x32x16384x128 0.86 -> 0.96)
ORDERED_DQ_SWIZZLE = 128
# Toolchains that do not fit RS_DV's form in its registers: ptxas 13.4 (Triton 3.9) spills 15-19 words of it (none
# without it; CPU compile). They run the non-causal form with the 32-byte staging tile only (2% faster than v33's on
# 3.6, H100); not timed on 3.9.
RS_DV_SPILLS = ("3.9", )
# Fused dQ with steps of 64 queries per consumer warpgroup (BLOCK_M = 64 * NUM_WG, two warpgroups: the 128-query
# step FA4 takes at D=64) fits the consumers' 240 registers only with three savings (perf-notes v38; CPU compile,
# sm_90a: 215 words spilled non-causal, 88 causal, without them; none and 1 with them): dQ split along the queries
# (each warpgroup its own 64 rows, every column: N = D, not D / 2), P^T rounded to 16 bits as soon as it is formed
# (dS^T from it), and lse2 and delta as the S^T and dP^T products' starting values (held only while they are issued).
# The planner's D=64 row since v39 (plan.backward.WIDE_D64), with P^T rounded two at a time and 1 / scale taken once.
# widen_asm (v40): the 16-bit P^T widened back to fp32 for dS^T by two integer operations per pair of values
# (kernels.sm90.bwd._widen_pairs) instead of `.to(float32)`'s byte permutes and IMADs: 7% fewer instructions per step,
# the same gradients bit for bit (dK, dV); causal 2.4-5.3% faster, non-causal tied (H200, same-run A/B)
WIDE_STEP = dict(dq_split_q=True, p_bf16=True, bias_in_acc=True, widen_asm=True)
# Toolchains whose ptxas spills more of the causal wide step with widen_asm (ptxas 13.4, Triton 3.9: 10 STL / 18 LDL,
# some in the main loop, against 4 / 12 without; CPU compile). They keep `.to(float32)`; not timed on 3.9.
WIDEN_SPILLS = ("3.9", )
# consumer warpgroups -> (consumer registers, launch register cap): 2 x 128 x 240 + 128 x 24 fits the 64K file
REGISTERS = {1: (232, 128), 2: (240, 168)}


def wide_step(block_m: int, block_n: int) -> bool:
    """The fused form's 128-query step: two (or more) consumer warpgroups, a query tile of 64 rows per warpgroup."""
    num_wg = block_n // KEY_ROWS
    return num_wg > 1 and block_m == KEY_ROWS * num_wg


def hopper_dkdv_serves(q, k, v, dout, dk, dv, *, varlen: bool) -> bool:
    """The Gluon dK/dV kernel runs this backward: dense, bf16/fp16, D 64 or 128, every [B, H, S, D] view the copy
    engine can address (16-byte aligned base and outer strides, none of them 0: an expanded gradient) and unit last
    strides for dK/dV."""
    return (not varlen and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] in (64, 128)
            and all(addressable(t) and t.stride(-1) == 1 and min(t.stride()) > 0 for t in (q, k, v, dout))
            and dk.stride(-1) == 1 and dv.stride(-1) == 1)


def ordered_dq_serves(block_m: int, block_n: int, num_heads_q: int, num_heads_kv: int) -> bool:
    """The fused dQ in a fixed order (``dq_ordered``, deterministic) runs this form: the copy engine's reduce-add (a
    Triton that has it), 64-query steps on two consumer warpgroups (the kernel's dQ-writer partition is built beside
    two; with one, its consumers would wait at a named barrier nobody arrives at), no GQA (with GQA the fused form
    adds dK/dV up over the group in a varying order)."""
    return (async_atomic_add is not None and (block_m, block_n) == (KEY_ROWS, 2 * KEY_ROWS)
            and num_heads_q == num_heads_kv)


class HopperDkdvLaunch:
    """A planned launch of :func:`attn_bwd_dkdv_hopper_kernel`; ``run(q, k, v, dout, dk, dv, lse2, delta)`` with
    [B, H, S, D] views shaped and strided as planned; lse2/delta are the pre-pass's outputs in contiguous buffers of
    ``ws_shape`` ([B, H, S_pad], S_pad a multiple of the query tile)."""
    __slots__ = ("step", "geom", "turns_size")

    def __init__(self, q, k, v, dout, dk, dv, ws_shape, *, seqlen_q: int, seqlen_k: int, scale: float,
                 qk_scale: float, causal: bool, block_m: int, block_n: int, num_warps: int, stages: int,
                 dq_accum=None, split_group: bool = False, dq_ordered: bool = False):
        """``dq_accum``: a representative fp32 dQ buffer ([B, H, S, D] view) where the kernel adds dQ itself
        (``FUSED_DQ``: the TMA reduce-add, else per-thread atomics; not deterministic); None: dQ is left to the Triton
        dQ kernel. ``split_group``: with dQ fused and GQA, one program per query head, adding its share of dK/dV
        into ``dk``/``dv``, which are then fp32 buffers. ``dq_ordered``: the fused dQ added in a fixed order of key
        tiles (deterministic; ``run`` then takes a zeroed int32 buffer of ``turns_size`` elements, the kernel's
        ``DQ_ORDERED``): the copy engine's reduce-add only, and a program per K/V head (no split_group)."""
        D = q.shape[-1]
        num_wg = block_n // KEY_ROWS
        if block_n != num_wg * KEY_ROWS or num_wg not in REGISTERS or num_warps != 4 * num_wg:
            raise ValueError(f"the Hopper dK/dV kernel takes 64 key rows per consumer warpgroup (one or two): "
                             f"got a {block_n}-key tile on {num_warps} warps")
        gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
        lay_m = gl.NVMMASharedLayout.get_default_for([1, 1, block_m, D], gdt)
        lay_n = gl.NVMMASharedLayout.get_default_for([1, 1, KEY_ROWS, D], gdt)
        self.geom = tuple((list(t.shape), list(t.stride()), [1, 1, rows, D], lay)
                          for t, rows, lay in ((q, block_m, lay_m), (k, KEY_ROWS, lay_n), (v, KEY_ROWS, lay_n),
                                               (dout, block_m, lay_m)))
        # lse2 and delta ([B, H, S_pad] fp32, S_pad a multiple of block_m): one row of block_m per step, unswizzled
        ws_batch, ws_heads, pad = ws_shape
        if pad % block_m:
            raise ValueError(f"the pre-pass's rows ({pad}) must be whole {block_m}-query tiles")
        lay_w = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
        self.geom += (([ws_batch, ws_heads, pad], [ws_heads * pad, pad, 1], [1, 1, block_m], lay_w), ) * 2
        # fused dQ: added by the copy engine (TMA reduce-add) where this Triton has it, else by atomics
        fused = dq_accum is not None
        dq_tma = fused and async_atomic_add is not None
        wide = fused and wide_step(block_m, block_n)
        split_q = wide and WIDE_STEP["dq_split_q"]
        if dq_tma:
            cols = D if split_q else D // num_wg
            swizzle = ORDERED_DQ_SWIZZLE if dq_ordered else FUSED_FORM[bool(causal)]["dq_swizzle"]
            lay_dq = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=32, rank=4)
            rows = block_m // num_wg if split_q else block_m
            self.geom += ((list(dq_accum.shape), list(dq_accum.stride()), [1, 1, rows, cols], lay_dq), )
        batch, num_heads_q, num_heads_kv = q.shape[0], q.shape[1], k.shape[1]
        if dq_ordered and not (fused and ordered_dq_serves(block_m, block_n, num_heads_q, num_heads_kv)):
            raise ValueError("dq_ordered is the fused form's copy-engine reduce-add at 64-query steps, without GQA")
        # the ordered dQ's counters, one per (batch entry, query head, query tile)
        self.turns_size = batch * num_heads_q * cdiv(seqlen_q, block_m) if dq_ordered else 0
        # one-dimensional, in chunks of HEAD_CHUNK heads (the kernel's _steps); split_group (the fused form with GQA,
        # v33.7): one program per query head, not per group, its dK/dV added into dk/dv, fp32 buffers then
        split = split_group
        if split and not (fused and num_heads_q > num_heads_kv and dk.dtype == dv.dtype == torch.float32):
            raise ValueError("split_group is the fused form with GQA, adding dK/dV into fp32 dk and dv")
        grid = ((num_heads_q if split else num_heads_kv) * batch * cdiv(seqlen_k, block_n), 1)
        ws = torch.empty(ws_shape, dtype=torch.float32)  # representative (the descriptors' shapes only)
        dq_strides = tuple(dq_accum.stride()[:3]) if fused else (0, 0, 0)
        turns = torch.empty(self.turns_size, dtype=torch.int32) if dq_ordered else dk  # representative (unused: dk)
        args = [*self.descriptors(q, k, v, dout, ws, ws, dq_accum), dk, dv, dq_accum if fused else dk, turns, qk_scale,
                scale, seqlen_q, seqlen_k, num_heads_kv, num_heads_q // num_heads_kv, HEAD_CHUNK, dk.stride(0),
                dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2), *dq_strides]
        consumer_regs, maxnreg = REGISTERS[num_wg]
        constexprs = dict(BLOCK_M=block_m, HEAD_DIM=D, STAGES=stages, CAUSAL=bool(causal), NUM_WG=num_wg,
                          CONSUMER_WG_REGS=consumer_regs, LOADER_WG_REGS=LOADER_REGS, FUSED_DQ=fused, DQ_TMA=dq_tma,
                          OPERANDS_SMEM=num_wg in OPERANDS_SMEM_WG, DS_SETS=DS_SETS, SPLIT_GROUP=split,
                          RS_DV=fused and FUSED_FORM[bool(causal)]["rs_dv"] and triton_minor() not in RS_DV_SPILLS,
                          DQ_SPLIT_Q=split_q, P_BF16=wide and WIDE_STEP["p_bf16"],
                          BIAS_IN_ACC=wide and WIDE_STEP.get("bias_in_acc", False),
                          WIDEN_ASM=wide and WIDE_STEP.get("widen_asm", False) and triton_minor() not in WIDEN_SPILLS,
                          DQ_ORDERED=bool(dq_ordered),
                          DQ_WRITER=bool(dq_ordered) or (dq_tma and not wide and num_wg == 2
                                                         and FUSED_FORM[bool(causal)].get("dq_writer", False)))
        self.step = KernelStep(attn_bwd_dkdv_hopper_kernel, grid, args, DESC_ARGS + 4, constexprs, 4, 1,
                               options=dict(maxnreg=maxnreg))

    def descriptors(self, q, k, v, dout, lse2, delta, dq_accum=None) -> list:
        """The kernel's descriptor arguments (the dQ buffer's only where the plan reduces into it by TMA)."""
        tensors = (q, k, v, dout, lse2, delta) + ((dq_accum, ) if len(self.geom) == DESC_ARGS else ())
        return make_descriptors(tensors, self.geom, DESC_ARGS)

    def run(self, q, k, v, dout, dk, dv, lse2, delta, dq_accum=None, dq_turns=None) -> None:
        """``dq_accum``: the zeroed fp32 dQ buffer, where the launch was planned with one; ``dq_turns``: the zeroed
        int32 counters (``turns_size``), where it was planned ordered."""
        if self.turns_size and (dq_turns is None or dq_turns.numel() < self.turns_size):
            raise ValueError(f"dq_turns: the ordered dQ needs {self.turns_size} zeroed int32 counters")
        self.step.run((*self.descriptors(q, k, v, dout, lse2, delta, dq_accum), dk, dv,
                       dq_accum if dq_accum is not None else dk, dq_turns if dq_turns is not None else dk), q.device)
