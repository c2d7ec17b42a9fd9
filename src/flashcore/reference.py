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


def _cache_slots(b: int, positions: Tensor, page_table, cache_batch_idx, page_size: int):
    """(row, token) indices into a [rows, tokens, Hkv, D] cache of sequence ``b``'s logical positions."""
    if page_table is not None:
        pages = page_table[b].to(torch.int64)[positions // page_size]
        return pages, positions % page_size
    row = int(cache_batch_idx[b]) if cache_batch_idx is not None else b
    return torch.full_like(positions, row), positions


def attention_with_kvcache(q, k_cache, v_cache, *, cache_seqlens, k=None, v=None, page_table=None,
                           cache_batch_idx=None, cache_leftpad=None, cu_seqlens_q=None, max_seqlen_q=None,
                           causal: bool = True, scale: Optional[float] = None, num_splits: int = 0, k_descale=None,
                           v_descale=None, return_lse: bool = False, out=None, secure: bool = False,
                           backend: str = "reference"):
    """Float64 reference with :func:`flashcore.attention_with_kvcache`'s signature (``num_splits``, ``out``,
    ``secure`` and ``backend`` are accepted and ignored). Like the real call it first writes ``k``/``v`` into
    the caches at ``cache_seqlens`` (the caches are modified). Returns float64 out (q's shape) and lse
    (``[B, Hq, Sq]``, packed: ``[Hq, total_q]``).

    Every sequence's new tokens are written before any sequence attends (this matters only where sequences
    share cache rows or pages). Sequence ``b`` attends to cache positions ``[cache_leftpad[b], L_b)``, ``L_b = cache_seqlens[b]`` plus its
    new tokens; causal is bottom-right: query ``i`` of ``n_b`` sees positions ``<= L_b - n_b + i``. An FP8
    cache is read as ``stored * descale`` per (sequence, K/V head)."""
    packed = cu_seqlens_q is not None
    B = cu_seqlens_q.shape[0] - 1 if packed else q.shape[0]
    paged = page_table is not None
    page_size = k_cache.shape[1]
    if scale is None:
        scale = q.shape[-1] ** -0.5
    lens = [int(cache_seqlens)] * B if isinstance(cache_seqlens, int) else cache_seqlens.tolist()
    starts = cu_seqlens_q.tolist() if packed else None
    out64 = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    Hq = q.shape[-2]
    lse_shape = (Hq, q.shape[0]) if packed else (B, Hq, q.shape[1])
    lse = torch.full(lse_shape, float("-inf"), dtype=torch.float64, device=q.device)
    def tokens(b):  # sequence b's query (and new token) rows
        return slice(starts[b], starts[b + 1]) if packed else b

    if k is not None:  # every sequence's new tokens are written before any sequence attends (as the kernels do)
        for b in range(B):
            kn, vn = k[tokens(b)], v[tokens(b)]
            pos = torch.arange(lens[b], lens[b] + kn.shape[0], device=q.device)
            rows, toks = _cache_slots(b, pos, page_table if paged else None, cache_batch_idx, page_size)
            k_cache[rows, toks] = kn
            v_cache[rows, toks] = vn
    for b in range(B):
        qs = q[tokens(b)]
        n = qs.shape[0]
        end = lens[b] + (n if k is not None else 0)
        start = int(cache_leftpad[b]) if cache_leftpad is not None else 0
        if n == 0:
            continue
        pos = torch.arange(start, end, device=q.device)
        rows, toks = _cache_slots(b, pos, page_table if paged else None, cache_batch_idx, page_size)
        ks = k_cache[rows, toks].to(torch.float64)  # [len, Hkv, D]
        vs = v_cache[rows, toks].to(torch.float64)
        if k_descale is not None:
            ks = ks * k_descale[b].to(torch.float64).view(1, -1, 1)
            vs = vs * v_descale[b].to(torch.float64).view(1, -1, 1)
        i = torch.arange(n, device=q.device).view(-1, 1)
        vis = torch.ones(n, pos.numel(), dtype=torch.bool, device=q.device)
        if causal:
            vis = pos.view(1, -1) <= end - n + i
        o, l = _core(qs.transpose(0, 1).unsqueeze(0), ks.transpose(0, 1).unsqueeze(0),
                     vs.transpose(0, 1).unsqueeze(0), vis, float(scale))
        if packed:
            out64[tokens(b)] = o[0].transpose(0, 1)
            lse[:, tokens(b)] = l[0]
        else:
            out64[b] = o[0].transpose(0, 1)
            lse[b] = l[0]
    return (out64, lse) if return_lse else out64
