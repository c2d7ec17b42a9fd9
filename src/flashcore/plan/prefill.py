"""Chunked prefill against a contiguous KV cache on the sm_90 Gluon forward kernel.

``attention_with_kvcache`` with many query tokens per sequence (chunked prefill, long speculative blocks) is a
forward pass over the cache with a key length per sequence. The split-KV decode kernel (``kernels/triton/
decode.py``) runs it at 0.73x FA4 (H100, 4x32/8x512 against 8k, causal; perf-notes v22); the warp-specialised
Gluon forward kernel, given each sequence's key length (``KEY_LENS``), runs the dense form of the same shape at
1.34x the decode kernel's speed (perf-notes v28). This module decides, from public facts only, when a KV-cache
call takes that route, and builds its launch: the caller's q, caches and output viewed as ``[B, H, S, D]``, the
key lengths (``cache_seqlens``, plus the appended tokens) read on the device.

The route needs what the Gluon kernel needs (an sm_90 GPU, bf16/fp16, head dim 64 or 128, tensors the copy engine
can address), enough queries per sequence to fill its 128-row items (``PREFILL_MIN_SEQLEN_Q``), and a cache the
kernel can read by TMA: contiguous with one cache row per sequence (no ``cache_batch_idx``), or paged with a page
size the copy engine can take page by page (``PAGE_SIZES``: one copy per page, into its rows of a key tile); no
``cache_leftpad``, no packed queries, no FP8, with the split count left to the planner (an explicit ``num_splits``
asks for the decode kernel).

Secure mode takes the same route (perf-notes v31, v32): the key lengths are secret, so every item visits the tiles of
the whole cache (the capacity, public), masks every tile by select, and the kernel's loader warpgroup clears V's rows
past each length in every tile (``kernels/sm90/pipeline._sanitise_v``), or, where that would clear each tile 16
times or more (perf-notes v46), the V pre-pass cleans them once per call
(``kernels/secure/prepass.attn_secure_zero_v_padding_kernel`` over a contiguous cache's V, or
``attn_secure_gather_v_padding_kernel`` through the page table of a paged one, into a contiguous copy: one read and
write, shared by the query heads of each K/V head) and the kernel's loader only copies. The
decode kernel's secure form ran this shape at 0.25x of the fast path (H200, 2026-11-27). A paged cache in secure
mode has one of the page sizes that secure mode accepts (``_checks.SECURE_PAGE_SIZES``), each a binary of the kernel
that the static gate lists."""
from __future__ import annotations

import torch

from .._checks import SECURE_PAGE_SIZES
from ..launch.secure_prepass import SecurePagedVPrepass, SecurePrepass, prepass_v, prepass_v_paged
from ..launch.sm90_fwd import GluonLaunch
from .knobs import GluonSwitches, gluon_switches
from .tables import gluon_ws, secure_prefill_v_prepass
from ..runtime import device_arch
from ..runtime.tma import addressable

# Queries per sequence from which the Gluon kernel runs a KV-cache call, per head dim (H100, 2026-11-27, 4x32/8 heads,
# 8k cache, perf-notes v28.1): D 128, the Gluon kernel against the decode kernel, Sq 96 109.8 against 147.8 us, Sq 64
# 107.6 against 89.5 (one 128-row item per head either way: the Gluon kernel's time barely moves below 128 rows);
# D 64, Sq 128 81.4 against 102.2, Sq 64 80.7 against 66.4 (96 not measured)
PREFILL_MIN_SEQLEN_Q = {128: 96, 64: 128}
# Page sizes a paged cache takes this route with: powers of two from one 128-byte swizzle atom (8 rows) up; a page
# smaller than a key tile is one copy into its rows of the tile, a larger one a copy of a tile from inside it
PAGE_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)


def bhsd(t: torch.Tensor) -> torch.Tensor:
    """A ``[B, S, H, D]`` tensor as the kernel's ``[B, H, S, D]`` view (no copy)."""
    return t.transpose(1, 2)


def prefill_serves(shape, num_splits: int, q, k_cache, v_cache, out) -> bool:
    """Whether the KV-cache call (``shape``: ``launch.triton_decode.DecodeShape``) runs on the Gluon kernel."""
    if shape.packed or shape.fp8 or shape.fp32 or shape.has_batch_idx:
        return False
    if shape.paged and shape.page_size not in (SECURE_PAGE_SIZES if shape.secure else PAGE_SIZES):
        return False
    if shape.has_leftpad or num_splits != 0 or shape.head_dim not in PREFILL_MIN_SEQLEN_Q:
        return False
    if shape.seqlen_q < PREFILL_MIN_SEQLEN_Q[shape.head_dim] or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    if device_arch(q.device) != (9, 0) or (not shape.paged and k_cache.shape[0] != shape.batch):
        return False
    views = [bhsd(t) for t in (q, k_cache, v_cache)] + ([bhsd(out)] if out is not None else [])
    return all(t.stride(-1) == 1 and addressable(t) for t in views)


