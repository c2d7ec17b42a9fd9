"""Argument validation shared by every entry point and every backend.

Every check raises ValueError/TypeError naming the offending argument, so bad input never
reaches a kernel (where it would crash, hang or silently compute garbage). What is supported
(dtypes, head dims) is read from the kernels' own declarations (``flashcore.kernels``)."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from .kernels import forward_dtype_names, forward_head_dims, head_dim_text
from .problem import DTYPE_NAMES
from .runtime.launcher import capturing, interpreting

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


def check_flag(name: str, value) -> bool:
    """A bool flag: a Python or numpy bool (``causal="yes"`` or ``1`` is refused, not read as true)."""
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_real(name: str, value) -> float:
    """A real number of any numeric type (Python, numpy, ...) that converts to a float exactly."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    f = float(value)
    if f != value and f == f:  # nan converts exactly, and fails the range checks that follow
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) does not convert to a float exactly")
    return f


def check_int(name: str, value, *, minimum: int = 0) -> int:
    """An integer of any numeric type (Python, numpy, an integral float, ...) that converts exactly."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    try:
        i = int(value)
    except (OverflowError, ValueError):
        raise ValueError(f"{name} must be a finite integer, got {value!r}") from None
    if i != value:
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if i < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {i}")
    return i


def check_scale(scale, head_dim: int) -> float:
    if scale is None:
        return head_dim ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    scale = check_real("scale", scale)
    if not (scale > 0.0 and scale < float("inf")):
        raise ValueError(f"scale must be a positive finite float, got {scale}")
    return scale


def check_backend(backend, q: torch.Tensor) -> bool:
    """Which route runs: True for the kernels, False for the float64 reference. Refuses what a route
    would get wrong: kernels on CPU without the interpreter, and bf16 under the interpreter."""
    check_choice("backend", backend, BACKENDS)
    if backend == "reference" or (backend == "auto" and q.device.type != "cuda"):
        return False
    if q.device.type != "cuda":
        if not interpreting():
            raise ValueError(
                f"backend='triton' needs CUDA tensors (got device {q.device}); to run the Triton kernels on "
                "CPU tensors set TRITON_INTERPRET=1 before importing triton"
            )
        if q.dtype == torch.bfloat16:
            # triton's interpreter computes bf16 wrongly (relative errors ~1e9): never return that.
            raise ValueError(
                "q is bfloat16, which the Triton interpreter (TRITON_INTERPRET=1) computes wrongly; on CPU use "
                "float16 or float32 with backend='triton', or backend='reference' for bfloat16"
            )
    return True


def check_grad(kernel: bool, tensors: dict) -> None:
    """The kernels have no backward pass yet: refuse inputs that want gradients instead of dropping them."""
    if not kernel or not torch.is_grad_enabled():
        return
    wanting = [name for name, t in tensors.items() if t is not None and t.requires_grad]
    if wanting:
        raise RuntimeError(
            f"{', '.join(wanting)} require{'s' if len(wanting) == 1 else ''} grad, but flashcore's kernels are "
            "forward-only for now: the gradient would be silently lost. Run the forward under torch.no_grad() / "
            "torch.inference_mode() (or detach the inputs), or use backend='reference' (differentiable, slow)"
        )


def check_secure_lengths(seqlens_q: torch.Tensor, seqlens_k: torch.Tensor, seqlen_q: int, seqlen_k: int) -> None:
    """Host-side range check of secure lengths (eager only; one sync). One bit reaches the host: whether
    every length lies in range. Never the lengths."""
    bad = ((seqlens_q < 0) | (seqlens_q > seqlen_q)).any() | ((seqlens_k < 0) | (seqlens_k > seqlen_k)).any()
    if bool(bad):
        raise ValueError(f"seqlens_q must lie in [0, {seqlen_q}] and seqlens_k in [0, {seqlen_k}] (the padded lengths)")


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
    if batch > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (the kernels read it as a packed array), got stride {t.stride(0)}")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory spans intersect (a conservative test on their address ranges)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    def span(t):
        lo = t.data_ptr() + t.element_size() * sum(s * (n - 1) for s, n in zip(t.stride(), t.shape) if s < 0)
        hi = t.data_ptr() + t.element_size() * (1 + sum(s * (n - 1) for s, n in zip(t.stride(), t.shape) if s > 0))
        return lo, hi
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def check_out(out, q: torch.Tensor, inputs: dict | None = None) -> None:
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must match q's shape/dtype/device {tuple(q.shape)}/{q.dtype}/{q.device}, "
                         f"got {tuple(out.shape)}/{out.dtype}/{out.device}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    for name, t in (inputs or {}).items():
        if _overlaps(out, t):
            raise ValueError(f"out must not overlap {name} (other tiles still read {name} while out is written)")


def check_cu_seqlens(cu_q, cu_k, total_q: int, total_k: int, max_q: int, max_k: int) -> int:
    """Host-side validation of cumulative lengths (reads them: a sync on GPU tensors). Returns where the
    last query sequence ends: rows of q past it belong to no sequence (their output is zero)."""
    end_q = total_q
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
        if name == "cu_seqlens_q":
            end_q = int(c[-1])
    return end_q


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
    secure: bool
    return_lse: bool
    validate: bool
    kernel: bool  # True: the kernels run; False: the float64 reference


def check_dense(q, k, v, *, layout, causal, scale, secure, seqlens_q, seqlens_k, out, backend="auto",
                return_lse=False, validate=True) -> DenseArgs:
    """Every check of :func:`flashcore.attention`, whichever backend runs. Reads no secret value, except the
    eager-only secure range check of the reference route (the kernels' plans run the same check,
    :func:`check_secure_lengths`, on every call)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, t)
    check_choice("layout", layout, LAYOUTS)
    causal, secure = check_flag("causal", causal), check_flag("secure", secure)
    return_lse, validate = check_flag("return_lse", return_lse), check_flag("validate_seqlens", validate)
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
    kernel = check_backend(backend, q)
    check_grad(kernel, {"q": q, "k": k, "v": v})
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
        if not kernel and validate and not torch.compiler.is_compiling() and not capturing(q.device):
            check_secure_lengths(seqlens_q, seqlens_k, Sq, Sk)
    elif seqlens_q is not None or seqlens_k is not None:
        raise ValueError("seqlens_q/seqlens_k are only used with secure=True (use attention_varlen for packed sequences)")
    check_out(out, q, {"q": q, "k": k, "v": v})
    return DenseArgs(qb, kb, vb, causal, scale, seqlens_q, self_attention, secure, return_lse, validate, kernel)


@dataclass
class VarlenArgs:
    """A varlen call's normalised arguments."""
    causal: bool
    scale: float
    max_seqlen_q: int
    max_seqlen_k: int
    return_lse: bool
    kernel: bool


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None,
                 return_lse=False, backend="auto", out=None) -> VarlenArgs:
    """Every metadata check of :func:`flashcore.attention_varlen`, whichever backend runs. (The cumulative
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
        if t.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous (the kernels read it as a packed array), got stride {t.stride(0)}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both have N+1 entries; got {cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    max_q, max_k = check_int("max_seqlen_q", max_seqlen_q), check_int("max_seqlen_k", max_seqlen_k)
    causal, return_lse = check_flag("causal", causal), check_flag("return_lse", return_lse)
    scale = check_scale(scale, D)
    kernel = check_backend(backend, q)
    check_grad(kernel, {"q": q, "k": k, "v": v})
    check_out(out, q, {"q": q, "k": k, "v": v})
    return VarlenArgs(causal, scale, max_q, max_k, return_lse, kernel)
