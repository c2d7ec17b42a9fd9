"""Launch builders of the secure pre-passes (``kernels/secure/prepass.py``) and the plan step that runs them."""
from __future__ import annotations

import torch

from ..kernels.secure.prepass import (
    W_ROWS,
    attn_secure_fill_rows_kernel,
    attn_secure_gather_v_padding_kernel,
    attn_secure_sanitize_kv_kernel,
    attn_secure_zero_v_padding_kernel,
)
from ..plan.knobs import secure_padding, secure_v_pad_pairs
from ..plan.tables import block_d
from ..runtime import KernelStep, cdiv

PREPASS_BLOCK_S = 64  # the most rows per program (the row fill's, and the pre-passes' at narrow head dims)
PREPASS_WARPS = 4
PREPASS_TILE_BYTES = 4096  # the V and K/V pre-passes from D=128 up: bytes of each tensor's tile per program


def prepass_block_s(head_dim: int, element_bytes: int) -> int:
    """Rows per program of the V and K/V pre-passes: 64 up to D=64; from D=128 up a tile of PREPASS_TILE_BYTES per
    tensor, at least 8 rows (16-bit: 16 rows at D=128, 8 at D=256; fp32: 8).

    Measured on H200 (2026-11-29, docs/perf-notes.md v45, ``python -m flashcore.bench.experiments.prepass_tiles``,
    cold L2, beside a device copy of the same bytes, outputs bit for bit the same), as a fraction of the copy's
    bandwidth, 64 rows against this rule: bf16 D=128 K/V 0.70 against 1.01 (4x32x4096x128: 189 against 133 us),
    V 0.91 against 0.99; bf16 D=256 V 0.83 against 0.99; fp32 D=128 V 0.92 against 0.97, D=256 0.76 against 0.95.
    At D=64 32-row tiles tied alone (1.03 at 16x16x2048x64 bf16) and lost 1.1 us at 1x8x512x64 in the secure call,
    whose kernel starts beside its pre-pass (perf-notes v44; a guess: twice the pre-pass's programs leave fewer SMs
    free for it), so D=64 keeps 64 rows."""
    if block_d(head_dim) <= 64:
        return PREPASS_BLOCK_S
    return max(8, min(PREPASS_BLOCK_S, PREPASS_TILE_BYTES // (block_d(head_dim) * element_bytes)))


def key_weights_shape(batch: int, seqlen_k: int) -> tuple[int, int, int]:
    """``[B, W_ROWS, w_len]``: w_len is seqlen_k rounded up to 8 elements, so each row starts 16-byte
    aligned, as the copy engine (TMA) needs; tiles past w_len read zeros."""
    return batch, W_ROWS, -(-seqlen_k // 8) * 8


def build_prepass(v, vs, seqlens_k, *, seqlen_k: int, batch: int, num_heads_kv: int, v_strides,
                  pdl_trigger: bool = False):
    """(grid, positional args, constexprs) of the secure V pre-pass. ``pdl_trigger``: the kernel after it is its
    programmatic dependent (the secure Gluon kernel, ``launch.sm90_fwd.GluonLaunch(pdl_wait=True)``), which may
    launch as this pass starts."""
    head_dim = v.shape[-1]
    args = [v, vs, seqlens_k, *v_strides, seqlen_k, num_heads_kv]
    rows = prepass_block_s(head_dim, v.element_size())
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_S=rows, PDL_TRIGGER=bool(pdl_trigger))
    return (cdiv(seqlen_k, rows), batch * num_heads_kv), args, constexprs


def build_prepass_paged(v, vs, seqlens_k, page_table, *, seqlen_k: int, batch: int, num_heads_kv: int,
                        page_size: int, table_stride: int):
    """(grid, positional args, constexprs) of the secure V pre-pass over a paged cache
    (``attn_secure_gather_v_padding_kernel``): ``v`` ``[num_pages, page_size, Hkv, D]``, ``vs`` contiguous ``[B, Hkv,
    seqlen_k, D]`` (``seqlen_k``: the capacity), the page table's rows ``table_stride`` apart."""
    head_dim = v.shape[-1]
    args = [v, vs, seqlens_k, page_table, v.stride(0), v.stride(2), v.stride(1), table_stride, seqlen_k, num_heads_kv,
            v.shape[0]]
    rows = prepass_block_s(head_dim, v.element_size())
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_S=rows, PAGE_SIZE=page_size)
    return (cdiv(seqlen_k, rows), batch * num_heads_kv), args, constexprs


def build_prepass_kv(k, v, ks, vs, w, seqlens_k, *, seqlen_k: int, batch: int, num_heads_kv: int, k_strides,
                     v_strides, pdl_trigger: bool = False):
    """(grid, positional args, constexprs) of the secure K/V pre-pass with key weights
    (``attn_secure_sanitize_kv_kernel``); ``w`` is ``key_weights_shape(batch, seqlen_k)``; ``pdl_trigger`` as in
    :func:`build_prepass`."""
    head_dim = v.shape[-1]
    args = [k, v, ks, vs, w, seqlens_k, *k_strides, *v_strides, seqlen_k, num_heads_kv, w.shape[-1]]
    pad = secure_padding()
    rows = prepass_block_s(head_dim, v.element_size())
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_S=rows, W_ROWS=W_ROWS,
                      V_PAD_PAIRS=secure_v_pad_pairs(), K_PAD_SCALED=pad.k_scaled, W_PAD_PAIRS=pad.w_pairs,
                      PDL_TRIGGER=bool(pdl_trigger))
    # w_len = seqlen_k rounded up to 8 <= the rows this grid covers (rows is a multiple of 8)
    return (cdiv(seqlen_k, rows), batch * num_heads_kv), args, constexprs


