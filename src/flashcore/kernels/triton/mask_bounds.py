"""Each row's first and one-past-last True position and its count of True positions, of a bool matrix ``[B, K]``
(a padding mask): one launch where PyTorch needs eight (an eager decode step of transformers' integration makes
them once per forward pass; each launch is ~10-30 µs of host time, docs/perf-notes.md v61).

One program per row loops over the row in ``BLOCK`` columns. A row without a True position: start = end = 0."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mask_bounds_kernel(PM, OUT, K, stride_b, B, BLOCK: tl.constexpr):
    """PM: uint8 ``[B, K]`` (row stride ``stride_b``, unit column stride); OUT: int32 ``[3, B]``: start, end,
    count."""
    b = tl.program_id(0)
    row = PM + b.to(tl.int64) * stride_b
    first = K
    last = 0
    count = 0
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        m = tl.load(row + offs, mask=offs < K, other=0) != 0
        first = tl.minimum(first, tl.min(tl.where(m, offs, K), axis=0))
        last = tl.maximum(last, tl.max(tl.where(m, offs + 1, 0), axis=0))
        count += tl.sum(m.to(tl.int32), axis=0)
    tl.store(OUT + b, tl.minimum(first, last))
    tl.store(OUT + B + b, last)
    tl.store(OUT + 2 * B + b, count)
