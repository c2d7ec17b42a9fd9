"""Inputs, float64 reference and backends of the decode suite (:mod:`flashcore.bench.decode`).

Every backend gets the same problem: q ``[B, Sq, Hq, D]``, the cache (contiguous or paged with shuffled pages,
bf16 or FP8 with descales), every sequence full. What each one reads:

* ``flashcore`` / ``flashcore-secure``: :func:`flashcore.attention_with_kvcache` on the cache itself (secure:
  ``secure=True``, lengths at the full cache, so both read every key).
* ``sdpa-default``: ``scaled_dot_product_attention(q, k, v, enable_gqa=True)`` on the contiguous cache
  ``[B, cache_len, Hkv, D]`` viewed as ``[B, Hkv, cache_len, D]`` (no copy). SDPA has no paged or FP8 cache:
  for a paged case it reads the dense cache holding the same values, for an FP8 case the dequantised bf16
  cache (twice the bytes; counted as such). Causal with ``Sq > 1`` goes through
  ``torch.nn.attention.bias.causal_lower_right`` (SDPA's ``is_causal`` is top-left aligned).
* ``fa4``: FlashAttention-4's ``flash_attn.cute.flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=...,
  page_table=...)`` with its default ``num_splits``; what the installed version accepts is read from its
  signature at run time (a missing ``page_table`` / ``seqused_k`` / FP8 descale parameter is recorded as the
  reason it did not run). Imported lazily: on the GPU machine it exists only after the FA4 staging step.
* ``flashinfer``: FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` (``plan`` outside the timed region), for
  one query token and a paged cache; "not installed" when it cannot be imported.

The FP8 descales are one value per tensor (``K_DESCALE``, ``V_DESCALE``) written into the ``[B, Hkv]`` tensors
flashcore takes, so that a peer with per-tensor scales (FlashInfer) computes the same problem.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .check import Piece
from .decode import DecodeCase

Tensor = torch.Tensor
FP8 = torch.float8_e4m3fn
K_DESCALE, V_DESCALE = 0.5, 0.75  # exact in bf16 once multiplied by an e4m3 value
FLASHINFER_WORKSPACE_BYTES = 128 * 1024 ** 2


# ---------------------------------------------------------------- inputs
@dataclass
class DecodeInputs:
    """One input set. ``dense_k``/``dense_v``: ``[B, cache_len, Hkv, D]`` in q's dtype holding the values the
    cache stands for (the cache itself when it is contiguous bf16; the dequantised values for FP8)."""

    shape: DecodeCase  # named as the dense suites' Inputs.shape (check.describe_mismatch reads it)
    q: Tensor
    k_cache: Tensor
    v_cache: Tensor
    cache_seqlens: Tensor
    page_table: Optional[Tensor]
    k_descale: Optional[Tensor]
    v_descale: Optional[Tensor]
    dense_k: Tensor
    dense_v: Tensor
    scale: float

    @property
    def case(self) -> DecodeCase:
        return self.shape

    def kvcache_kwargs(self) -> dict:
        """The keyword arguments of :func:`flashcore.attention_with_kvcache` (and its reference)."""
        return {"cache_seqlens": self.cache_seqlens, "page_table": self.page_table, "k_descale": self.k_descale,
                "v_descale": self.v_descale, "causal": self.case.causal, "scale": self.scale}


def _to_pages(dense: Tensor, perm: Tensor, case: DecodeCase) -> Tensor:
    """Scatter ``[B, cache_len, Hkv, D]`` into a pool of pages: logical page ``j`` of the flattened sequences goes
    to physical page ``perm[j]`` (as bytes, so FP8 needs no indexing kernel of its own)."""
    pages = torch.empty((case.num_pages, case.page_size, case.Hkv, case.D), dtype=dense.dtype, device=dense.device)
    pages.view(torch.uint8)[perm] = dense.view(torch.uint8).reshape(case.num_pages, case.page_size, case.Hkv, -1)
    return pages


def make_decode_inputs(case: DecodeCase, dtype: torch.dtype, device, seed: int = 0) -> DecodeInputs:
    gen = torch.Generator(device=device)
    gen.manual_seed(4321 + seed)
    B, L, Hkv, D = case.B, case.cache_len, case.Hkv, case.D

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=dtype, device=device)

    q = randn(B, case.Sq, case.Hq, D)
    dense_k, dense_v = randn(B, L, Hkv, D), randn(B, L, Hkv, D)
    k_descale = v_descale = None
    if case.fp8:
        k_store, v_store = dense_k.to(FP8), dense_v.to(FP8)
        dense_k.copy_(k_store).mul_(K_DESCALE)  # in place: the dequantised values, no third copy
        dense_v.copy_(v_store).mul_(V_DESCALE)
        k_descale = torch.full((B, Hkv), K_DESCALE, dtype=torch.float32, device=device)
        v_descale = torch.full((B, Hkv), V_DESCALE, dtype=torch.float32, device=device)
    else:
        k_store, v_store = dense_k, dense_v
    page_table = None
    if case.paged:
        perm = torch.randperm(case.num_pages, generator=gen, device=device)
        page_table = perm.view(B, L // case.page_size).to(torch.int32)
        k_cache, v_cache = _to_pages(k_store, perm, case), _to_pages(v_store, perm, case)
        del k_store, v_store
    else:
        k_cache, v_cache = k_store, v_store
    seqlens = torch.full((B,), L, dtype=torch.int32, device=device)
    return DecodeInputs(case, q, k_cache, v_cache, seqlens, page_table, k_descale, v_descale, dense_k, dense_v,
                        D ** -0.5)


# ---------------------------------------------------------------- reference
def checked_batches(case: DecodeCase) -> list:
    """Sequences compared with the reference: the first and the last (every head, every query row)."""
    return sorted({0, case.B - 1})


def reference_pieces(inputs: DecodeInputs) -> list:
    """flashcore's float64 reference (:func:`flashcore.reference.attention_with_kvcache`) on the checked
    sequences, read from the cache exactly as the backends get it (pages, FP8 values times descales): one
    :class:`~flashcore.bench.check.Piece` of the canonical ``[B, Hq, Sq, D]`` output."""
    from flashcore.reference import attention_with_kvcache as reference

    c = inputs.case
    rows = checked_batches(c)
    idx = torch.tensor(rows, dtype=torch.int64, device=inputs.q.device)
    kw = inputs.kvcache_kwargs()
    pick = {name: (kw[name].index_select(0, idx) if isinstance(kw[name], Tensor) else kw[name])
            for name in ("cache_seqlens", "page_table", "k_descale", "v_descale")}
    with torch.no_grad():
        ref = reference(inputs.q.index_select(0, idx), inputs.k_cache, inputs.v_cache,
                        cache_batch_idx=None if c.paged else idx.to(torch.int32), causal=c.causal,
                        scale=inputs.scale, **pick)
    ref = ref.transpose(1, 2).contiguous()  # [n, Hq, Sq, D]

    def select(out: Tensor) -> Tensor:
        return out.index_select(0, idx.to(out.device))

    return [Piece(select, ref)]


# ---------------------------------------------------------------- backends
@dataclass
class DecodeBackend:
    """One implementation the decode suite times; duck-types :class:`flashcore.bench.backends.Backend` for
    :func:`flashcore.bench.runner.bench_backend` (check, then time)."""

    name: str
    label: str
    probe: Callable[[], tuple]
    build: Callable[[DecodeInputs], Callable[[], Tensor]]
    supports: Callable[[DecodeCase, torch.dtype], tuple]  # (ok, reason)
    to_canonical: Callable[[Tensor, DecodeInputs], Tensor]
    reads: str = "cache"  # "cache": the case's own cache; "dense": the dense cache in q's dtype (SDPA)
    is_flashcore: bool = False
    refusal_is_unsupported: bool = True

    def available(self) -> tuple:
        try:
            return self.probe()
        except Exception as e:  # a probe must never take the run down
            return False, f"probe failed: {type(e).__name__}: {e}"

    def check_shape(self, case: DecodeCase, dtype: torch.dtype) -> tuple:
        try:
            ok, why = self.supports(case, dtype)
        except Exception as e:
            return "unsupported", f"support check failed: {type(e).__name__}: {e}"
        return ("ok", "") if ok else ("unsupported", why)

    def make_fn(self, inputs: DecodeInputs) -> Callable[[], Tensor]:
        return self.build(inputs)

    def kv_bytes(self, case: DecodeCase, q_element_size: int = 2) -> int:
        """K/V bytes this backend reads for the case."""
        return case.kv_bytes(q_element_size) if self.reads == "dense" else case.kv_bytes()


def _bshd_to_canonical(out: Tensor, inputs: DecodeInputs) -> Tensor:
    return out.transpose(1, 2)  # [B, Sq, Hq, D] -> [B, Hq, Sq, D]


def _identity(out: Tensor, inputs: DecodeInputs) -> Tensor:
    return out


def _first(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def _any(case, dtype) -> tuple:
    return True, ""


def _cuda_probe() -> tuple:
    return (True, "") if torch.cuda.is_available() else (False, "no CUDA device")


def _import_probe(module: str, what: str) -> Callable[[], tuple]:
    def probe() -> tuple:
        ok, why = _cuda_probe()
        if not ok:
            return ok, why
        try:
            importlib.import_module(module)
        except ImportError as e:
            return False, f"not installed ({what}: cannot import {module}: {str(e).splitlines()[0] if str(e) else e})"
        return True, ""

    return probe


# flashcore
def _flashcore_builder(secure: bool):
    def build(inputs: DecodeInputs):
        import flashcore

        q, k, v, kw = inputs.q, inputs.k_cache, inputs.v_cache, inputs.kvcache_kwargs()
        # One validated call here (lengths and page table checked on the host), then the timed calls skip the
        # check's host sync, as a CUDA-graph replay would.
        flashcore.attention_with_kvcache(q, k, v, secure=secure, validate=True, **kw)
        return lambda: flashcore.attention_with_kvcache(q, k, v, secure=secure, validate=False, **kw)

    return build


# SDPA
def _sdpa_build(inputs: DecodeInputs):
    import torch.nn.functional as F

    c = inputs.case
    q = inputs.q.transpose(1, 2).contiguous()  # [B, Hq, Sq, D] (tiny; copied once, outside the timed region)
    k, v = inputs.dense_k.transpose(1, 2), inputs.dense_v.transpose(1, 2)  # views [B, Hkv, L, D]
    kw = {"scale": inputs.scale}
    if c.Hq != c.Hkv:
        kw["enable_gqa"] = True
    if c.causal and c.Sq > 1:
        from torch.nn.attention.bias import causal_lower_right

        kw["attn_mask"] = causal_lower_right(c.Sq, c.cache_len)
    return lambda: F.scaled_dot_product_attention(q, k, v, **kw)


def _sdpa_probe() -> tuple:
    return _cuda_probe()  # enable_gqa: torch >= 2.5, flashcore's floor


# FlashAttention-4
FA4_MAX_HEAD_DIM = 128  # as the dense suites' fa4 backend: D 256 is refused on sm90 (ANCHORS.md, FA4 4.0.0b36)


def _fa4_params() -> dict:
    from flash_attn.cute import flash_attn_varlen_func

    return dict(inspect.signature(flash_attn_varlen_func).parameters)


def fa4_supports(case: DecodeCase, dtype: torch.dtype, params: Optional[dict] = None) -> tuple:
    """Whether the installed FA4 can run the case; ``params``: its ``flash_attn_varlen_func`` parameters (read
    from the installed version when not given)."""
    params = _fa4_params() if params is None else params
    if "seqused_k" not in params:
        return False, "this flash_attn_varlen_func has no seqused_k (cache lengths)"
    if case.paged and "page_table" not in params:
        return False, "this flash_attn_varlen_func has no page_table (paged KV)"
    if case.fp8 and not {"k_descale", "v_descale"} <= set(params):
        return False, "FP8 cache: this flash_attn_varlen_func takes no k_descale/v_descale"
    if case.D > FA4_MAX_HEAD_DIM:
        return False, f"head dim {case.D}: not run (FA4 refuses D > {FA4_MAX_HEAD_DIM} on sm90)"
    if dtype not in (torch.float16, torch.bfloat16):
        return False, f"dtype {dtype} not supported"
    return True, ""


def _fa4_build(inputs: DecodeInputs):
    from flash_attn.cute import flash_attn_varlen_func

    c = inputs.case
    params = _fa4_params()
    kw = {"seqused_k": inputs.cache_seqlens, "softmax_scale": inputs.scale, "causal": c.causal}
    if c.paged:
        kw["page_table"] = inputs.page_table
    if c.fp8:
        kw.update(k_descale=inputs.k_descale, v_descale=inputs.v_descale)
    kw = {k: v for k, v in kw.items() if k in params}
    q, k, v = inputs.q, inputs.k_cache, inputs.v_cache
    return lambda: _first(flash_attn_varlen_func(q, k, v, **kw))


def _fa4_probe() -> tuple:
    ok, why = _import_probe("flash_attn.cute", "FlashAttention-4")()
    if not ok:
        return ok, why
    params = _fa4_params()
    major = torch.cuda.get_device_capability()[0]
    if major not in (9, 10, 11):
        return False, f"FlashAttention-4 needs sm90/sm100 (this GPU is sm{major}x)"
    if "seqused_k" not in params:
        return False, "this FlashAttention-4 has no seqused_k in flash_attn_varlen_func"
    return True, ""


# FlashInfer
def flashinfer_supports(case: DecodeCase, dtype: torch.dtype) -> tuple:
    if case.Sq != 1:
        return False, "the decode wrapper takes one query token per sequence (Sq > 1 is not benchmarked here)"
    if not case.paged:
        return False, "a paged cache only (its decode wrapper reads pages)"
    return True, ""


def _flashinfer_build(inputs: DecodeInputs):
    import flashinfer

    c = inputs.case
    device = inputs.q.device
    workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    per_seq = c.cache_len // c.page_size
    indptr = torch.arange(0, c.B + 1, dtype=torch.int32, device=device) * per_seq
    indices = inputs.page_table.reshape(-1).contiguous()
    last = torch.full((c.B,), c.page_size, dtype=torch.int32, device=device)
    plan_params = inspect.signature(wrapper.plan).parameters
    plan_kw = {"pos_encoding_mode": "NONE", "q_data_type": inputs.q.dtype,
               "kv_data_type": inputs.k_cache.dtype, "sm_scale": inputs.scale}
    wrapper.plan(indptr, indices, last, c.Hq, c.Hkv, c.D, c.page_size,
                 **{k: v for k, v in plan_kw.items() if k in plan_params})
    q = inputs.q[:, 0].contiguous()  # [B, Hq, D]
    kv = (inputs.k_cache, inputs.v_cache)
    run_kw = {}
    if c.fp8:
        run_params = inspect.signature(wrapper.run).parameters
        if not {"k_scale", "v_scale"} <= set(run_params):
            raise NotImplementedError("this FlashInfer's run() takes no k_scale/v_scale (FP8 cache)")
        run_kw = {"k_scale": K_DESCALE, "v_scale": V_DESCALE}
    keep = (workspace, indptr, indices, last)  # alive as long as the callable

    def fn():
        keep  # noqa: B018
        return wrapper.run(q, kv, **run_kw)

    return fn


def _flashinfer_canonical(out: Tensor, inputs: DecodeInputs) -> Tensor:
    return out.unsqueeze(2)  # [B, Hq, D] -> [B, Hq, 1, D]


def _secure_pages(case: DecodeCase, dtype: torch.dtype) -> tuple:
    """Secure mode takes the page sizes whose constant-time form the SASS gate verified (and contiguous caches)."""
    from flashcore._checks import SECURE_PAGE_SIZES

    page = case.page_size
    if page and page not in SECURE_PAGE_SIZES:
        return False, f"secure mode takes page sizes {SECURE_PAGE_SIZES} (the SASS-verified forms), not {page}"
    return True, ""


# ---------------------------------------------------------------- registry
DECODE_BACKEND_NAMES = ("flashcore", "flashcore-secure", "sdpa-default", "fa4", "flashinfer")
FLASHCORE_NAMES = ("flashcore", "flashcore-secure")
SDPA_NAME = "sdpa-default"


def make_decode_registry() -> dict:
    fc_probe = _import_probe("flashcore.ops", "flashcore")
    backends = [
        DecodeBackend("flashcore", "flashcore attention_with_kvcache", fc_probe, _flashcore_builder(False), _any,
                      _bshd_to_canonical, is_flashcore=True, refusal_is_unsupported=False),
        DecodeBackend("flashcore-secure", "flashcore secure=True (every page read)", fc_probe,
                      _flashcore_builder(True), _secure_pages, _bshd_to_canonical, is_flashcore=True,
                      refusal_is_unsupported=False),
        DecodeBackend("sdpa-default", "SDPA default dispatch (dense cache; FP8: dequantised bf16)", _sdpa_probe,
                      _sdpa_build, _any, _identity, reads="dense"),
        DecodeBackend("fa4", "FlashAttention-4 flash_attn_varlen_func (page_table, seqused_k)", _fa4_probe,
                      _fa4_build, fa4_supports, _bshd_to_canonical),
        DecodeBackend("flashinfer", "FlashInfer BatchDecodeWithPagedKVCacheWrapper", _import_probe(
            "flashinfer", "FlashInfer (optional)"), _flashinfer_build, flashinfer_supports, _flashinfer_canonical),
    ]
    assert tuple(b.name for b in backends) == DECODE_BACKEND_NAMES
    return {b.name: b for b in backends}


def parse_decode_backend_names(values) -> list:
    """``--backends`` values for the decode suite → validated names, in the given order (default: all)."""
    names = []
    for value in values or ():
        names.extend(n.strip() for n in str(value).split(",") if n.strip())
    unknown = [n for n in names if n not in DECODE_BACKEND_NAMES]
    if unknown:
        raise ValueError(f"unknown backend '{unknown[0]}' for the decode suite; choose from: "
                         f"{', '.join(DECODE_BACKEND_NAMES)}")
    return list(dict.fromkeys(names)) or list(DECODE_BACKEND_NAMES)
