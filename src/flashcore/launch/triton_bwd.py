"""Launches of the backward kernels (``kernels/triton/bwd.py``): the pre-pass, dK/dV, then dQ (its own kernel,
deterministic) or the conversion of the atomically accumulated fp32 dQ.

Tensors arrive as [B, H, S, D] views of the caller's layout (dense) or packed [total, H, D] (varlen, with
``cu_seqlens``); only strides are read, so any layout with a unit last stride works. A :class:`BackwardLaunch` is
built once per tensor metadata (the plan cache holds it, as a forward plan) and replayed with new pointers: its
three :class:`~flashcore.runtime.KernelStep` s skip Triton's argument binding after the first call, which is most of
the host time of a small backward."""
from __future__ import annotations

import torch

from ..kernels.triton.bwd import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel
from ..kernels.triton.fwd import LOG2E
from ..plan.backward import BwdConfig
from ..plan.tables import block_d
from ..runtime import KernelStep, cdiv, interpreting
from .sm90_bwd import HopperDkdvLaunch, hopper_dkdv_serves, ordered_dq_serves, wide_step

# The fused Gluon form with GQA, by its step (True: the 128-query step, launch.sm90_bwd.wide_step): one program per
# query head, dK/dV added up over the group in fp32 buffers (True; v33.7, the 64-query step at D=128), or one per K/V
# head walking its query heads (False; v39, D=64's 128-query step: 0.90-0.97x the time of the split form at 8x16/2x2048,
# 8x16/8x2048 causal, 4x64/8x4096 causal and 2x16/8x8192 causal, H200: two runs, a process each, in one device call,
# whose rows without GQA agree within 1-3%).
# bench.experiments.bwd_configs --split-group sets both.
SPLIT_GROUP = {False: True, True: False}


def _strides(t: torch.Tensor, varlen: bool) -> tuple:
    """(batch, head, seq) element strides; packed tensors have no batch stride (``cu_seqlens`` place them)."""
    if varlen:
        return 0, t.stride(1), t.stride(0)
    return t.stride(0), t.stride(1), t.stride(2)


