"""Argument validation shared by every entry point and every backend.

Every check raises ValueError/TypeError naming the offending argument, so bad input never
reaches a kernel (where it would crash, hang or silently compute garbage). What is supported
(dtypes, head dims) is read from the kernels' own declarations (``flashcore.kernels``)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import forward_dtype_names, forward_head_dims, head_dim_text
from .problem import DTYPE_NAMES

TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
SUPPORTED_HEAD_DIMS = forward_head_dims()
FLOAT_DTYPES = tuple(TORCH_DTYPES[n] for n in forward_dtype_names())
LAYOUTS = ("bhsd", "bshd")
BACKENDS = ("auto", "triton", "reference")


def check_float_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")


def check_same(names: tuple[str, ...], tensors, attr: str) -> None:
    vals = [getattr(t, attr) for t in tensors]
    if any(v != vals[0] for v in vals[1:]):
        desc = ", ".join(f"{n}.{attr}={v}" for n, v in zip(names, vals))
        raise ValueError(f"{' / '.join(names)} must share one {attr}; got {desc}")


def check_unit_last_stride(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(
            f"{name} must have a unit stride in its last (head) dimension, got strides {tuple(t.stride())}; "
            f"pass {name}.contiguous() (flashcore never copies silently)"
        )


def check_head_dim(name: str, d: int) -> None:
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{name} has head dim {d}; supported head dims are the {head_dim_text(SUPPORTED_HEAD_DIMS)}")


def check_scale(scale, head_dim: int) -> float:
    if scale is None:
        return head_dim ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    scale = float(scale)
    if not (scale > 0.0 and scale < float("inf")):
        raise ValueError(f"scale must be a positive finite float, got {scale}")
    return scale


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_seqlens(name: str, t, batch: int, device: torch.device) -> None:
    """Metadata-only checks (never reads the values: they may be secret)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 torch.Tensor of shape [B], got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != 1 or t.shape[0] != batch:
        raise ValueError(f"{name} must have shape [B]=[{batch}], got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {t.device}")


def check_out(out, q: torch.Tensor) -> None:
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must match q's shape/dtype/device {tuple(q.shape)}/{q.dtype}/{q.device}, "
                         f"got {tuple(out.shape)}/{out.dtype}/{out.device}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")


def check_cu_seqlens(cu_q, cu_k, total_q: int, total_k: int, max_q: int, max_k: int) -> None:
    """Host-side validation of cumulative lengths (reads them: a sync on GPU tensors)."""
    for name, cu, total, mx, mname in (("cu_seqlens_q", cu_q, total_q, max_q, "max_seqlen_q"),
                                       ("cu_seqlens_k", cu_k, total_k, max_k, "max_seqlen_k")):
        c = cu.detach().to("cpu", torch.int64)
        if int(c[0]) != 0:
            raise ValueError(f"{name} must start at 0, got {int(c[0])}")
        lens = c[1:] - c[:-1]
        if bool((lens < 0).any()):
            raise ValueError(f"{name} must be non-decreasing, got {c.tolist()}")
        if int(c[-1]) > total:
            raise ValueError(f"{name} ends at {int(c[-1])} but the packed tensor has only {total} tokens")
        if lens.numel() and int(lens.max()) > mx:
            raise ValueError(f"{mname}={mx} is smaller than a real sequence length ({int(lens.max())})")


def as_bhsd(name: str, t: torch.Tensor, layout: str) -> torch.Tensor:
    """The [B, H, S, D] view of a 4-D tensor in ``layout`` (a view: strides carry the layout)."""
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D ({'[B, H, S, D]' if layout == 'bhsd' else '[B, S, H, D]'}), got shape {tuple(t.shape)}")
    return t if layout == "bhsd" else t.transpose(1, 2)


@dataclass
class DenseArgs:
    """A dense call's arguments after validation: [B, H, S, D] views and normalised flags."""
    qb: torch.Tensor
    kb: torch.Tensor
    vb: torch.Tensor
    causal: bool
    scale: float
    seqlens_q: torch.Tensor | None  # secure mode: the query lengths (the key lengths for self-attention)
    self_attention: bool


def check_dense(q, k, v, *, layout, causal, scale, secure, seqlens_q, seqlens_k, out) -> DenseArgs:
    """Every metadata check of :func:`flashcore.attention` (never reads secret values)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, t)
    check_choice("layout", layout, LAYOUTS)
    qb, kb, vb = (as_bhsd(n, t, layout) for n, t in (("q", q), ("k", k), ("v", v)))
    check_same(("q", "k", "v"), (q, k, v), "dtype")
    check_same(("q", "k", "v"), (q, k, v), "device")
    B, Hq, Sq, D = qb.shape
    if kb.shape[0] != B or vb.shape[0] != B:
        raise ValueError(f"q, k, v must share the batch size; got q {B}, k {kb.shape[0]}, v {vb.shape[0]}")
    if kb.shape != vb.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    Hkv, Sk, Dk = kb.shape[1], kb.shape[2], kb.shape[3]
    if Dk != D:
        raise ValueError(f"k/v head dim {Dk} must equal q's head dim {D}")
    check_head_dim("q", D)
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"the number of q heads ({Hq}) must be a multiple of the number of k/v heads ({Hkv})")
    if Sq < 1 or Sk < 1 or B < 1:
        raise ValueError(f"B, Sq and Sk must be >= 1; got B={B}, Sq={Sq}, Sk={Sk} (use attention_varlen for empty sequences)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_unit_last_stride(name, t)
    scale = check_scale(scale, D)
    self_attention = False
    if secure:
        if seqlens_k is None:
            raise ValueError("secure=True needs seqlens_k (the true key lengths, int32 [B] on q's device)")
        check_seqlens("seqlens_k", seqlens_k, B, q.device)
        if seqlens_q is None:
            if Sq != Sk:
                raise ValueError("secure=True with Sq != Sk needs seqlens_q (the true query lengths)")
            seqlens_q = seqlens_k  # self-attention: query lengths are the key lengths
        self_attention = seqlens_q is seqlens_k
        check_seqlens("seqlens_q", seqlens_q, B, q.device)
    elif seqlens_q is not None or seqlens_k is not None:
        raise ValueError("seqlens_q/seqlens_k are only used with secure=True (use attention_varlen for packed sequences)")
    check_out(out, q)
    return DenseArgs(qb, kb, vb, bool(causal), scale, seqlens_q, self_attention)


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, scale, out) -> float:
    """Every metadata check of :func:`flashcore.attention_varlen`; returns the scale. (The cumulative
    lengths' values are checked by :func:`check_cu_seqlens`, where the call may sync.)"""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, t)
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [total_tokens, H, D], got shape {tuple(t.shape)}")
        check_unit_last_stride(name, t)
    check_same(("q", "k", "v"), (q, k, v), "dtype")
    check_same(("q", "k", "v"), (q, k, v), "device")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    D = q.shape[2]
    if k.shape[2] != D:
        raise ValueError(f"k/v head dim {k.shape[2]} must equal q's head dim {D}")
    check_head_dim("q", D)
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"the number of q heads ({Hq}) must be a multiple of the number of k/v heads ({Hkv})")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be an int32 torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
        if t.dim() != 1 or t.shape[0] < 2:
            raise ValueError(f"{name} must be 1-D with N+1 >= 2 entries, got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both have N+1 entries; got {cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"{name} must be a non-negative int, got {m!r}")
    scale = check_scale(scale, D)
    check_out(out, q)
    return scale

