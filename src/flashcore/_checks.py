"""Argument validation shared by every entry point and every backend.

Every check raises ValueError/TypeError naming the offending argument, so bad input never
reaches a kernel (where it would crash, hang or silently compute garbage). What is supported
(dtypes, head dims) is read from the kernels' own declarations (``flashcore.kernels``)."""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from .kernels import forward_dtype_names, forward_head_dims, head_dim_text
from .problem import DTYPE_NAMES
from .runtime.launcher import capturing, device_arch, interpreting, triton_debug

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


def check_secure(value, *, strict_ok: bool = True) -> tuple[bool, bool]:
    """``secure``: a bool, or ``"strict"`` (secure mode whose kernels never multiply the caller's padding:
    docs/security.md §2) where the call has a strict form (``strict_ok``). Returns (secure, strict)."""
    what = "a bool or 'strict'" if strict_ok else "a bool"
    if isinstance(value, str):
        if value == "strict" and strict_ok:
            return True, True
        if value == "strict":
            raise ValueError("secure='strict' is for flashcore.attention (the dense kernels); this call has no strict "
                             "form: pass secure=True")
        raise ValueError(f"secure must be {what}, got {value!r}")
    try:
        return check_flag("secure", value), False
    except TypeError:
        raise TypeError(f"secure must be {what}, got {type(value).__name__} {value!r}") from None


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


class NotConstantTimeWarning(UserWarning):
    """``secure=True`` ran where no constant-time gate covers what runs (docs/security.md §2)."""


# The compute capabilities whose machine code the constant-time gates audit (the SASS gate compiles for sm_90a;
# gates 2-4 ran on H100/H200): secure mode anywhere else computes the same results without the guarantee.
AUDITED_ARCHS = ((9, 0),)