class BackwardLaunch:
    """The backward of one tensor metadata: ``run(...)`` returns (dq, dk, dv) in the layouts of the caller's q, k, v.

    Built from representative tensors: ``q_user``/``k_user``/``v_user`` in the caller's layout, ``as_view`` maps
    them to the kernels' views ([B, H, S, D] dense, packed varlen), ``out``/``dout`` are such views already, ``lse`` is the forward's
    natural-log logsumexp ([B, H, S] or [H, total], contiguous) and ``has_dlse`` says whether its gradient comes
    too. ``seqlen_*``: the dense lengths, or the varlen maxima."""
    __slots__ = ("varlen", "as_view", "atomic", "ordered", "split", "pre", "dkdv", "hopper_dkdv", "dq", "empty",
                 "ws_shape")

    def __init__(self, dout, q_user, k_user, v_user, out, lse, *, has_dlse: bool, as_view, varlen: bool,
                 num_seqs: int, seqlen_q: int, seqlen_k: int, scale: float, causal: bool, config: BwdConfig):
        cfg = config
        self.varlen, self.as_view = varlen, as_view
        q, k, v = as_view(q_user), as_view(k_user), as_view(v_user)
        head_dim = q.shape[-1]
        bd = block_d(head_dim)
        batch = num_seqs if varlen else q.shape[0]
        num_heads_q, num_heads_kv = q.shape[1], k.shape[1]
        self.empty = batch == 0 or seqlen_q == 0 or seqlen_k == 0
        lse_strides = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
        # the gradients' strides, as run() allocates them: like the caller's tensors, seen through the view
        dq, dk, dv = (as_view(torch.empty_like(t)) for t in (q_user, k_user, v_user))
        # dK/dV on the Hopper kernel where the configuration asks for it and the views suit the copy engine
        use_hopper = bool(cfg.gluon_dkdv) and hopper_dkdv_serves(q, k, v, dout, dk, dv, varlen=varlen)
        # dQ added inside the dK/dV kernel: a Gluon form's reduce-add only where the Gluon kernel runs (the Triton
        # kernel's per-thread atomics were slower everywhere: then the dQ kernel runs), or an explicit Triton one's
        self.atomic = cfg.atomic_dq and (use_hopper or not cfg.gluon_dkdv)
        # deterministic's fused dQ, in a fixed order: the Gluon form's reduce-add without GQA only; elsewhere the dQ
        # kernel (never the atomics)
        self.ordered = (cfg.ordered_dq and self.atomic and use_hopper
                        and ordered_dq_serves(*cfg.gluon_dkdv[:2], num_heads_q, num_heads_kv))
        if cfg.ordered_dq and not self.ordered:
            self.atomic = False
        # with GQA the fused Gluon form runs a program per query head and adds dK/dV into fp32 buffers, where
        # SPLIT_GROUP says so for its step
        self.split = (self.atomic and use_hopper and num_heads_q > num_heads_kv
                      and SPLIT_GROUP[wide_step(*cfg.gluon_dkdv[:2])])
        # the fp32 dQ buffer of the atomic forms is laid out like the caller's q, so that its conversion at the end
        # is a contiguous copy (a [B, H, S, D] buffer made it a strided one: ~2x slower at 4x32x4096x128, v33)
        dq_target = as_view(torch.empty_like(q_user, dtype=torch.float32)) if self.atomic else dq
        precision = "ieee" if q.dtype == torch.float32 else "tf32"
        # The Hopper kernel copies delta and lse2 in whole query tiles, so they get their own buffers padded to a
        # tile multiple ([B, H, S_pad]); otherwise they are shaped and strided like lse.
        if use_hopper:
            pad = cdiv(seqlen_q, cfg.gluon_dkdv[0]) * cfg.gluon_dkdv[0]
            self.ws_shape = (batch, num_heads_q, pad)
            ws_strides = (num_heads_q * pad, pad)
        else:
            pad, self.ws_shape, ws_strides = seqlen_q, None, lse_strides
        pre_m = 32 if interpreting() else 64
        self.pre = KernelStep(
            attn_bwd_preprocess_kernel, (cdiv(pad, pre_m), batch * num_heads_q),
            [None] * 7 + [*_strides(out, varlen), *_strides(dout, varlen), *lse_strides, *ws_strides, seqlen_q,
                          num_heads_q, pad],
            7, dict(HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_M=pre_m, VARLEN=varlen, HAS_DLSE=has_dlse), 4, 1)
        common = dict(HEAD_DIM=head_dim, BLOCK_D=bd, CAUSAL=bool(causal), VARLEN=varlen, PRECISION=precision)
        qkv_strides = [*_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(dout, varlen)]
        self.hopper_dkdv = None
        if use_hopper:
            dk_target, dv_target = ((as_view(torch.empty_like(t, dtype=torch.float32)) for t in (k_user, v_user))
                                    if self.split else (dk, dv))
            self.hopper_dkdv = HopperDkdvLaunch(
                q, k, v, dout, dk_target, dv_target, self.ws_shape, seqlen_q=seqlen_q, seqlen_k=seqlen_k, scale=scale,
                qk_scale=scale * LOG2E, causal=causal, block_m=cfg.gluon_dkdv[0], block_n=cfg.gluon_dkdv[1],
                num_warps=cfg.gluon_dkdv[2], stages=cfg.gluon_dkdv[3], dq_accum=dq_target if self.atomic else None,
                split_group=self.split, dq_ordered=self.ordered)
        self.dkdv = None if self.hopper_dkdv is not None else KernelStep(
            attn_bwd_dkdv_kernel, (cdiv(seqlen_k, cfg.block_n1), batch * num_heads_kv),
            [None] * 11 + [scale * LOG2E, scale, *qkv_strides, *_strides(dk, varlen), *_strides(dv, varlen),
                           *_strides(dq_target, varlen), *ws_strides, seqlen_q, seqlen_k, num_heads_kv,
                           num_heads_q // num_heads_kv],
            11, dict(BLOCK_M=cfg.block_m1, BLOCK_N=cfg.block_n1, ATOMIC_DQ=self.atomic, **common,
                     EVEN_N=not varlen and seqlen_k % cfg.block_n1 == 0), cfg.num_warps1, cfg.num_stages1)
        self.dq = None if self.atomic else KernelStep(
            attn_bwd_dq_kernel, (cdiv(seqlen_q, cfg.block_m2), batch * num_heads_q),
            [None] * 9 + [scale * LOG2E, scale, *qkv_strides, *_strides(dq, varlen), *ws_strides, seqlen_q, seqlen_k,
                          num_heads_q, num_heads_q // num_heads_kv],
            9, dict(BLOCK_M=cfg.block_m2, BLOCK_N=cfg.block_n2, **common), cfg.num_warps2, cfg.num_stages2)

    def run(self, dout, q_user, k_user, v_user, out, lse, dlse, cu_seqlens_q=None, cu_seqlens_k=None):
        """``dout``/``out``: the kernels' views; ``q_user``/``k_user``/``v_user``: the caller's tensors."""
        varlen, device = self.varlen, q_user.device
        # Packed rows past cu_seqlens[-1] belong to no sequence and no program writes them: they start at zero.
        new = torch.zeros_like if varlen or self.empty else torch.empty_like
        dq_user, dk_user, dv_user = new(q_user), new(k_user), new(v_user)
        if self.empty:
            return dq_user, dk_user, dv_user
        view = self.as_view
        q, k, v, dq, dk, dv = view(q_user), view(k_user), view(v_user), view(dq_user), view(dk_user), view(dv_user)
        if self.ws_shape is None:
            delta, lse2 = torch.empty_like(lse), torch.empty_like(lse)
        else:
            delta, lse2 = (torch.empty(self.ws_shape, dtype=torch.float32, device=device) for _ in range(2))
        cu_q = cu_seqlens_q if varlen else lse  # an unused pointer still needs a tensor
        cu_k = cu_seqlens_k if varlen else lse
        self.pre.run((out, dout, lse, dlse if dlse is not None else lse, delta, lse2, cu_q), device)
        dq_target = view(torch.zeros_like(q_user, dtype=torch.float32)) if self.atomic else dq
        if self.hopper_dkdv is not None:
            if self.split:  # dK/dV added up over each group's query heads, in fp32
                dk_target, dv_target = (view(torch.zeros_like(t, dtype=torch.float32)) for t in (k_user, v_user))
            else:
                dk_target, dv_target = dk, dv
            turns = (torch.zeros(self.hopper_dkdv.turns_size, dtype=torch.int32, device=device) if self.ordered
                     else None)
            self.hopper_dkdv.run(q, k, v, dout, dk_target, dv_target, lse2, delta,
                                 dq_target if self.atomic else None, turns)
            if self.split:
                dk.copy_(dk_target)
                dv.copy_(dv_target)
        else:
            self.dkdv.run((q, k, v, dout, dk, dv, dq_target, lse2, delta, cu_q, cu_k), device)
        if self.atomic:
            dq.copy_(dq_target)
        else:
            self.dq.run((q, k, v, dout, dq, lse2, delta, cu_q, cu_k), device)
        return dq_user, dk_user, dv_user
