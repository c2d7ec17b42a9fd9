"""PyTorch custom ops around the Triton launchers.

Registered with ``torch.library`` (with fake implementations) so ``torch.compile(fullgraph=True)``
traces through them; the real implementations allocate with the caching allocator and never
sync the host (except the documented eager-only input checks), so CUDA-graph capture works.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import kernels
from . import reference as _ref

Tensor = torch.Tensor


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class DenseCall:
    """Everything a dense call decides from metadata alone (output buffers, the launch plan, the
    secure-length check), replayable on tensors with the same metadata: ``api.attention`` keeps
    one per input signature, so a repeat call skips validation and planning.

    Calling it returns ``(out, lse or None)``; q/k/v/out are the caller's tensors (any layout the
    plan was made for: only their pointers are read)."""
    __slots__ = ("plan", "out_shape", "dtype", "device", "lse_shape", "secure", "validate", "seqlen_q", "seqlen_k")

    def __init__(self, plan, out_shape, dtype, device, lse_shape, secure, validate, seqlen_q, seqlen_k):
        self.plan, self.out_shape, self.dtype, self.device, self.lse_shape = plan, out_shape, dtype, device, lse_shape
        self.secure, self.validate, self.seqlen_q, self.seqlen_k = secure, validate, seqlen_q, seqlen_k

    def __call__(self, q, k, v, seqlens_q, seqlens_k, out=None):
        if out is None:
            out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        lse = None if self.lse_shape is None else torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        if self.secure:
            if seqlens_q is None:
                seqlens_q = seqlens_k  # self-attention: the query lengths are the key lengths
            if self.validate and not _capturing(self.device):
                # One bit reaches the host: whether every length is in range. Never the lengths.
                Sq, Sk = self.seqlen_q, self.seqlen_k
                bad = ((seqlens_q < 0) | (seqlens_q > Sq)).any() | ((seqlens_k < 0) | (seqlens_k > Sk)).any()
                if bool(bad):
                    raise ValueError(f"seqlens_q must lie in [0, {Sq}] and seqlens_k in [0, {Sk}] (the padded lengths)")
        self.plan.launch(q, k, v, out, lse, seqlens_q, seqlens_k)
        return out, lse


def dense_call(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, out=None, config=None,
               validate=True) -> DenseCall:
    """Plan a dense call (q/k/v in the caller's layout, already validated)."""
    # Index q/k/v/out as [B, H, S, D] through strides.
    qb, kb, vb = (t.transpose(1, 2) if bshd else t for t in (q, k, v))
    B, Hq, Sq, D = qb.shape
    Hkv, Sk = kb.shape[1], kb.shape[2]
    o = out if out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)  # caller's layout
    ob = o.transpose(1, 2) if bshd else o
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device) if return_lse else None
    public_diag = bool(secure and causal and Sq == Sk and (seqlens_q is None or seqlens_q is seqlens_k))
    if secure and seqlens_q is None:
        seqlens_q = seqlens_k
    plan = kernels.plan_attention(
        qb, kb, vb, ob, lse, seqlens_q=seqlens_q, seqlens_k=seqlens_k, cu_seqlens_q=None, cu_seqlens_k=None,
        scale=scale, causal=causal, secure=secure, secure_public_diag=public_diag,
        seqlen_q=Sq, seqlen_k=Sk, batch=B, num_heads_q=Hq, num_heads_kv=Hkv,
        q_strides=qb.stride()[:3], k_strides=kb.stride()[:3], v_strides=vb.stride()[:3], o_strides=ob.stride()[:3],
        lse_strides=(Hq * Sq, Sq), config=config,
    )
    return DenseCall(plan, tuple(q.shape), q.dtype, q.device, (B, Hq, Sq) if return_lse else None, bool(secure),
                     bool(validate), Sq, Sk)


def _dense_impl(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, out=None, config=None,
                validate=True):
    call = dense_call(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, out, config, validate)
    res, lse = call(q, k, v, seqlens_q, seqlens_k, out)
    return res, (lse if lse is not None else q.new_empty((0,), dtype=torch.float32))


@torch.library.custom_op("flashcore::attention_fwd", mutates_args=())
def _attention_fwd_op(q: Tensor, k: Tensor, v: Tensor, seqlens_q: Optional[Tensor], seqlens_k: Optional[Tensor],
                      causal: bool, scale: float, bshd: bool, secure: bool, return_lse: bool,
                      validate: bool) -> tuple[Tensor, Tensor]:
    return _dense_impl(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, validate=validate)


@_attention_fwd_op.register_fake
def _(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, validate):
    B, Hq, Sq = (q.shape[0], q.shape[2], q.shape[1]) if bshd else q.shape[:3]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty((B, Hq, Sq) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def attention_fwd(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, out=None, validate=True):
    if torch.compiler.is_compiling():
        # The op boundary loses tensor identity, so self-attention is passed as seqlens_q=None.
        if seqlens_q is seqlens_k:
            seqlens_q = None
        res, lse = torch.ops.flashcore.attention_fwd(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure,
                                                     return_lse, validate)
        return (out.copy_(res) if out is not None else res), lse
    # Eager: skip the dispatcher round trip (a few µs that matter on small shapes).
    return _dense_impl(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, out, validate=validate)


def _varlen_impl(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, out=None):
    if not _capturing(q.device):
        _ref.check_cu_seqlens(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)
    total_q, Hq, D = q.shape
    Hkv = k.shape[1]
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((Hq, total_q), dtype=torch.float32, device=q.device) if return_lse else None
    n = cu_q.shape[0] - 1
    kernels.launch_attention(
        q, k, v, out, lse, seqlens_q=None, seqlens_k=None, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        scale=scale, causal=causal, secure=False, secure_public_diag=False,
        seqlen_q=max_q, seqlen_k=max_k, batch=n, num_heads_q=Hq, num_heads_kv=Hkv,
        q_strides=(0, q.stride(1), q.stride(0)), k_strides=(0, k.stride(1), k.stride(0)),
        v_strides=(0, v.stride(1), v.stride(0)), o_strides=(0, out.stride(1), out.stride(0)),
        lse_strides=(0, total_q),
    )
    return out, (lse if return_lse else q.new_empty((0,), dtype=torch.float32))


@torch.library.custom_op("flashcore::attention_varlen_fwd", mutates_args=())
def _attention_varlen_fwd_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                             max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: float,
                             return_lse: bool) -> tuple[Tensor, Tensor]:
    return _varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, return_lse)


@_attention_varlen_fwd_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, return_lse):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty((q.shape[1], q.shape[0]) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def attention_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, out=None):
    if torch.compiler.is_compiling():
        res, lse = torch.ops.flashcore.attention_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse)
        return (out.copy_(res) if out is not None else res), lse
    return _varlen_impl(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, out)