def uses_v_prepass(shape, switches: GluonSwitches | None = None) -> bool:
    """Whether a secure chunked-prefill call cleans V by the V pre-pass (the ``secure_prefill_v`` switch;
    "auto": ``plan.tables.secure_prefill_v_prepass``); of a paged cache, into a contiguous copy."""
    mode = (switches if switches is not None else gluon_switches()).secure_prefill_v
    if mode not in ("auto", "prepass", "loader"):
        raise ValueError(f"the secure_prefill_v switch takes 'auto', 'prepass' or 'loader', got {mode!r}")
    if not shape.secure:
        return False
    return mode == "prepass" or (mode == "auto" and secure_prefill_v_prepass(
        shape.causal, shape.num_heads_q // shape.num_heads_kv, shape.seqlen_q))


class PrefillLaunch:
    """A KV-cache call's Gluon route: the kernel's launch, after the V pre-pass where the plan has one (secure:
    :func:`uses_v_prepass`; a paged cache's gathers its pages)."""
    __slots__ = ("launch", "prepass")

    def __init__(self, launch: GluonLaunch, prepass: SecurePrepass | SecurePagedVPrepass | None):
        self.launch, self.prepass = launch, prepass

    def clean_v(self, v_cache, lens, page_table):
        """The V the kernel reads: the cache's ``[B, H, S, D]`` view, or the pre-pass's copy."""
        if self.prepass is None:
            return bhsd(v_cache)
        if isinstance(self.prepass, SecurePagedVPrepass):
            return self.prepass.run(v_cache, lens, page_table)
        return self.prepass.run(None, bhsd(v_cache), lens)[1]

    @property
    def step(self):
        """The Gluon kernel's step."""
        return self.launch.step

    @property
    def steps(self) -> tuple:
        return (self.prepass.step, self.launch.step) if self.prepass is not None else (self.launch.step,)


def prefill_launch(shape, q, k_cache, v_cache, out, lse, table_stride: int = 0) -> PrefillLaunch:
    """The Gluon launch of a call :func:`prefill_serves` accepted: the keys are the whole cache
    (``seqlen_k`` = capacity), each sequence's own length read on the device. Paged: the caches viewed as
    ``[num_pages, Hkv, page_size, D]``, each sequence's pages read from its row of the page table (``table_stride``
    apart). With the V pre-pass (:func:`uses_v_prepass`) the kernel reads its copy of V, ``[B, Hkv, capacity, D]``."""
    o = out if out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse_strides = (shape.num_heads_q * shape.seqlen_q, shape.seqlen_q)  # [B, Hq, Sq] contiguous
    v_view, prepass = bhsd(v_cache), None
    if uses_v_prepass(shape):
        lens = torch.empty(shape.batch, dtype=torch.int32, device=q.device)
        if shape.paged:
            table = torch.empty((shape.batch, max(table_stride, 1)), dtype=torch.int32, device=q.device)
            prepass, v_view = prepass_v_paged(v_cache, lens, table, batch=shape.batch, num_heads_kv=shape.num_heads_kv,
                                              seqlen_k=shape.capacity, page_size=shape.page_size,
                                              table_stride=table_stride)
        else:
            prepass, v_view = prepass_v(v_view, lens, batch=shape.batch, num_heads_kv=shape.num_heads_kv,
                                        seqlen_k=shape.capacity, v_strides=v_view.stride()[:3])
    launch = GluonLaunch(bhsd(q), bhsd(k_cache), v_view, bhsd(o), lse, scale=shape.scale, causal=shape.causal,
                         seqlen_q=shape.seqlen_q, seqlen_k=shape.capacity, batch=shape.batch,
                         num_heads_q=shape.num_heads_q, num_heads_kv=shape.num_heads_kv, lse_strides=lse_strides,
                         cfg=gluon_ws(shape.head_dim, shape.seqlen_q, shape.causal), key_lens=True,
                         page_size=shape.page_size if shape.paged else 0, table_stride=table_stride,
                         secure=shape.secure, v_prepass=prepass is not None)
    return PrefillLaunch(launch, prepass)


def run_prefill(prefill: PrefillLaunch, shape, q, k_cache, v_cache, out, lse, cache_seqlens, device,
                page_table=None) -> None:
    """One call: the key lengths are ``cache_seqlens`` plus the tokens just appended (a small device add); with the V
    pre-pass, its copy of V first."""
    lens = cache_seqlens + shape.seqlen_q if shape.appended else cache_seqlens
    v = prefill.clean_v(v_cache, lens, page_table)
    prefill.launch.run((bhsd(q), bhsd(k_cache), v, bhsd(out), lse, lens), device, page_table=page_table)


__all__ = ["PAGE_SIZES", "PREFILL_MIN_SEQLEN_Q", "PrefillLaunch", "prefill_launch", "prefill_serves", "run_prefill",
           "uses_v_prepass"]
