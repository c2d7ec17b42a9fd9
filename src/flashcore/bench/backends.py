"""The attention implementations the benchmark can time, each declaring what it supports.

A :class:`Backend` says up front which dtypes, head dims, GQA, bottom-right causal with
``Sq != Sk`` and varlen it handles, so an unsupported shape is reported as such instead of
failing deep inside a library. ``make_fn(inputs)`` does every per-input preparation (layout
copies, block masks, compilation handles) outside the timed region and returns the zero-argument
callable that is timed.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .suites import Shape

Tensor = torch.Tensor
HALF_DTYPES = (torch.float16, torch.bfloat16)
ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GIB = 1024 ** 3
UNFUSED_MAX_SCORE_BYTES = 8 * GIB
MATH_MAX_SEQ = 8192


# ---------------------------------------------------------------- inputs
@dataclass
class Inputs:
    """One set of benchmark tensors. Dense: ``[B, H, S, D]``; varlen: packed ``[total, H, D]``."""

    shape: Shape
    q: Tensor
    k: Tensor
    v: Tensor
    scale: float
    cu_seqlens: Optional[Tensor] = None  # varlen: int32 [B+1], shared by q and k
    seqlens_q: Optional[Tensor] = None  # secure mode: int32 [B], every sequence full length
    seqlens_k: Optional[Tensor] = None


def make_inputs(shape: Shape, dtype: torch.dtype, device, seed: int = 0) -> Inputs:
    gen = torch.Generator(device=device)
    gen.manual_seed(1234 + seed)

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=dtype, device=device)

    scale = shape.D ** -0.5
    if shape.is_varlen:
        total = shape.total_tokens
        lens = torch.tensor((0,) + shape.varlen, dtype=torch.int64)
        cu = torch.cumsum(lens, 0).to(device=device, dtype=torch.int32)
        return Inputs(shape, randn(total, shape.Hq, shape.D), randn(total, shape.Hkv, shape.D),
                      randn(total, shape.Hkv, shape.D), scale, cu_seqlens=cu)
    q = randn(shape.B, shape.Hq, shape.Sq, shape.D)
    k = randn(shape.B, shape.Hkv, shape.Sk, shape.D)
    v = randn(shape.B, shape.Hkv, shape.Sk, shape.D)
    full_q = torch.full((shape.B,), shape.Sq, dtype=torch.int32, device=device)
    full_k = torch.full((shape.B,), shape.Sk, dtype=torch.int32, device=device)
    return Inputs(shape, q, k, v, scale, seqlens_q=full_q, seqlens_k=full_k)


# ---------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Support:
    """What a backend can run (capabilities, not policy)."""

    dtypes: tuple = HALF_DTYPES
    head_dims: Optional[tuple] = None  # None: any multiple of 8 up to max_head_dim
    max_head_dim: int = 256
    gqa: bool = True
    causal_cross: bool = True  # causal with Sq != Sk, bottom-right aligned
    varlen: bool = False

    def check(self, shape: Shape, dtype: torch.dtype) -> tuple:
        if dtype not in self.dtypes:
            return False, f"dtype {str(dtype).replace('torch.', '')} not supported"
        if self.head_dims is not None and shape.D not in self.head_dims:
            return False, f"head dim {shape.D} not supported (supports {', '.join(map(str, self.head_dims))})"
        if shape.D > self.max_head_dim or shape.D % 8:
            return False, f"head dim {shape.D} not supported (multiples of 8 up to {self.max_head_dim})"
        if shape.gqa and not self.gqa:
            return False, "GQA (Hkv != Hq) not supported"
        if shape.is_varlen and not self.varlen:
            return False, "varlen (packed sequences) not supported"
        if shape.causal and shape.Sq != shape.Sk and not self.causal_cross:
            return False, "causal with Sq != Sk not supported (its causal mask is top-left aligned; flashcore's is bottom-right)"
        return True, ""


@dataclass(frozen=True)
class Limits:
    """Policy: shapes a backend could run but that would take too much time or memory."""

    max_seq: Optional[int] = None
    max_score_bytes: Optional[int] = None

    def check(self, shape: Shape, dtype: torch.dtype) -> tuple:
        if self.max_seq is not None and max(shape.Sq, shape.Sk) > self.max_seq:
            return False, f"skipped for S > {self.max_seq} (time/memory; see --math-max-seq)"
        if self.max_score_bytes is not None:
            size = shape.score_bytes(torch.empty((), dtype=dtype).element_size())
            if size > self.max_score_bytes:
                return False, f"skipped: the S×S score matrix would take {size / GIB:.1f} GiB (> {self.max_score_bytes / GIB:.0f} GiB)"
        return True, ""


def _identity(out: Tensor, inputs: Inputs) -> Tensor:
    return out


@dataclass
class Backend:
    name: str
    label: str
    support: Support
    probe: Callable[[], tuple]  # () -> (available, reason)
    build: Callable[[Inputs], Callable[[], Tensor]]
    limits: Limits = field(default_factory=Limits)
    is_flashcore: bool = False
    # An exception on the first call means "this library refuses the shape" (reported as
    # unsupported) rather than a bug (reported as an error). Never true for flashcore.
    refusal_is_unsupported: bool = True
    to_canonical: Callable[[Tensor, Inputs], Tensor] = _identity  # output → [B,H,S,D] / [total,H,D]

    def available(self) -> tuple:
        try:
            return self.probe()
        except Exception as e:  # a probe must never take the whole benchmark down
            return False, f"probe failed: {type(e).__name__}: {e}"

    def check_shape(self, shape: Shape, dtype: torch.dtype) -> tuple:
        """(status, reason): status "ok", "unsupported" (capability) or "skipped" (policy)."""
        ok, why = self.support.check(shape, dtype)
        if not ok:
            return "unsupported", why
        ok, why = self.limits.check(shape, dtype)
        return ("ok", "") if ok else ("skipped", why)

    def supports(self, shape: Shape, dtype: torch.dtype = torch.bfloat16) -> tuple:
        status, why = self.check_shape(shape, dtype)
        return status == "ok", why

    def make_fn(self, inputs: Inputs) -> Callable[[], Tensor]:
        return self.build(inputs)


# ---------------------------------------------------------------- probes
def _cuda_probe() -> tuple:
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    return True, ""


def _module_probe(module: str, hint: str) -> tuple:
    ok, why = _cuda_probe()
    if not ok:
        return ok, why
    try:
        importlib.import_module(module)
    except Exception as e:
        return False, f"cannot import {module} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}){hint}"
    return True, ""


def _flashcore_probe() -> tuple:
    return _module_probe("flashcore.ops", "")


def _sdpa_probe(backend_name: Optional[str]) -> Callable[[], tuple]:
    def probe() -> tuple:
        ok, why = _cuda_probe()
        if not ok:
            return ok, why
        from torch.nn.attention import SDPBackend  # noqa: F401  (torch >= 2.3)

        if backend_name is not None and not hasattr(SDPBackend, backend_name):
            return False, f"this torch has no SDPBackend.{backend_name}"
        if backend_name == "FLASH_ATTENTION":
            check = getattr(torch.backends.cuda, "is_flash_attention_available", None)
            if check is not None and not check():
                return False, "torch was built without flash attention"
        if backend_name == "CUDNN_ATTENTION" and not torch.backends.cudnn.is_available():
            return False, "cuDNN is not available"
        return True, ""

    return probe


def _flex_probe() -> tuple:
    ok, why = _module_probe("torch.nn.attention.flex_attention", "")
    if ok and torch.cuda.get_device_capability()[0] < 8:
        return False, "FlexAttention needs sm80+"
    return ok, why


def _fa4_probe() -> tuple:
    ok, why = _module_probe("flash_attn.cute", " — install FlashAttention-4 (flash_attn.cute) to compare against it")
    if not ok:
        return ok, why
    from flash_attn.cute import flash_attn_func  # noqa: F401

    major = torch.cuda.get_device_capability()[0]
    if major not in (9, 10, 11):
        return False, f"FlashAttention-4 needs sm90/sm100 (this GPU is sm{major}x)"
    return True, ""


def _unfused_probe() -> tuple:
    return _module_probe("triton", "")


# ---------------------------------------------------------------- builders
def _build_flashcore(inputs: Inputs):
    import flashcore

    s, q, k, v = inputs.shape, inputs.q, inputs.k, inputs.v
    if s.is_varlen:
        cu, m = inputs.cu_seqlens, s.Sq
        return lambda: flashcore.attention_varlen(q, k, v, cu, cu, m, m, causal=s.causal, scale=inputs.scale)
    return lambda: flashcore.attention(q, k, v, causal=s.causal, scale=inputs.scale)


def _build_flashcore_secure(inputs: Inputs):
    import flashcore

    s, q, k, v = inputs.shape, inputs.q, inputs.k, inputs.v
    # Self-attention passes only seqlens_k: query lengths are then the key lengths and the causal
    # diagonal is public, so the kernel may skip the blocks above it (as a user would call it).
    lq = None if s.Sq == s.Sk else inputs.seqlens_q
    lk = inputs.seqlens_k
    # validate_seqlens=False: time the kernel, not the eager range check's host sync
    return lambda: flashcore.attention(q, k, v, causal=s.causal, scale=inputs.scale, secure=True,
                                       seqlens_q=lq, seqlens_k=lk, validate_seqlens=False)


def _sdpa_builder(backend_name: Optional[str]):
    def build(inputs: Inputs):
        import torch.nn.functional as F

        s, q, k, v = inputs.shape, inputs.q, inputs.k, inputs.v
        kw = {"is_causal": s.causal, "scale": inputs.scale}
        if s.gqa:
            kw["enable_gqa"] = True
        if backend_name is None:
            return lambda: F.scaled_dot_product_attention(q, k, v, **kw)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        forced = [getattr(SDPBackend, backend_name)]

        def fn():
            with sdpa_kernel(forced):
                return F.scaled_dot_product_attention(q, k, v, **kw)

        return fn

    return build


def _raise_dynamo_recompile_limit(limit: int = 256) -> None:
    """Every shape compiles FlexAttention anew; the default limit (8) would silently fall back
    to eager flex_attention (slow, and it materialises the scores) after a few shapes."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), limit))


