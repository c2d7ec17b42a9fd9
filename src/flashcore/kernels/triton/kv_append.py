"""Write new keys and values into a KV cache at each sequence's end (``cache_seqlens``), paged or by row.

One program per (new token, sequence) copies that token's [Hkv, D] rows of K and of V. Tokens past a
packed sequence's length write nothing; nothing outside the appended slots is written."""
from __future__ import annotations

import triton
import triton.language as tl

from ..capabilities import Capabilities


@triton.jit
def kv_append_kernel(
    K, V, KC, VC, CACHE_SEQLENS, PAGE_TABLE, BATCH_IDX, CU_Q,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_kcp, stride_kct, stride_kch,
    stride_vcp, stride_vct, stride_vch,
    stride_pt, seqlen_q, total_q, num_heads_kv, capacity, num_rows,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr, PACKED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
):
    tok = tl.program_id(0)
    b = tl.program_id(1)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    if PACKED:
        # clamped into q (and max_seqlen_q), so unchecked offsets (CUDA-graph replays) never address past it
        q0 = tl.minimum(tl.maximum(tl.load(CU_Q + b), 0), total_q)
        n_new = tl.minimum(tl.maximum(tl.load(CU_Q + b + 1) - q0, 0), tl.minimum(seqlen_q, total_q - q0))
        k_src = K + (q0 + tok).to(tl.int64) * stride_ks
        v_src = V + (q0 + tok).to(tl.int64) * stride_vs
    else:
        n_new = seqlen_q
        k_src = K + b.to(tl.int64) * stride_kb + tok.to(tl.int64) * stride_ks
        v_src = V + b.to(tl.int64) * stride_vb + tok.to(tl.int64) * stride_vs
    pos = tl.load(CACHE_SEQLENS + b) + tok
    # a slot past the capacity (unchecked lengths in a CUDA-graph replay) is never written. The mask is built from
    # tensors only: triton 3.9's interpreter refuses a scalar bool broadcast into a mask.
    heads = offs_h[:, None]
    at = pos + 0 * heads
    mask = (tok + 0 * heads < n_new) & (at >= 0) & (at < capacity) & (heads < num_heads_kv)
    mask = mask & (offs_d[None, :] < HEAD_DIM)
    slot = tl.minimum(tl.maximum(pos, 0), capacity - 1)  # in range, so the page-table read needs no mask
    if PAGED:
        page = tl.load(PAGE_TABLE + b * stride_pt + slot // PAGE_SIZE)
        page = tl.minimum(tl.maximum(page, 0), num_rows - 1).to(tl.int64)
        kc_row = page * stride_kcp + (slot % PAGE_SIZE).to(tl.int64) * stride_kct
        vc_row = page * stride_vcp + (slot % PAGE_SIZE).to(tl.int64) * stride_vct
    else:
        if HAS_BATCH_IDX:
            r = tl.minimum(tl.maximum(tl.load(BATCH_IDX + b), 0), num_rows - 1).to(tl.int64)
        else:
            r = b.to(tl.int64)
        kc_row = r * stride_kcp + slot.to(tl.int64) * stride_kct
        vc_row = r * stride_vcp + slot.to(tl.int64) * stride_vct
    kt = tl.load(k_src + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    vt = tl.load(v_src + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(KC + kc_row + offs_h[:, None] * stride_kch + offs_d[None, :], kt, mask=mask)
    tl.store(VC + vc_row + offs_h[:, None] * stride_vch + offs_d[None, :], vt, mask=mask)


CAPABILITIES = Capabilities(
    name="triton_kv_append", module=__name__, role="KV-cache append: every CUDA GPU and the CPU interpreter",
    dtypes=("fp16", "bf16", "fp32"), head_dims=tuple(range(8, 257, 8)), archs=None,
    features=("paged", "fp8_cache"), secret=("K", "V"))
