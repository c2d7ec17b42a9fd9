"""Float64 reference attention: the ground truth every kernel is tested against.

Same semantics as :mod:`flashcore.api`: bottom-right causal alignment, rows that see no key
output zeros with logsumexp ``-inf``, GQA by head grouping. Computes in float64 on the inputs'
device; meant for tests and correctness checks, not speed.
"""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor


def _visible(Sq: int, Sk: int, causal: bool, len_q=None, len_k=None, device=None) -> Tensor:
    """Boolean [Sq, Sk] (or [B, 1, Sq, Sk] with true lengths): may query i attend to key j?"""
    i = torch.arange(Sq, device=device).view(-1, 1)
    j = torch.arange(Sk, device=device).view(1, -1)
    if len_q is None:
        return (j <= i + (Sk - Sq)) if causal else torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    lq = len_q.to(device=device, dtype=torch.int64).clamp(0, Sq).view(-1, 1, 1, 1)
    lk = len_k.to(device=device, dtype=torch.int64).clamp(0, Sk).view(-1, 1, 1, 1)
    vis = (j < lk) & (i < lq)
    if causal:
        vis = vis & (j <= i + (lk - lq))
    return vis


def _core(q: Tensor, k: Tensor, v: Tensor, visible: Tensor, scale: float, key_valid: Optional[Tensor] = None):
    """q [B,Hq,Sq,D], k/v [B,Hkv,Sk,D] → (out float64, lse float64).

    ``key_valid`` ([B,1,Sk,1] bool) marks keys inside the true length: the others are zeroed in
    v so that NaN/Inf padding cannot reach the output through 0·NaN.
    """
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = torch.where(visible, s, torch.full_like(s, float("-inf")))
    lse = torch.logsumexp(s, dim=-1)
    shift = torch.where(lse == float("-inf"), torch.zeros_like(lse), lse)  # rows that see no key
    p = torch.where(visible, torch.exp(s - shift.unsqueeze(-1)), torch.zeros_like(s))
    if key_valid is not None:
        v = torch.where(key_valid, v, torch.zeros_like(v))
    out = torch.matmul(p, v)
    return out, lse


def attention_bhsd(q, k, v, *, causal: bool, scale: float, seqlens_q=None, seqlens_k=None):
    Sq, Sk = q.shape[2], k.shape[2]
    vis = _visible(Sq, Sk, causal, seqlens_q, seqlens_k, device=q.device)
    key_valid = None
    if seqlens_k is not None:
        lk = seqlens_k.to(device=q.device, dtype=torch.int64).clamp(0, Sk).view(-1, 1, 1, 1)
        key_valid = torch.arange(Sk, device=q.device).view(1, 1, -1, 1) < lk
    out, lse = _core(q, k, v, vis, scale, key_valid)
    if seqlens_q is not None:
        # rows past the true query length are exact zeros (secure-mode contract), even if q holds NaN there
        lq = seqlens_q.to(device=q.device, dtype=torch.int64).clamp(0, Sq).view(-1, 1, 1)
        qvalid = torch.arange(Sq, device=q.device).view(1, 1, -1) < lq
        out = torch.where(qvalid.unsqueeze(-1), out, torch.zeros_like(out))
        lse = torch.where(qvalid, lse, torch.full_like(lse, float("-inf")))
    return out, lse


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, scale: Optional[float] = None,
              layout: str = "bhsd", return_lse: bool = False, backend: str = "reference",
              seqlens_q: Optional[Tensor] = None, seqlens_k: Optional[Tensor] = None, secure: bool = False):
    """Float64 reference with :func:`flashcore.attention`'s signature; returns float64 tensors.

    ``backend`` and ``secure`` are accepted for signature compatibility and ignored: the
    reference has one implementation. ``seqlens_*`` give true lengths (padding semantics).
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if seqlens_k is not None and seqlens_q is None:
        seqlens_q = seqlens_k
    if (seqlens_q is None) != (seqlens_k is None):
        raise ValueError("seqlens_k is required when seqlens_q is given")
    out, lse = attention_bhsd(q, k, v, causal=causal, scale=float(scale), seqlens_q=seqlens_q, seqlens_k=seqlens_k)
    if layout == "bshd":
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal: bool = False, scale: Optional[float] = None, return_lse: bool = False, backend: str = "reference"):
    """Float64 reference for packed sequences: out ``[total_q, Hq, D]``, lse ``[Hq, total_q]``."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    cq = cu_seqlens_q.tolist()
    ck = cu_seqlens_k.tolist()
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if q1 == q0:
            continue
        qs = q[q0:q1].transpose(0, 1).unsqueeze(0)
        ks = k[k0:k1].transpose(0, 1).unsqueeze(0)
        vs = v[k0:k1].transpose(0, 1).unsqueeze(0)
        if k1 == k0:
            continue  # no keys: zeros, lse -inf
        o, l = attention_bhsd(qs, ks, vs, causal=causal, scale=float(scale))
        out[q0:q1] = o[0].transpose(0, 1)
        lse[:, q0:q1] = l[0]
    return (out, lse) if return_lse else out
