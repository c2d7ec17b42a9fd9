"""Launches of the backward kernels (``kernels/triton/bwd.py``): the pre-pass, dK/dV, then dQ (its own kernel,
deterministic) or the conversion of the atomically accumulated fp32 dQ.

Tensors arrive as [B, H, S, D] views of the caller's layout (dense) or packed [total, H, D] (varlen, with
``cu_seqlens``); only strides are read, so any layout with a unit last stride works. The gradients are
allocated here, in the layout of the tensor they belong to."""
from __future__ import annotations

import torch

from ..kernels.triton.bwd import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel
from ..kernels.triton.fwd import LOG2E
from ..plan.backward import BwdConfig
from ..plan.tables import block_d
from ..runtime import cdiv, interpreting


def _strides(t: torch.Tensor, varlen: bool) -> tuple:
    """(batch, head, seq) element strides; packed tensors have no batch stride (``cu_seqlens`` place them)."""
    if varlen:
        return 0, t.stride(1), t.stride(0)
    return t.stride(0), t.stride(1), t.stride(2)


def _grad_like(t: torch.Tensor, varlen: bool) -> torch.Tensor:
    # Packed rows past cu_seqlens[-1] belong to no sequence and no program writes them: they start at zero.
    return torch.zeros_like(t) if varlen else torch.empty_like(t)


def run_backward(dout, q, k, v, out, lse, dlse, *, q_user, k_user, v_user, as_view, cu_seqlens_q=None,
                 cu_seqlens_k=None, seqlen_q: int, seqlen_k: int, scale: float, causal: bool,
                 config: BwdConfig):
    """Gradients (dq, dk, dv) in the layouts of ``q_user``/``k_user``/``v_user`` (the caller's tensors).

    ``q``/``k``/``v``/``out``/``dout``: the kernels' views ([B, H, S, D] dense, packed varlen); ``as_view``
    maps a caller-layout gradient to that view. ``lse``: the forward's natural-log logsumexp ([B, H, S] or
    [H, total], contiguous); ``dlse``: its gradient or None. ``seqlen_*``: the dense lengths, or the varlen
    maxima."""
    varlen = cu_seqlens_q is not None
    cfg = config
    head_dim = q.shape[-1]
    bd = block_d(head_dim)
    if varlen:
        batch, num_heads_q, num_heads_kv = cu_seqlens_q.shape[0] - 1, q.shape[1], k.shape[1]
    else:
        batch, num_heads_q, num_heads_kv = q.shape[0], q.shape[1], k.shape[1]
    dq_user, dk_user, dv_user = (_grad_like(t, varlen) for t in (q_user, k_user, v_user))
    dq, dk, dv = as_view(dq_user), as_view(dk_user), as_view(dv_user)
    if batch == 0 or seqlen_q == 0 or seqlen_k == 0:
        if not varlen:
            for g in (dq, dk, dv):
                g.zero_()
        return dq_user, dk_user, dv_user
    lse = lse.contiguous()
    delta = torch.empty_like(lse)
    lse2 = torch.empty_like(lse)
    lse_strides = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    cu_q = cu_seqlens_q if varlen else lse  # an unused pointer still needs a tensor
    cu_k = cu_seqlens_k if varlen else lse
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    pre_m = 32 if interpreting() else 64
    attn_bwd_preprocess_kernel[(cdiv(seqlen_q, pre_m), batch * num_heads_q)](
        out, dout, lse, dlse if dlse is not None else lse, delta, lse2, cu_q,
        *_strides(out, varlen), *_strides(dout, varlen), *lse_strides, seqlen_q, num_heads_q,
        HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_M=pre_m, VARLEN=varlen, HAS_DLSE=dlse is not None, num_warps=4)

    atomic = cfg.atomic_dq
    dq_acc = None
    if atomic:
        dq_acc = torch.zeros(dq.shape, dtype=torch.float32, device=q.device)
    dq_target = dq_acc if atomic else dq
    common = dict(HEAD_DIM=head_dim, BLOCK_D=bd, CAUSAL=bool(causal), VARLEN=varlen, PRECISION=precision)
    attn_bwd_dkdv_kernel[(cdiv(seqlen_k, cfg.block_n1), batch * num_heads_kv)](
        q, k, v, dout, dk, dv, dq_target, lse2, delta, cu_q, cu_k,
        scale * LOG2E, scale,
        *_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(dout, varlen),
        *_strides(dk, varlen), *_strides(dv, varlen), *_strides(dq_target, varlen), *lse_strides,
        seqlen_q, seqlen_k, num_heads_kv, num_heads_q // num_heads_kv,
        BLOCK_M=cfg.block_m1, BLOCK_N=cfg.block_n1, ATOMIC_DQ=atomic, **common,
        EVEN_N=not varlen and seqlen_k % cfg.block_n1 == 0,
        num_warps=cfg.num_warps1, num_stages=cfg.num_stages1)
    if atomic:
        dq.copy_(dq_acc)
    else:
        attn_bwd_dq_kernel[(cdiv(seqlen_q, cfg.block_m2), batch * num_heads_q)](
            q, k, v, dout, dq, lse2, delta, cu_q, cu_k,
            scale * LOG2E, scale,
            *_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(dout, varlen),
            *_strides(dq, varlen), *lse_strides,
            seqlen_q, seqlen_k, num_heads_q, num_heads_q // num_heads_kv,
            BLOCK_M=cfg.block_m2, BLOCK_N=cfg.block_n2, **common,
            num_warps=cfg.num_warps2, num_stages=cfg.num_stages2)
    return dq_user, dk_user, dv_user