def fill_rows_block(head_dim: int, element_bytes: int) -> int:
    """Rows per program of the row fill: 64, or 32 where a 64-row tile would pass 64 KiB (fp32 at D=256). At 64
    rows that form spilled, and ptxas guarded the spill stores with the secret length's predicate (the static
    gate's finding, 2026-11-26); at 32 it is clean."""
    return PREPASS_BLOCK_S if PREPASS_BLOCK_S * block_d(head_dim) * element_bytes <= 32 * 1024 else PREPASS_BLOCK_S // 2


def build_fill_rows(x, xs, seqlens, *, seqlen: int, batch: int, num_heads: int, x_strides):
    """(grid, positional args, constexprs) of the secure row fill (``attn_secure_fill_rows_kernel``)."""
    head_dim = x.shape[-1]
    rows = fill_rows_block(head_dim, x.element_size())
    args = [x, xs, seqlens, *x_strides, seqlen, num_heads]
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_S=rows)
    return (cdiv(seqlen, rows), batch * num_heads), args, constexprs


class SecureRowFill:
    """A plan's step that copies Q (or K) with its padding rows replaced by data-like stand-ins;
    ``run(x, seqlens)`` returns the copy (contiguous ``[B, H, S, D]``, the plan's workspace)."""
    __slots__ = ("step", "shape", "name")

    def __init__(self, step, shape, name):
        self.step, self.shape, self.name = step, shape, name

    @property
    def workspace(self) -> tuple:
        return ((self.name, self.shape),)

    def run(self, x, seqlens):
        xs = torch.empty(self.shape, dtype=x.dtype, device=x.device)
        self.step.run((x, xs, seqlens), x.device)
        return xs


def fill_rows(x, seqlens, *, batch, num_heads, seqlen, x_strides, name):
    """(row-fill step, a representative copy) for secure mode."""
    xs = torch.empty((batch, num_heads, seqlen, x.shape[-1]), dtype=x.dtype, device=x.device)
    grid, args, ce = build_fill_rows(x, xs, seqlens, seqlen=seqlen, batch=batch, num_heads=num_heads,
                                     x_strides=x_strides)
    step = KernelStep(attn_secure_fill_rows_kernel, grid, args, 3, ce, PREPASS_WARPS, 1)
    return SecureRowFill(step, xs.shape, name), xs


class SecurePrepass:
    """A plan's secure pre-pass step: ``run`` returns the (k, v, key weights) the main kernel reads.

    * V only (``key_weights_shape`` None; the Triton kernel and the Gluon kernel's causal form): a copy
      of V with its padding replaced, K as given, no weights.
    * K and V (the Gluon kernel's non-causal form): sanitised copies of both plus the 0/1 key weights.
    Its outputs are the plan's workspace (:attr:`workspace`): new tensors from PyTorch's caching allocator on
    every call, so CUDA-graph capture works (the graph's private pool keeps them)."""
    __slots__ = ("step", "kv_shape", "key_weights_shape")

    def __init__(self, step, kv_shape, key_weights_shape=None):
        self.step, self.kv_shape, self.key_weights_shape = step, kv_shape, key_weights_shape

    @property
    def workspace(self) -> tuple:
        """(name, shape) of each buffer this step writes (the input's dtype)."""
        if self.key_weights_shape is None:
            return (("v_clean", self.kv_shape),)
        return (("k_clean", self.kv_shape), ("v_clean", self.kv_shape), ("key_weights", self.key_weights_shape))

    def run(self, k, v, seqlens_k):
        vs = torch.empty(self.kv_shape, dtype=v.dtype, device=v.device)
        if self.key_weights_shape is None:
            self.step.run((v, vs, seqlens_k), v.device)
            return k, vs, None
        ks = torch.empty(self.kv_shape, dtype=k.dtype, device=k.device)
        w = torch.empty(self.key_weights_shape, dtype=k.dtype, device=k.device)
        self.step.run((k, v, ks, vs, w, seqlens_k), v.device)
        return ks, vs, w