class _FlexBuilder:
    """torch.compile(flex_attention), one block mask per shape (built outside the timed region)."""

    def __init__(self):
        self._compiled = None
        self._mask_key = None
        self._mask = None

    def __call__(self, inputs: Inputs):
        from torch.nn.attention.flex_attention import flex_attention

        if self._compiled is None:
            _raise_dynamo_recompile_limit()
            self._compiled = torch.compile(flex_attention, dynamic=False)
        s = inputs.shape
        if s.is_varlen:  # packed [total, H, D] → one "batch" [1, H, total, D]
            q, k, v = (t.transpose(0, 1).unsqueeze(0).contiguous() for t in (inputs.q, inputs.k, inputs.v))
        else:
            q, k, v = inputs.q, inputs.k, inputs.v
        block_mask = self._block_mask(inputs) if (s.causal or s.is_varlen) else None
        kw = {"block_mask": block_mask, "scale": inputs.scale, "enable_gqa": s.gqa}
        compiled = self._compiled
        return lambda: compiled(q, k, v, **kw)

    def _block_mask(self, inputs: Inputs):
        from torch.nn.attention.flex_attention import create_block_mask

        s = inputs.shape
        if self._mask_key == s.key:
            return self._mask
        device = inputs.q.device
        if s.is_varlen:
            doc = torch.repeat_interleave(torch.arange(s.B, device=device),
                                          torch.tensor(s.varlen, device=device))
            mask_mod = _document_mask(doc, s.causal)
            q_len = kv_len = s.total_tokens
        else:
            mask_mod = _bottom_right_causal(s.Sk - s.Sq)
            q_len, kv_len = s.Sq, s.Sk
        self._mask = create_block_mask(mask_mod, None, None, q_len, kv_len, device=device)
        self._mask_key = s.key
        return self._mask