def warn_not_constant_time(kernel: bool, device: torch.device) -> None:
    """Say so, loudly, when ``secure=True`` runs something that is not constant-time: the float64 reference, the
    CPU interpreter, Triton's debug builds, or a GPU the gates never audited. (Not while tracing: dynamo would break
    the graph.)"""
    if torch.compiler.is_compiling():
        return
    if not kernel:
        where = "the float64 PyTorch reference (backend='reference', or CPU tensors with backend='auto')"
    elif interpreting() or device.type != "cuda":
        where = "the Triton interpreter on the CPU (TRITON_INTERPRET=1)"
    elif triton_debug():
        where = ("kernels that Triton builds in its debug mode (TRITON_DEBUG=1 or triton.knobs.runtime.debug: device "
                 "asserts and integer overflow checks, each a branch on values; the gates audit the release build)")
    else:
        arch = device_arch(device)
        if arch in AUDITED_ARCHS:
            return
        where = (f"an sm_{arch[0]}{arch[1]} GPU, whose machine code the constant-time gates never audited (they cover "
                 "sm_90a: H100/H200)")
    warnings.warn(f"secure=True ran on {where}: the results are secure mode's, but its running time and memory "
                  "traffic are not constant-time there. Run on an H100/H200 with backend='auto' or 'triton' for the "
                  "audited kernels (docs/security.md).", NotConstantTimeWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside flashcore, so a warning names the caller's line whichever entry
    point led here (``warnings.warn``'s ``skip_file_prefixes`` needs Python 3.12)."""
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1  # the frame that calls warnings.warn
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def wants_grad(tensors: dict) -> list[str]:
    """The names of the inputs autograd would differentiate through (grad mode on, ``requires_grad``)."""
    if not torch.is_grad_enabled():
        return []
    return [name for name, t in tensors.items() if isinstance(t, torch.Tensor) and t.requires_grad]


def _requires(wanting: list[str]) -> str:
    return f"{', '.join(wanting)} require{'s' if len(wanting) == 1 else ''} grad"


def check_grad(tensors: dict, *, secure: bool = False, out=None, inference_only: str | None = None) -> bool:
    """Whether the call must record a backward (some input wants a gradient); refuses, at the forward call,
    every combination with no backward instead of returning an output whose gradient would be lost:
    ``inference_only`` (a route with no backward: the reason), ``secure=True`` (forward-only: no
    constant-time backward exists) and ``out=`` (a caller-owned buffer is not part of the graph)."""
    wanting = wants_grad(tensors)
    if not wanting:
        return False
    if inference_only is not None:
        raise RuntimeError(
            f"{_requires(wanting)}, but {inference_only}: the gradient would be silently lost. Run it under "
            "torch.no_grad() / torch.inference_mode(), or detach the inputs")
    if secure:
        raise RuntimeError(
            f"{_requires(wanting)}, but secure=True is forward-only: flashcore has no constant-time backward pass "
            "(docs/security.md). Train with secure=False, or run the secure forward under torch.no_grad() / "
            "torch.inference_mode()")
    if out is not None:
        raise RuntimeError(
            f"{_requires(wanting)}, but out= is given: a caller-owned output buffer cannot carry the gradient "
            "history (as with torch's out= functions). Drop out= when training")
    return True


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


def _span(t: torch.Tensor) -> tuple:
    """The byte range ``[lo, hi)`` a non-empty tensor's elements lie in."""
    lo = hi = 0
    for s, n in zip(t.stride(), t.shape):
        if s > 0:
            hi += s * (n - 1)
        else:
            lo += s * (n - 1)
    p, es = t.data_ptr(), t.element_size()
    return p + es * lo, p + es * (hi + 1)


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory spans intersect (a conservative test on their address ranges). False while
    torch.compile traces: fake tensors have no addresses (the custom ops check their real tensors again)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0 or torch.compiler.is_compiling():
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def _share_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may share an element: exact for two views of one shape and strides whose strides nest
    (each larger than the reach of the smaller ones: the packed ``[..., 2, ...]`` K/V pools of vLLM and FlashInfer
    split into ``kv[:, 0]`` and ``kv[:, 1]``), else :func:`_overlaps`'s conservative span test."""
    if not _overlaps(a, b):
        return False
    es = a.element_size()
    d, rem = divmod(b.data_ptr() - a.data_ptr(), es)
    if (rem or es != b.element_size() or a.shape != b.shape or a.stride() != b.stride()
            or any(s <= 0 for s, n in zip(a.stride(), a.shape) if n > 1)):
        return True
    dims = sorted(((s, n) for s, n in zip(a.stride(), a.shape) if n > 1), reverse=True)
    reach = [0] * (len(dims) + 1)  # reach[i]: the largest offset the dims after i can add
    for i in range(len(dims) - 1, -1, -1):
        reach[i] = reach[i + 1] + dims[i][0] * (dims[i][1] - 1)
    if any(s <= reach[i + 1] for i, (s, _) in enumerate(dims)):
        return True  # strides that do not nest: the span test's answer

    def reachable(i: int, r: int) -> bool:  # d = sum of s_i * delta_i with |delta_i| < n_i: at most two deltas a dim
        if i == len(dims):
            return r == 0
        s, n = dims[i]
        lo, hi = -((reach[i + 1] - r) // s), (r + reach[i + 1]) // s
        return any(reachable(i + 1, r - s * delta) for delta in range(max(lo, 1 - n), min(hi, n - 1) + 1))
    return reachable(0, d)


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
    check_out_overlaps(out, inputs or {})


def check_out_overlaps(out: torch.Tensor, inputs: dict) -> None:
    """``out`` shares no memory with any of ``inputs``. Checked on every call that takes ``out``, a plan-cache hit
    and a ``KVCacheStep`` run included: the plan keys hold alignments, not addresses."""
    for name, t in inputs.items():
        if t is not None and _overlaps(out, t):
            raise ValueError(f"out must not overlap {name} (other tiles still read {name} while out is written)")


def check_kvcache_aliasing(q, k_cache, v_cache, k, v, out) -> None:
    """A KV-cache call's address checks: ``out`` overlaps no input; with an append, neither ``k``/``v`` nor ``q``
    overlaps a cache (k and v are written into them) and the two caches share no element (slots that two appended
    tokens share are a value check: :func:`_check_append_slots`). On every call that takes ``out`` or ``k``/``v``,
    plan-cache hits and step runs included (each span computed once: this runs on the warm paths' host time)."""
    if out is not None:
        check_out_overlaps(out, {"q": q, "k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v})
    if k is None or torch.compiler.is_compiling():
        return
    caches = [(n, c, _span(c)) for n, c in (("k_cache", k_cache), ("v_cache", v_cache)) if c.numel()]
    for name, t in (("k", k), ("v", v), ("q", q)):
        if t is None or t.numel() == 0:
            continue
        t0, t1 = _span(t)
        for cname, c, (c0, c1) in caches:
            if t0 < c1 and c0 < t1 and t.device == c.device:
                raise ValueError(f"{name} must not overlap {cname} (k and v are written into the caches while "
                                 f"{name} is read)")
    if len(caches) == 2 and _share_elements(k_cache, v_cache):
        raise ValueError("k_cache and v_cache must not share memory when k and v are appended (v's writes would "
                         "replace k's); views of one packed pool that share no element are fine")


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
    grad: bool = False  # some input wants a gradient: the call records a backward
    deterministic: bool = False
    strict: bool = False  # secure="strict": the padding rows of q and k are replaced before any kernel reads them


def check_dense(q, k, v, *, layout, causal, scale, secure, seqlens_q, seqlens_k, out, backend="auto",
                return_lse=False, validate=True, deterministic=False) -> DenseArgs:
    """Every check of :func:`flashcore.attention`, whichever backend runs. Reads no secret value, except the
    eager-only secure range check of the reference route (the kernels' plans run the same check,
    :func:`check_secure_lengths`, on every call)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, t)
    check_choice("layout", layout, LAYOUTS)
    causal, (secure, strict) = check_flag("causal", causal), check_secure(secure)
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
    grad = check_grad({"q": q, "k": k, "v": v}, secure=secure, out=out)
    deterministic = check_flag("deterministic", deterministic)
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
    if secure:
        warn_not_constant_time(kernel, q.device)
    return DenseArgs(qb, kb, vb, causal, scale, seqlens_q, self_attention, secure, return_lse, validate, kernel, grad,
                     deterministic, strict)


@dataclass
class VarlenArgs:
    """A varlen call's normalised arguments."""
    causal: bool
    scale: float
    max_seqlen_q: int
    max_seqlen_k: int
    return_lse: bool
    kernel: bool
    grad: bool = False
    deterministic: bool = False


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None,
                 return_lse=False, backend="auto", out=None, deterministic=False) -> VarlenArgs:
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
    grad = check_grad({"q": q, "k": k, "v": v}, out=out)
    deterministic = check_flag("deterministic", deterministic)
    check_out(out, q, {"q": q, "k": k, "v": v})
    return VarlenArgs(causal, scale, max_q, max_k, return_lse, kernel, grad, deterministic)


# --- KV-cache attention (attention_with_kvcache) ---------------------------------------------------------

FP8_CACHE_DTYPE = torch.float8_e4m3fn
_FP8_OTHER = tuple(getattr(torch, n) for n in ("float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
                   if hasattr(torch, n))
MAX_SPLITS = 128
SECURE_PAGE_SIZES = (16, 32, 64, 128, 256)


@dataclass
class KvcacheArgs:
    """A KV-cache call's normalised arguments and public shape facts."""
    batch: int
    seqlen_q: int  # queries per sequence (packed: max_seqlen_q)
    num_heads_q: int
    num_heads_kv: int
    head_dim: int
    packed: bool  # q is [total_q, Hq, D] with cu_seqlens_q
    paged: bool
    page_size: int  # paged: tokens per page; contiguous: S_cache
    capacity: int  # tokens a sequence's cache holds (paged: table width x page size)
    fp8: bool
    append: bool
    causal: bool
    scale: float
    num_splits: int
    return_lse: bool
    secure: bool
    kernel: bool


def _check_int32(name: str, t, shape: tuple, device, *, contiguous: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 torch.Tensor of shape {list(shape)}, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {t.device}")
    if contiguous and t.numel() > 1 and (t.stride(-1) != 1 or (t.dim() == 2 and t.shape[0] > 1
                                                              and t.stride(0) != t.shape[1])):
        raise ValueError(f"{name} must be contiguous (the kernels read it as a packed array), got strides "
                         f"{tuple(t.stride())}")


def check_kvcache(q, k_cache, v_cache, *, cache_seqlens, k, v, page_table, cache_batch_idx, cache_leftpad,
                  cu_seqlens_q, max_seqlen_q, causal, scale, num_splits, k_descale, v_descale, return_lse, out,
                  secure, backend) -> KvcacheArgs:
    """Every metadata check of :func:`flashcore.attention_with_kvcache`, whichever backend runs. Values of
    lengths, page tables and batch indices are checked by :func:`check_kvcache_values` (a sync)."""
    check_float_tensor("q", q)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype in _FP8_OTHER:
            raise TypeError(f"{name} is {t.dtype}: the only FP8 cache format is torch.float8_e4m3fn (e4m3)")
        if t.dtype != q.dtype and t.dtype != FP8_CACHE_DTYPE:
            raise TypeError(f"{name} must have q's dtype {q.dtype} or be torch.float8_e4m3fn, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D ([B_cache, S_cache, Hkv, D] or paged [num_pages, page_size, "
                             f"Hkv, D]), got shape {tuple(t.shape)}")
        check_unit_last_stride(name, t)
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache and v_cache must share one dtype, got {k_cache.dtype} and {v_cache.dtype}")
    fp8 = k_cache.dtype == FP8_CACHE_DTYPE
    if fp8 and q.dtype == torch.float32:
        raise TypeError("an FP8 (float8_e4m3fn) cache needs q in float16 or bfloat16, got float32")
    if fp8:  # the kernels read e4m3 two at a time, as uint16 (kernels.triton.decode._widen_fp8_pairs)
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.data_ptr() % 2:
                raise ValueError(f"{name}, an FP8 cache, must start at an even byte address (it is read two values "
                                 f"at a time); a .contiguous() copy does")
            if any(st % 2 and n > 1 for st, n in zip(t.stride()[:-1], t.shape[:-1])):  # size-1 dims: never used
                raise ValueError(f"{name}, an FP8 cache, must have even strides, got {tuple(t.stride())} (it is read "
                                 f"two values at a time; a .contiguous() copy has them)")
    causal, secure = check_flag("causal", causal), check_secure(secure, strict_ok=False)[0]
    return_lse = check_flag("return_lse", return_lse)
    packed = cu_seqlens_q is not None or max_seqlen_q is not None
    if packed:
        if cu_seqlens_q is None or max_seqlen_q is None:
            raise ValueError("cu_seqlens_q and max_seqlen_q go together: pass both or neither")
        if q.dim() != 3:
            raise ValueError(f"q must be 3-D [total_q, Hq, D] with cu_seqlens_q, got shape {tuple(q.shape)}")
        if not isinstance(cu_seqlens_q, torch.Tensor):
            raise TypeError(f"cu_seqlens_q must be an int32 torch.Tensor of shape [B+1], got "
                            f"{type(cu_seqlens_q).__name__}")
        if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 2:
            raise ValueError("cu_seqlens_q must be an int32 tensor of shape [B+1] (B >= 1)")
        B = cu_seqlens_q.shape[0] - 1
        _check_int32("cu_seqlens_q", cu_seqlens_q, (B + 1,), q.device)
        Sq = check_int("max_seqlen_q", max_seqlen_q, minimum=1)
        if secure:
            raise ValueError("secure=True does not take cu_seqlens_q: packed query offsets would put the secret "
                             "query lengths into addresses; pass q padded to [B, Sq, Hq, D]")
        _, Hq, D = q.shape
    else:
        if q.dim() != 4:
            raise ValueError(f"q must be 4-D [B, Sq, Hq, D] (or 3-D with cu_seqlens_q), got shape {tuple(q.shape)}")
        B, Sq, Hq, D = q.shape
        if B < 1 or Sq < 1:
            raise ValueError(f"q must have B >= 1 and Sq >= 1, got shape {tuple(q.shape)}")
    check_unit_last_stride("q", q)
    Hkv = k_cache.shape[2]
    if k_cache.shape[3] != D:
        raise ValueError(f"k_cache/v_cache head dim {k_cache.shape[3]} must equal q's head dim {D}")
    check_head_dim("q", D)
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"the number of q heads ({Hq}) must be a multiple of the number of k/v cache heads ({Hkv})")
    paged = page_table is not None
    if paged:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx indexes a contiguous cache; a paged cache (page_table) takes none")
        if not isinstance(page_table, torch.Tensor):
            raise TypeError(f"page_table must be an int32 torch.Tensor [B, max_pages_per_seq], got "
                            f"{type(page_table).__name__}")
        if page_table.dim() != 2:
            raise ValueError(f"page_table must be an int32 tensor [B, max_pages_per_seq], got shape "
                             f"{tuple(page_table.shape)}")
        _check_int32("page_table", page_table, (B, page_table.shape[1]), q.device)
        page_size = k_cache.shape[1]
        if not 1 <= page_size <= 256:
            raise ValueError(f"the paged cache's page size (k_cache.shape[1]) must be in [1, 256], got {page_size}")
        if page_table.shape[1] < 1 or k_cache.shape[0] < 1:
            raise ValueError("a paged cache needs at least one page and a page table at least one page wide")
        if secure and page_size not in SECURE_PAGE_SIZES:
            raise ValueError(f"secure=True needs a page size in {SECURE_PAGE_SIZES} (the sizes whose kernels the "
                             f"SASS gate verifies; the page size is compiled into the kernel), got {page_size}")
        capacity = page_table.shape[1] * page_size
    else:
        page_size = capacity = k_cache.shape[1]
        if cache_batch_idx is not None:
            _check_int32("cache_batch_idx", cache_batch_idx, (B,), q.device)
        elif k_cache.shape[0] != B:
            raise ValueError(f"k_cache has {k_cache.shape[0]} cache rows but the batch is {B}: pass cache_batch_idx "
                             "to choose rows")
    _check_int32("cache_seqlens", cache_seqlens, (B,), q.device)
    if cache_leftpad is not None:
        if paged:
            raise ValueError("cache_leftpad is only for a contiguous cache")
        _check_int32("cache_leftpad", cache_leftpad, (B,), q.device)
    append = k is not None or v is not None
    if append:
        if k is None or v is None:
            raise ValueError(f"k and v go together: got {'k' if k is not None else 'v'} without "
                             f"{'v' if k is not None else 'k'}")
        want = (q.shape[0], Hkv, D) if packed else (B, Sq, Hkv, D)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != k_cache.dtype:
                raise TypeError(f"{name} must have the cache's dtype {k_cache.dtype} (it is written into the cache), "
                                f"got {t.dtype}")
            if tuple(t.shape) != want:
                raise ValueError(f"{name} must have shape {list(want)} (one new token per query), got {list(t.shape)}")
            if t.device != q.device:
                raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
            check_unit_last_stride(name, t)
        if secure:
            raise ValueError("secure=True does not append (k/v): the write position cache_seqlens is secret and "
                             "would be an address; append in a separate, non-secure call")
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if fp8 and t is None:
            raise ValueError(f"an FP8 cache needs {name} (float32 [B, Hkv]: the factor that maps the stored values "
                             "back to real ones)")
        if t is not None:
            if not fp8:
                raise ValueError(f"{name} is only for an FP8 (float8_e4m3fn) cache; this cache is {k_cache.dtype}")
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
                raise TypeError(f"{name} must be a float32 tensor [B, Hkv]")
            if tuple(t.shape) != (B, Hkv) or t.device != q.device:
                raise ValueError(f"{name} must have shape [{B}, {Hkv}] on q's device, got {list(t.shape)} on "
                                 f"{t.device}")
            if not t.is_contiguous():  # the kernel reads it as a packed [B, Hkv] array
                raise ValueError(f"{name} must be contiguous (the kernels read it as a packed array), got strides "
                                 f"{tuple(t.stride())}")
    scale = check_scale(scale, D)
    num_splits = check_int("num_splits", num_splits)
    if num_splits > MAX_SPLITS:
        raise ValueError(f"num_splits must be in [0, {MAX_SPLITS}] (0: chosen from the shapes), got {num_splits}")
    kernel = check_backend(backend, q)
    check_grad({"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "k_descale": k_descale,
                "v_descale": v_descale}, inference_only="attention_with_kvcache is inference-only (no backward pass)")
    check_out(out, q)
    check_kvcache_aliasing(q, k_cache, v_cache, k if append else None, v if append else None, out)
    if secure:
        warn_not_constant_time(kernel, q.device)
    return KvcacheArgs(B, Sq, Hq, Hkv, D, packed, paged, page_size, capacity, fp8, append, causal, scale, num_splits,
                       return_lse, secure, kernel)


def _check_append_slots(L, grow, page_table, cache_batch_idx, page_size: int, caches) -> None:
    # page_table: the host's int64 copy of it (check_kvcache_values made it); L, grow: int64 CPU tensors
    """No two appended tokens land on one cache slot: two sequences appending at the same positions of a shared
    ``cache_batch_idx`` row or of a page two table rows name, or caches whose views put several rows or positions on
    one address (an expanded view); for each cache, its slots by its own strides. Which write would win is a race.
    Sequences that share rows or pages otherwise are fine: every append lands before any sequence attends, so a
    sequence sees what another appends inside its visible range (``test_every_append_lands_before_any_sequence_
    attends``). In numpy: it runs on every validated eager call that appends (B 64 paged decode: ~20 µs)."""
    strides = {}
    for name, c in caches:
        strides.setdefault((c.stride(0), c.stride(1)), name)
    if page_table is None and cache_batch_idx is None and all(s1 > 0 and s0 >= s1 * page_size for s0, s1 in strides):
        return  # a row a sequence, its positions apart and inside it (page_size: the capacity): no slot twice
    L, grow = L.numpy(), grow.numpy()
    if grow.max() <= 1:  # decode: one token a sequence at most
        seq = np.flatnonzero(grow)
        pos = L[seq]
    else:
        steps = np.arange(int(grow.max()))
        pos = L[:, None] + steps[None, :]
        writes = steps[None, :] < grow[:, None]
        seq = np.broadcast_to(np.arange(L.size)[:, None], pos.shape)[writes]
        pos = pos[writes]
    if page_table is not None:
        row, tok = page_table.numpy()[seq, pos // page_size], pos % page_size  # (the CPU copy the caller made)
    else:
        rows = (cache_batch_idx.detach().to("cpu", torch.int64).numpy() if cache_batch_idx is not None
                else np.arange(L.size))
        row, tok = rows[seq], pos
    for (s0, s1), name in strides.items():
        slot = row * s0 + tok * s1
        if len(set(slot.tolist())) == slot.size:
            continue
        order = np.argsort(slot, kind="stable")
        same = np.flatnonzero(slot[order][1:] == slot[order][:-1])
        if same.size:
            x, y = int(order[same[0]]), int(order[same[0] + 1])
            where = "page" if page_table is not None else "row"
            raise ValueError(f"sequence {int(seq[x])} (position {int(pos[x])}, {where} {int(row[x])}) and sequence "
                             f"{int(seq[y])} (position {int(pos[y])}, {where} {int(row[y])}) append into one slot of "
                             f"{name}: each appended token needs its own slot")


def check_kvcache_values(a: KvcacheArgs, cache_seqlens, page_table, cache_batch_idx, cache_leftpad, cu_seqlens_q,
                         total_q: int, num_pages: int, cache_rows: int, caches: tuple = ()) -> None:
    """Host-side checks of a KV-cache call's values (a sync; eager only, skipped under CUDA-graph capture).

    Secure mode reads one bit of the secret lengths (all in range or not), and checks every page-table entry
    (the kernel reads them all, so unused entries must name real pages too: fill them with any page, e.g. 0)."""
    new = None
    if a.packed:
        c = cu_seqlens_q.detach().to("cpu", torch.int64)
        lens = c[1:] - c[:-1]
        if int(c[0]) != 0 or bool((lens < 0).any()):
            raise ValueError(f"cu_seqlens_q must start at 0 and be non-decreasing, got {c.tolist()}")
        if int(c[-1]) > total_q:
            raise ValueError(f"cu_seqlens_q ends at {int(c[-1])} but q has only {total_q} tokens")
        if lens.numel() and int(lens.max()) > a.seqlen_q:
            raise ValueError(f"max_seqlen_q={a.seqlen_q} is smaller than a real query length ({int(lens.max())})")
        new = lens
    L = cache_seqlens.detach().to("cpu", torch.int64)
    grow = (new if new is not None else torch.full_like(L, a.seqlen_q)) if a.append else torch.zeros_like(L)
    bad = (L < 0) | (L + grow > a.capacity)
    if bool(bad.any()):
        if a.secure:
            raise ValueError(f"cache_seqlens must lie in [0, {a.capacity}] (the cache's capacity)")
        b = int(bad.nonzero()[0])
        what = f" plus {int(grow[b])} new tokens" if a.append else ""
        raise ValueError(f"cache_seqlens[{b}]={int(L[b])}{what} does not fit the cache's capacity {a.capacity} "
                         f"tokens (nor may it be negative)")
    if cache_leftpad is not None:
        lp = cache_leftpad.detach().to("cpu", torch.int64)
        if bool(((lp < 0) | (lp > L)).any()):
            if a.secure:  # both are secret: one bit, as for the lengths
                raise ValueError("cache_leftpad must lie in [0, cache_seqlens] for every sequence")
            b = int(((lp < 0) | (lp > L)).nonzero()[0])
            raise ValueError(f"cache_leftpad[{b}]={int(lp[b])} must lie in [0, cache_seqlens[{b}]={int(L[b])}]")
    if cache_batch_idx is not None:
        idx = cache_batch_idx.detach().to("cpu", torch.int64)
        if bool(((idx < 0) | (idx >= cache_rows)).any()):
            b = int(((idx < 0) | (idx >= cache_rows)).nonzero()[0])
            raise ValueError(f"cache_batch_idx[{b}]={int(idx[b])} is not a row of the cache (it has {cache_rows})")
    if page_table is not None:
        t = page_table.detach().to("cpu", torch.int64)
        cols = torch.arange(t.shape[1]).view(1, -1)
        if a.secure:  # every entry is read: which of them are used would tell the lengths
            bad = (t < 0) | (t >= num_pages)
        else:
            used = (L + grow + a.page_size - 1) // a.page_size  # pages each sequence reads or writes
            bad = (cols < used.view(-1, 1)) & ((t < 0) | (t >= num_pages))
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"page_table[{b}, {j}]={int(t[b, j])} is not a page of the cache (it has {num_pages} "
                             "pages)")
    if a.append and int(grow.max()) > 0:
        _check_append_slots(L, grow, t if page_table is not None else None, cache_batch_idx, a.page_size,
                            (("k_cache", caches[0]), ("v_cache", caches[1])) if caches else ())