class SecurePagedVPrepass:
    """A plan's V pre-pass over a paged cache (secure chunked prefill): ``run(v_cache, seqlens_k, page_table)``
    returns the contiguous copy ``[B, Hkv, capacity, D]`` whose rows past each length hold the public pattern (new from
    PyTorch's caching allocator on every call, as :class:`SecurePrepass`'s outputs)."""
    __slots__ = ("step", "kv_shape")

    def __init__(self, step, kv_shape):
        self.step, self.kv_shape = step, kv_shape

    @property
    def workspace(self) -> tuple:
        return (("v_clean", self.kv_shape),)

    def run(self, v, seqlens_k, page_table):
        vs = torch.empty(self.kv_shape, dtype=v.dtype, device=v.device)
        self.step.run((v, vs, seqlens_k, page_table), v.device)
        return vs


def prepass_v_paged(v, seqlens_k, page_table, *, batch, num_heads_kv, seqlen_k, page_size, table_stride):
    """(paged V pre-pass step, a representative contiguous copy of V) for secure chunked prefill from a paged cache
    ``v`` ``[num_pages, page_size, Hkv, D]``."""
    vs = torch.empty((batch, num_heads_kv, seqlen_k, v.shape[-1]), dtype=v.dtype, device=v.device)
    grid, args, ce = build_prepass_paged(v, vs, seqlens_k, page_table, seqlen_k=seqlen_k, batch=batch,
                                         num_heads_kv=num_heads_kv, page_size=page_size, table_stride=table_stride)
    step = KernelStep(attn_secure_gather_v_padding_kernel, grid, args, 4, ce, PREPASS_WARPS, 1)
    return SecurePagedVPrepass(step, vs.shape), vs


def prepass_v(v, seqlens_k, *, batch, num_heads_kv, seqlen_k, v_strides, pdl_trigger=False):
    """(V pre-pass step, a representative sanitised copy of V) for secure mode (``pdl_trigger``: see
    :func:`build_prepass`)."""
    B, Hkv, Sk, D = batch, num_heads_kv, seqlen_k, v.shape[-1]
    vs = torch.empty((B, Hkv, Sk, D), dtype=v.dtype, device=v.device)
    grid, args, ce = build_prepass(v, vs, seqlens_k, seqlen_k=Sk, batch=B, num_heads_kv=Hkv, v_strides=v_strides,
                                   pdl_trigger=pdl_trigger)
    step = KernelStep(attn_secure_zero_v_padding_kernel, grid, args, 3, ce, PREPASS_WARPS, 1)
    return SecurePrepass(step, vs.shape), vs


def prepass_kv(k, v, seqlens_k, *, batch, num_heads_kv, seqlen_k, k_strides, v_strides, pdl_trigger=False):
    """(K/V pre-pass step with key weights, representative sanitised copies of K and V) for the secure Gluon
    kernel's non-causal form (``pdl_trigger``: see :func:`build_prepass`)."""
    B, Hkv, Sk, D = batch, num_heads_kv, seqlen_k, v.shape[-1]
    ks, vs = (torch.empty((B, Hkv, Sk, D), dtype=v.dtype, device=v.device) for _ in range(2))
    w = torch.empty(key_weights_shape(B, Sk), dtype=v.dtype, device=v.device)
    grid, args, ce = build_prepass_kv(k, v, ks, vs, w, seqlens_k, seqlen_k=Sk, batch=B, num_heads_kv=Hkv,
                                      k_strides=k_strides, v_strides=v_strides, pdl_trigger=pdl_trigger)
    step = KernelStep(attn_secure_sanitize_kv_kernel, grid, args, 6, ce, PREPASS_WARPS, 1)
    return SecurePrepass(step, vs.shape, w.shape), ks, vs
