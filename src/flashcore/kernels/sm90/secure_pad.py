"""Secure mode's V padding written inside the sm_90 forward kernel (device code), for the causal self-attention form:
the loader warpgroup replaces the rows of each landed V tile at or past the secret key length before the consumers
see it (``pipeline._pad_v``, ``form.SANITISE``). It replaces the separate V pre-pass
(``kernels/secure/prepass.py``, ``attn_secure_zero_v_padding_kernel``), whose launch, extra read and write of V and
wait cost small causal problems ~12% of their time (perf-notes v34: 1x16x1024x64 causal 19.3 us secure against
15.6 fast; 16.9 with the padding in the kernel).

Why V's padding rows must be rewritten at all, and with what (the pre-pass's reasoning): in the causal
self-attention form a row below the length sees only valid keys, so padding keys meet only padding query rows,
whose outputs are replaced by zeros; but their probabilities times V's padding are still multiplied, and a NaN or
Inf there must not reach an output (0 * NaN = NaN), and zeros would make the tensor cores' time follow the length
(they run faster on zero operands: docs/security.md 5.4). So the rows get a public pattern: a public word per pair
of columns (random signs, mantissas and the two lowest exponent bits over a fixed exponent: magnitudes in
[2^-7, 2^-3)) with public mantissa bits flipped per row (a Weyl sequence over the row, offset by a hash of the K/V
head). The tile is rewritten as 32-bit words, two elements each: a select and two logic operations per word.

Constant time: every row of every tile is read and written; the length enters the select only.

Not used for the non-causal form: its K padding (pairs of perturbed copies of the first key, which the consumers'
unmasked row max needs) sits on the critical path of the next score product, and in the loader it ran the small
problems 1.0-1.2x slower than the pre-pass in its best form (perf-notes v34)."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# the pre-pass's public hash itself (a plain Triton function Gluon calls): the same words in both padding forms
from ..secure.prepass import _hash
from .gluon_compat import reinterpret

GROUP_ROWS: gl.constexpr = gl.constexpr(32)  # rows per load / select / store (a store between two loads: a barrier)
# a [GROUP_ROWS, D / 2] group of 32-bit words: 4 words (16 bytes) per thread, 8 lanes along a 128-byte row, 4 lanes and
# 4 warps along the rows
WORD_LAYOUT: gl.constexpr = gl.constexpr(gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0]))
# a word's public random bits: both signs, the two lowest exponent bits and the mantissas (as int32)
RANDOM_BITS: gl.constexpr = gl.constexpr(0x81FF81FF - (1 << 32))
EXPONENT: gl.constexpr = gl.constexpr(0x3C003C00)  # exponents 120-123: magnitudes in [2^-7, 2^-3)
ROW_BITS: gl.constexpr = gl.constexpr(0x007F007F)  # a row's public mantissa flips


@gluon.jit
def _words(tile):
    """The 32-bit view of a [rows, D] 16-bit tile in shared memory (two elements per word, the same bytes)."""
    R: gl.constexpr = tile.shape[0]
    C: gl.constexpr = tile.shape[1] // 2
    layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=tile.layout.swizzle_byte_width, element_bitwidth=32,
                                                rank=2)
    return reinterpret(tile, gl.int32, [R, C], layout)


@gluon.jit
def column_pattern(salt, HEAD_DIM: gl.constexpr):
    """The public word of each column pair (once per work item), in the groups' column layout."""
    d = gl.arange(0, HEAD_DIM // 2, layout=gl.SliceLayout(0, WORD_LAYOUT))
    h = _hash(d, d * 0 + 0x3A7, salt).to(gl.int32, bitcast=True)
    return (h & RANDOM_BITS) | EXPONENT


@gluon.jit
def pad_v_tile(tile, col, len_k, row0, salt, BLOCK_N: gl.constexpr):
    """Rows at or past ``len_k`` (secret) of V tile ``tile`` ([BLOCK_N, D] 16-bit; its first key ``row0``) become
    the column pattern ``col`` with the row's public mantissa bits flipped."""
    words = _words(tile)
    col = gl.expand_dims(col, 0)
    offset = _hash(salt, salt * 0 + 0x11, salt)
    for g in gl.static_range(BLOCK_N // GROUP_ROWS):
        part = words.slice(g * GROUP_ROWS, GROUP_ROWS, dim=0)
        x = part.load(WORD_LAYOUT)
        rows = row0 + g * GROUP_ROWS + gl.arange(0, GROUP_ROWS, layout=gl.SliceLayout(1, WORD_LAYOUT))
        flips = (rows.to(gl.uint32) * 0x9E3779B1 + offset).to(gl.int32, bitcast=True) & ROW_BITS
        part.store(gl.where(gl.expand_dims(rows < len_k, 1), x, col ^ gl.expand_dims(flips, 1)))