def _bottom_right_causal(offset: int):
    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return mask_mod


def _document_mask(doc: Tensor, causal: bool):
    # Packed sequences have equal query and key offsets, so "causal" is kv <= q within a document.
    if causal:
        def mask_mod(b, h, q_idx, kv_idx):
            return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)
    else:
        def mask_mod(b, h, q_idx, kv_idx):
            return doc[q_idx] == doc[kv_idx]
    return mask_mod


def _flex_canonical(out: Tensor, inputs: Inputs) -> Tensor:
    return out[0].transpose(0, 1) if inputs.shape.is_varlen else out


def _first(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def _build_fa4(inputs: Inputs):
    from flash_attn.cute import flash_attn_func

    s = inputs.shape
    if s.is_varlen:
        from flash_attn.cute import flash_attn_varlen_func

        q, k, v, cu = inputs.q, inputs.k, inputs.v, inputs.cu_seqlens
        kw = {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "softmax_scale": inputs.scale, "causal": s.causal}
        params = inspect.signature(flash_attn_varlen_func).parameters
        if "max_seqlen_q" in params:  # older FA4 releases derive it from cu_seqlens
            kw.update(max_seqlen_q=s.Sq, max_seqlen_k=s.Sk)
        return lambda: _first(flash_attn_varlen_func(q, k, v, **kw))
    # FA4 takes [B, S, H, D]; the copies are made once, outside the timed region.
    q, k, v = (t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k, inputs.v))
    scale, causal = inputs.scale, s.causal
    return lambda: _first(flash_attn_func(q, k, v, softmax_scale=scale, causal=causal))


