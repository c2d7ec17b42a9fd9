"""Public entry points: validate, normalise layouts (as strided views, never copies), dispatch.

Causal alignment (FlashAttention convention): with ``causal=True`` query ``i`` sees key ``j``
iff ``j <= i + Sk - Sq`` (bottom-right aligned). When ``Sq == Sk`` this is SDPA's
``is_causal=True``. A query row that sees no key outputs zeros, and its logsumexp is ``-inf``.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from . import _checks as C
from . import reference as _ref
from .kernels import configs

Tensor = torch.Tensor


def _want_triton(backend: str, device: torch.device) -> bool:
    C.check_choice("backend", backend, C.BACKENDS)
    if backend == "reference":
        return False
    if backend == "auto":
        return device.type == "cuda"
    # backend == "triton"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(
            f"backend='triton' needs CUDA tensors (got device {device}); to run the Triton kernels on "
            "CPU tensors set TRITON_INTERPRET=1 before importing triton"
        )
    return True


def _as_bhsd(name: str, t: Tensor, layout: str) -> Tensor:
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D ({'[B, H, S, D]' if layout == 'bhsd' else '[B, S, H, D]'}), got shape {tuple(t.shape)}")
    return t if layout == "bhsd" else t.transpose(1, 2)  # a view: strides carry the layout


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    scale: Optional[float] = None,
    layout: str = "bhsd",
    return_lse: bool = False,
    backend: str = "auto",
    seqlens_q: Optional[Tensor] = None,
    seqlens_k: Optional[Tensor] = None,
    secure: bool = False,
    out: Optional[Tensor] = None,
    validate_seqlens: bool = True,
):
    """Fused scaled-dot-product attention forward.

    Shapes: ``layout="bhsd"``: q ``[B, Hq, Sq, D]``, k/v ``[B, Hkv, Sk, D]``; ``layout="bshd"``:
    ``[B, S, H, D]``. ``Hq % Hkv == 0`` (GQA/MQA). D is a multiple of 8 in [8, 256]. Any strides
    with a unit last-dim stride. Output has q's dtype and layout (contiguous). With
    ``return_lse=True`` returns ``(out, lse)``, lse ``[B, Hq, Sq]`` float32, natural log.

    fp16/bf16: fp32 accumulation, inputs of P·V rounded to the input dtype (as in every fused
    attention). fp32: both products in IEEE fp32 on the tensor-core-free path (no TF32), so
    results match the float64 reference to ~1e-6 relative error.

    ``secure=True`` selects the constant-time kernel: inputs are padded to ``Sq``/``Sk`` and the
    true lengths ``seqlens_q``/``seqlens_k`` (int32 ``[B]`` on q's device) are secret. See
    docs/security.md. Pass ``seqlens_q=None`` for self-attention (query lengths = key lengths):
    the causal diagonal is then public and blocks above it are skipped. ``validate_seqlens``
    (eager only): check on the host that every length lies in ``[0, S]`` — one sync that reveals
    one bit (all in range or not), never the lengths; skipped during CUDA-graph capture, where
    out-of-range lengths are clamped on the device.

    ``out``: an optional caller-owned output buffer (q's shape, dtype, device; contiguous), so
    CUDA-graph users can own their buffers; it is returned.
    """
    flags = (causal, scale, layout, return_lse, backend, secure, validate_seqlens)
    key = None
    if not torch.compiler.is_compiling():
        key = _signature(q, k, v, seqlens_q, seqlens_k, out, flags)
        call = _CALLS.get(key) if key is not None else None
        if call is not None:
            res, lse = call(q, k, v, seqlens_q, seqlens_k, out)
            return (res, lse) if return_lse else res

    for name, t in (("q", q), ("k", k), ("v", v)):
        C.check_float_tensor(name, t)
    C.check_choice("layout", layout, C.LAYOUTS)
    qb, kb, vb = (_as_bhsd(n, t, layout) for n, t in (("q", q), ("k", k), ("v", v)))
    C.check_same(("q", "k", "v"), (q, k, v), "dtype")
    C.check_same(("q", "k", "v"), (q, k, v), "device")
    B, Hq, Sq, D = qb.shape
    if kb.shape[0] != B or vb.shape[0] != B:
        raise ValueError(f"q, k, v must share the batch size; got q {B}, k {kb.shape[0]}, v {vb.shape[0]}")
    if kb.shape != vb.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    Hkv, Sk, Dk = kb.shape[1], kb.shape[2], kb.shape[3]
    if Dk != D:
        raise ValueError(f"k/v head dim {Dk} must equal q's head dim {D}")
    C.check_head_dim("q", D)
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"the number of q heads ({Hq}) must be a multiple of the number of k/v heads ({Hkv})")
    if Sq < 1 or Sk < 1 or B < 1:
        raise ValueError(f"B, Sq and Sk must be >= 1; got B={B}, Sq={Sq}, Sk={Sk} (use attention_varlen for empty sequences)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        C.check_unit_last_stride(name, t)
    scale = C.check_scale(scale, D)
    causal = bool(causal)

    if secure:
        if seqlens_k is None:
            raise ValueError("secure=True needs seqlens_k (the true key lengths, int32 [B] on q's device)")
        C.check_seqlens("seqlens_k", seqlens_k, B, q.device)
        if seqlens_q is None:
            if Sq != Sk:
                raise ValueError("secure=True with Sq != Sk needs seqlens_q (the true query lengths)")
            seqlens_q = seqlens_k  # self-attention: query lengths are the key lengths
        C.check_seqlens("seqlens_q", seqlens_q, B, q.device)
    elif seqlens_q is not None or seqlens_k is not None:
        raise ValueError("seqlens_q/seqlens_k are only used with secure=True (use attention_varlen for packed sequences)")

    _check_out(out, q)

    if not _want_triton(backend, q.device):
        res, lse = _ref.attention_bhsd(qb, kb, vb, causal=causal, scale=scale,
                                       seqlens_q=seqlens_q if secure else None,
                                       seqlens_k=seqlens_k if secure else None)
        res = res.to(q.dtype)
        if layout == "bshd":
            res = res.transpose(1, 2)
        res = out.copy_(res) if out is not None else res.contiguous()
        return (res, lse.float()) if return_lse else res

    from . import ops

    if key is None:  # tracing under torch.compile, or inputs we do not key on: the custom op
        res, lse = ops.attention_fwd(q, k, v, seqlens_q, seqlens_k, causal, scale, layout == "bshd", bool(secure),
                                     bool(return_lse), out, bool(validate_seqlens))
        return (res, lse) if return_lse else res
    call = ops.dense_call(q, k, v, seqlens_q, seqlens_k, causal, scale, layout == "bshd", bool(secure),
                          bool(return_lse), out, validate=bool(validate_seqlens))
    res, lse = call(q, k, v, seqlens_q, seqlens_k, out)
    if len(_CALLS) < _CALLS_LIMIT:
        _CALLS[key] = call
    return (res, lse) if return_lse else res


# Repeat calls: everything attention() checks, and everything it plans, depends only on metadata
# (types, dtypes, devices, shapes, strides, pointer alignment, the keyword arguments, and which
# lengths tensors are given). A call whose metadata matches an earlier successful call replays
# that call's plan: host time drops from tens of µs to a dictionary lookup and the launch. The
# secure-length range check reads values, so it stays in the replay (see ops.DenseCall).
_CALLS: dict = {}
_CALLS_LIMIT = 4096


def _signature(q, k, v, seqlens_q, seqlens_k, out, flags):
    parts = [flags, seqlens_q is seqlens_k, configs.env_overrides()]
    for t in (q, k, v, seqlens_q, seqlens_k, out):
        if t is None:
            parts.append(None)
        elif type(t) is torch.Tensor:  # subclasses (fake/functional tensors, ...) take the full path
            parts.append((t.dtype, t.device, t.shape, t.stride(), t.data_ptr() & 15))
        else:
            return None
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:  # e.g. an unhashable scale: the full path names the bad argument
        return None
    return key


def _check_out(out, q: Tensor) -> None:
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must match q's shape/dtype/device {tuple(q.shape)}/{q.dtype}/{q.device}, "
                         f"got {tuple(out.shape)}/{out.dtype}/{out.device}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")


def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    scale: Optional[float] = None,
    return_lse: bool = False,
    backend: str = "auto",
    out: Optional[Tensor] = None,
):
    """Attention over packed variable-length sequences.

    q ``[total_q, Hq, D]``, k/v ``[total_k, Hkv, D]``; ``cu_seqlens_*`` int32 ``[N+1]`` cumulative
    lengths starting at 0 (zero-length sequences allowed). Same semantics per sequence as
    :func:`attention` (causal is bottom-right aligned per sequence). lse is ``[Hq, total_q]``.

    ``cu_seqlens`` are checked on the host (monotonic, within the tensors, lengths <= max_seqlen);
    that check is skipped while a CUDA graph is being captured, where it would need a sync.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        C.check_float_tensor(name, t)
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [total_tokens, H, D], got shape {tuple(t.shape)}")
        C.check_unit_last_stride(name, t)
    C.check_same(("q", "k", "v"), (q, k, v), "dtype")
    C.check_same(("q", "k", "v"), (q, k, v), "device")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    D = q.shape[2]
    if k.shape[2] != D:
        raise ValueError(f"k/v head dim {k.shape[2]} must equal q's head dim {D}")
    C.check_head_dim("q", D)
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
    scale = C.check_scale(scale, D)

    _check_out(out, q)

    if not _want_triton(backend, q.device):
        _ref.check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
        res, lse = _ref.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                         causal=bool(causal), scale=scale, return_lse=True)
        res = res.to(q.dtype)
        res = out.copy_(res) if out is not None else res
        return (res, lse.float()) if return_lse else res

    from . import ops

    res, lse = ops.attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                                        bool(causal), scale, bool(return_lse), out)
    return (res, lse) if return_lse else res