def _fa4_canonical(out: Tensor, inputs: Inputs) -> Tensor:
    return out if inputs.shape.is_varlen else out.transpose(1, 2)


def _build_unfused(inputs: Inputs):
    from .unfused import unfused_attention

    s, q, k, v = inputs.shape, inputs.q, inputs.k, inputs.v
    return lambda: unfused_attention(q, k, v, causal=s.causal, scale=inputs.scale)


# ---------------------------------------------------------------- registry
BACKEND_NAMES = ("flashcore", "flashcore-secure", "sdpa-default", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient",
                 "sdpa-math", "flex", "fa4", "unfused")
FLASHCORE_NAMES = ("flashcore", "flashcore-secure")
SDPA_DEFAULT = "sdpa-default"


def make_registry(math_max_seq: Optional[int] = MATH_MAX_SEQ) -> dict:
    """name → Backend, in display order. ``math_max_seq=None`` lets SDPA math run every shape."""
    sdpa_nocross = dict(causal_cross=False, varlen=False)
    backends = [
        Backend("flashcore", "flashcore", Support(ALL_DTYPES, varlen=True), _flashcore_probe, _build_flashcore,
                is_flashcore=True, refusal_is_unsupported=False),
        Backend("flashcore-secure", "flashcore secure (constant-time)", Support(ALL_DTYPES, varlen=False),
                _flashcore_probe, _build_flashcore_secure, is_flashcore=True, refusal_is_unsupported=False),
        Backend("sdpa-default", "SDPA (default dispatch)", Support(ALL_DTYPES, **sdpa_nocross), _sdpa_probe(None),
                _sdpa_builder(None)),
        Backend("sdpa-cudnn", "SDPA cuDNN", Support(HALF_DTYPES, **sdpa_nocross), _sdpa_probe("CUDNN_ATTENTION"),
                _sdpa_builder("CUDNN_ATTENTION")),
        Backend("sdpa-flash", "SDPA flash", Support(HALF_DTYPES, **sdpa_nocross), _sdpa_probe("FLASH_ATTENTION"),
                _sdpa_builder("FLASH_ATTENTION")),
        Backend("sdpa-efficient", "SDPA mem-efficient", Support(ALL_DTYPES, **sdpa_nocross),
                _sdpa_probe("EFFICIENT_ATTENTION"), _sdpa_builder("EFFICIENT_ATTENTION")),
        Backend("sdpa-math", "SDPA math", Support(ALL_DTYPES, max_head_dim=1 << 20, **sdpa_nocross), _sdpa_probe("MATH"),
                _sdpa_builder("MATH"), limits=Limits(max_seq=math_max_seq)),
        Backend("flex", "FlexAttention (compiled)", Support(ALL_DTYPES, varlen=True), _flex_probe, _FlexBuilder(),
                to_canonical=_flex_canonical),
        Backend("fa4", "FlashAttention-4 (CuTe)", Support(HALF_DTYPES, head_dims=(64, 96, 128), varlen=True),
                _fa4_probe, _build_fa4, to_canonical=_fa4_canonical),
        Backend("unfused", "unfused (cuBLAS+Triton softmax)", Support(ALL_DTYPES, varlen=False), _unfused_probe,
                _build_unfused, limits=Limits(max_score_bytes=UNFUSED_MAX_SCORE_BYTES), refusal_is_unsupported=False),
    ]
    assert tuple(b.name for b in backends) == BACKEND_NAMES
    return {b.name: b for b in backends}


def parse_backend_names(values) -> list:
    """``--backends`` values (space- and/or comma-separated) → validated names, in the given order."""
    names = []
    for value in values or ():
        names.extend(n.strip() for n in str(value).split(",") if n.strip())
    unknown = [n for n in names if n not in BACKEND_NAMES]
    if unknown:
        raise ValueError(f"unknown backend '{unknown[0]}'; choose from: {', '.join(BACKEND_NAMES)}")
    return list(dict.fromkeys(names)) or list(BACKEND_NAMES)
