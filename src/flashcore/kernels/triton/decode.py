"""KV-cache attention (decode, speculative tokens, chunked prefill): the split-KV kernel, in Triton.

One program serves one (sequence, K/V head, query tile, split): the query tile packs every query head of
the K/V head (GQA packing: row ``r`` is token ``r // GROUP`` of head ``hkv * GROUP + r % GROUP``), so each
K/V tile is read once for the whole group. The keys of a sequence are cut into ``num_splits`` ranges
(flash-decoding); with one split the program writes the output, otherwise it writes a normalised partial
output and its logsumexp to the workspace and ``combine.py`` merges them.

The cache is addressed through a page table (``PAGED``: ``[num_pages, PAGE_SIZE, Hkv, D]``, any page size;
a page per tile when ``PAGE_SIZE >= BLOCK_N``, a page index per key otherwise) or by row
(``[rows, S_cache, Hkv, D]``, row ``BATCH_IDX[b]`` or ``b``). An FP8 (e4m3) cache is widened to q's dtype
tile by tile; its per-(sequence, K/V head) descales fold into the score scale and the output.

Key ``j`` of sequence ``b`` is visible to query token ``i`` (of ``n_b``) when ``LEFTPAD[b] <= j < L_b`` and,
causal, ``j <= L_b - n_b + i`` (bottom-right), with ``L_b = CACHE_SEQLENS[b]`` (+ ``n_b`` when the new tokens
were appended).

* fast path: each split covers its share of the *true* range, and loops over it only; with ``FULL_TILES`` the
  tiles that every row sees whole run in a loop without masks, the rest in a masked loop.
* ``SECURE``: the lengths are secret. Each split covers a fixed share of the public capacity (the page
  table's width times the page size) and loops over all of it; visibility enters only selects, page
  indices are clamped to real pages by arithmetic, and V is zeroed by a select where a key is not visible
  (so stale cache contents, NaN included, never reach the output).

Scores are kept in base 2 (``qk_scale = scale * log2(e)``).
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from ..capabilities import Capabilities

LOG2E = 1.4426950408889634  # host side: qk_scale = scale * LOG2E
LN2 = tl.constexpr(0.6931471805599453)
FP8_WIDEN_C = tl.constexpr(2.0 ** -8)  # what the interpreter's float16 values carry (_widen_fp8_pairs)


@triton.jit
def _widen_fp8_pairs(u, ASM: tl.constexpr):
    """Two e4m3 values per uint16 (the even head-dim index in the low byte) as two float16 tiles, the even and the
    odd columns. An FP8 tile is read this way because Triton loads an 8-bit MMA operand whose contraction dimension
    is not its contiguous one (V's keys) byte by byte (an ``ld.shared.b8`` per value); 16-bit tiles load with
    ``ldmatrix``, as a bf16 cache's do.

    ``ASM`` (a GPU): the hardware convert (``cvt.rn.f16x2.e4m3x2``, exact), two values per instruction, after one
    byte permute that parts the even from the odd values of the two pairs a register holds (each convert then makes
    one output register: the two even values, or the two odd ones; v62: one permute per four values, not two after
    the converts). Measured on H200 at B64 16k (docs/perf-notes.md v24): 530 us against 565 for the same bit moves as
    below in 32-bit inline assembly and 720 for Triton's integer operations.
    Without ``ASM`` (Triton's CPU interpreter, which runs no inline assembly) the values x 2**-8 (``FP8_WIDEN_C``)
    by moving bits: exact for every finite value, subnormals included (e4m3's exponent bias 7 is float16's 15
    minus 8)."""
    if ASM:
        return tl.inline_asm_elementwise(
            """{
            .reg .b16 a, b;
            .reg .b32 t;
            prmt.b32 t, $2, 0, 0x3120;
            mov.b32 {a, b}, t;
            cvt.rn.f16x2.e4m3x2 $0, a;
            cvt.rn.f16x2.e4m3x2 $1, b;
            }""", "=r,=r,r", [u], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)
    else:
        lo = ((u & 0x80) << 8) | ((u & 0x7F) << 7)
        hi = (u & 0x8000) | ((u & 0x7F00) >> 1)
        lo = tl.where((u & 0x7F) == 0x7F, 0x7E00, lo)  # e4m3fn's NaN (S.1111.111) a NaN, as the convert makes it
        hi = tl.where((u & 0x7F00) == 0x7F00, 0x7E00, hi)
        return lo.to(tl.float16, bitcast=True), hi.to(tl.float16, bitcast=True)


@triton.jit
def _as_pairs(C, stride_p, stride_t, stride_h):
    """An e4m3 cache as the uint16 pairs :func:`_widen_fp8_pairs` takes: its pointer and its strides in pairs
    (even: ``_checks.check_kvcache``)."""
    return C.to(tl.pointer_type(tl.uint16), bitcast=True), stride_p // 2, stride_t // 2, stride_h // 2


@triton.jit
def _prefetch_table_lines(base, n):
    """Threads 0 .. n-1 each prefetch into L2 the 128-byte line at ``base + 128 * thread``: one request per line, no
    result and no wait. (One request per thread holding a copy of the address, as a tensor of the lines' addresses
    makes it, cost more than the prefetch saved: docs/perf-notes.md v59.)"""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; .reg .u64 a; mov.u32 t, %tid.x; setp.lt.u32 p, t, $2; "
        "mad.wide.u32 a, t, 128, $1; @p prefetch.global.L2 [a]; mov.b32 $0, 0; }",
        "=r,l,r", [base, n], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _load_public_i32(ptr, ASM: tl.constexpr):
    """A load Triton's pipeliner leaves alone (``ASM``, on a GPU): it moves the load (and the address arithmetic
    after it) into an earlier stage as an ordinary register load, instead of copying the value through shared
    memory (cp.async), where the SASS gate cannot tell a public page index from the secret K/V tiles beside it.
    Without ``ASM`` (the CPU interpreter, which runs no inline assembly) a plain load of the same value."""
    if ASM:
        return tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=True,
                                         pack=1)
    else:
        return tl.load(ptr)


@triton.jit
def _key_pointers(C, b, hkv, n0, offs_n, offs_d, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, capacity, stride_p,
                  stride_t, stride_h, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
                  HAS_BATCH_IDX: tl.constexpr, SECURE: tl.constexpr, ASM: tl.constexpr,
                  REG_PAGES: tl.constexpr):
    """Pointers of the [BLOCK_N, BLOCK_D] tile of cache ``C`` at logical positions ``offs_n`` of sequence ``b``
    (the secure loop's form, its machine code pinned)."""
    row = _key_rows(b, n0, offs_n, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, capacity, stride_p, stride_t,
                    PAGE_SIZE, BLOCK_N, PAGED, HAS_BATCH_IDX, ASM, REG_PAGES)
    return C + row[:, None] + hkv * stride_h + offs_d[None, :]


@triton.jit
def _key_offsets(b, hkv, n0, offs_n, offs_d, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, capacity, stride_p,
                 stride_t, stride_h, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
                 HAS_BATCH_IDX: tl.constexpr, ASM: tl.constexpr, REG_PAGES: tl.constexpr):
    """Element offsets of that tile (:func:`_key_pointers`): K and V share them when their strides are equal."""
    row = _key_rows(b, n0, offs_n, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, capacity, stride_p, stride_t,
                    PAGE_SIZE, BLOCK_N, PAGED, HAS_BATCH_IDX, ASM, REG_PAGES)
    return row[:, None] + hkv * stride_h + offs_d[None, :]


@triton.jit
def _key_rows(b, n0, offs_n, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, capacity, stride_p, stride_t,
              PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
              ASM: tl.constexpr, REG_PAGES: tl.constexpr):
    """The element offset of each key's row (``offs_n``, logical positions of sequence ``b``) in its cache."""
    if PAGED:
        if PAGE_SIZE % BLOCK_N == 0:  # the whole tile lies in one page (tiles start at multiples of BLOCK_N)
            if REG_PAGES:  # not through shared memory (_load_public_i32)
                page = _load_public_i32(PAGE_TABLE + b * stride_pt + n0 // PAGE_SIZE, ASM).to(tl.int64)
            else:
                page = tl.load(PAGE_TABLE + b * stride_pt + n0 // PAGE_SIZE).to(tl.int64)
            page = tl.minimum(tl.maximum(page, 0), num_pages - 1)
            row = page * stride_p + (offs_n % PAGE_SIZE).to(tl.int64) * stride_t
        else:
            col = offs_n // PAGE_SIZE
            if REG_PAGES:  # the table's last column past the capacity (a public bound), instead of a mask
                col = tl.minimum(col, capacity // PAGE_SIZE - 1)
                page = _load_public_i32(PAGE_TABLE + b * stride_pt + col, ASM).to(tl.int64)
            else:
                page = tl.load(PAGE_TABLE + b * stride_pt + col, mask=offs_n < capacity, other=0).to(tl.int64)
            page = tl.minimum(tl.maximum(page, 0), num_pages - 1)
            row = page * stride_p + (offs_n % PAGE_SIZE).to(tl.int64) * stride_t
    else:
        if HAS_BATCH_IDX:
            r = tl.minimum(tl.maximum(tl.load(BATCH_IDX + b), 0), num_pages - 1).to(tl.int64)
        else:
            r = b.to(tl.int64)
        row = r * stride_p + offs_n.to(tl.int64) * stride_t
    return row


@triton.jit
def _tile_base(b, n0, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, stride_p, stride_t, PAGE_SIZE: tl.constexpr,
               PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, ASM: tl.constexpr, REG_PAGES: tl.constexpr):
    """The element offset of the first key row of the tile at ``n0`` (a tile inside one page, or a contiguous
    cache): the tile's rows are this plus ``j * stride_t``, a per-key term the same for every tile
    (``k_rows``/``v_rows`` in the secure loop of :func:`decode_split_kernel`)."""
    if PAGED:
        if REG_PAGES:
            page = _load_public_i32(PAGE_TABLE + b * stride_pt + n0 // PAGE_SIZE, ASM).to(tl.int64)
        else:
            page = tl.load(PAGE_TABLE + b * stride_pt + n0 // PAGE_SIZE).to(tl.int64)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1)
        return page * stride_p + tl.cast(n0 % PAGE_SIZE, tl.int64) * stride_t
    else:
        if HAS_BATCH_IDX:
            r = tl.minimum(tl.maximum(tl.load(BATCH_IDX + b), 0), num_pages - 1).to(tl.int64)
        else:
            r = b.to(tl.int64)
        return r * stride_p + tl.cast(n0, tl.int64) * stride_t


@triton.jit
def _v_rows_seen(KEY_POS, CACHE_SEQLENS, LEFTPAD, b, n0, offs_n0, HAS_LEFTPAD: tl.constexpr, PER_KEY: tl.constexpr):
    """Secure mode: which keys of the tile at ``n0`` the sequence's secret range ``[leftpad, length)`` holds, as the
    select that zeroes V's other rows takes it. Computed from loaded tensors only: each key's position read from the
    public table ``KEY_POS`` (``KEY_POS[j] = j``) and the raw lengths read as tensors (no clamp: a length past the
    capacity or a left pad past the length select the same rows as their clamped values do). A select whose every
    input comes from a load Triton moves into the MMA operand's own layout, next to V's load from shared memory
    (``hoistConvertDotOperand`` accepts only loads and constants as the leaves of what it moves); the same select
    on ``offs_n``/``L`` (a range and scalars) leaves V's tile in a blocked layout, to be written back to shared
    memory and read again as the operand, a round trip per tile (docs/perf-notes.md v47).

    ``PER_KEY``: each key's position read from the table every tile (``KEY_POS[n0 + j]``, one word per lane, each
    warp its own words), instead of the tile's positions once and the tile's start per tile (``KEY_POS[n0]``, a word
    that every warp of the program reads, through the L1: a 4-byte ``cp.async`` allocates there). The same bits;
    which one a form takes is ``launch.triton_decode.seen_per_key``'s (docs/perf-notes.md v49)."""
    one = tl.zeros([1], tl.int32)
    if PER_KEY:  # every lane its own key's word, every tile: no word that two warps read
        pos = tl.load(KEY_POS + n0 + offs_n0)
    else:  # the tile's keys' positions once, plus the tile's start read per tile (one word every warp reads)
        pos = tl.load(KEY_POS + offs_n0) + tl.load(KEY_POS + n0 + one)
    seen = pos < tl.load(CACHE_SEQLENS + b + one)
    if HAS_LEFTPAD:
        seen = seen & (pos >= tl.load(LEFTPAD + b + one))
    return seen


@triton.jit
def _from_start(offs_n0, shift, ASM: tl.constexpr):
    """``offs_n0 + shift`` as unsigned 32-bit values: each key's index from the sequence's first visible key, which
    :func:`decode_split_kernel`'s one-compare visibility tests against a row's count. ``ASM`` (a GPU): an ``add.u32``
    that LLVM cannot see through; the same sum in Triton became a 64-bit compare per score (LLVM compared the key's
    sign-extended index, which the address arithmetic has, against a threshold per row: ``ISETP.GE.U32`` and its
    ``.EX``)."""
    if ASM:
        return tl.inline_asm_elementwise("add.u32 $0, $1, $2;", "=r,r,r", [offs_n0, tl.broadcast_to(shift, offs_n0.shape)],
                                         dtype=tl.uint32, is_pure=True, pack=1)
    else:
        return (offs_n0 + shift).to(tl.uint32, bitcast=True)


@triton.jit
def _seen_counts(row_ok, see_to, start, L, CAUSAL: tl.constexpr):
    """Each query row's count of visible keys, ``[start, last]``: a key is visible when ``key - start``, unsigned, is
    below it (:func:`_from_start`). Causal: a real row's last key (``see_to``) is below ``L``, so ``L``'s bound is
    implied. 0 for the rows past the real ones."""
    if CAUSAL:
        return tl.where(row_ok, tl.maximum(see_to - start + 1, 0), 0).to(tl.uint32)
    else:
        return tl.where(row_ok, tl.maximum(L - start, 0), 0).to(tl.uint32)


@triton.jit
def _keep_rows(t, seen, ASM: tl.constexpr):
    """A 16-bit tile's rows where ``seen``, zero (+0.0) elsewhere. ``ASM`` (a GPU): the bits ANDed with 0xFFFF or 0,
    two values per 32-bit instruction; ptxas makes of the same ``tl.where`` on 16-bit values a split of each
    register's halves, a select per half and a permute to pack them again, with the mask converted through shared
    memory (docs/perf-notes.md v48). Without ``ASM`` (the CPU interpreter), or for a tile of other than 16 bits, that
    select."""
    if ASM and t.dtype.primitive_bitwidth == 16:
        keep = tl.where(seen, 0xFFFF, 0).to(tl.uint16)
        u = tl.inline_asm_elementwise("and.b32 $0, $1, $2;", "=r,r,r",
                                      [t.to(tl.uint16, bitcast=True), tl.broadcast_to(keep[:, None], t.shape)],
                                      dtype=tl.uint16, is_pure=True, pack=2)
        return u.to(t.dtype, bitcast=True)
    else:
        return tl.where(seen[:, None], t, tl.zeros_like(t))


@triton.jit
def _attend_tiles(q, q_hi, m_i, l_i, acc, acc_hi, lo, hi, gap, start, L, see_to, row_ok, key_count, seen_count, scale2,
                  KC, VC, b, hkv, offs_d, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, capacity, stride_kp, stride_kt,
                  stride_kh, stride_vp, stride_vt, stride_vh, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, CAUSAL: tl.constexpr,
                  FP8: tl.constexpr, PRECISION: tl.constexpr, MASKED: tl.constexpr, BLOCK_D: tl.constexpr, gap_at,
                  SKIP: tl.constexpr, ASM: tl.constexpr, REG_PAGES: tl.constexpr, SAME_KV: tl.constexpr,
                  ONE_COMPARE: tl.constexpr, step):
    """Online softmax over the key tiles ``lo, lo + step, ... < hi`` (``step``: ``BLOCK_N``, or a round-robin
    split's stride). ``SKIP``: a tile at or past ``gap_at``
    is moved ``gap`` keys on (the masked loop jumps the unmasked tiles). ``MASKED``: visibility (range, causal,
    real rows) enters by select; without it the caller guarantees every key of every tile visible to every row.
    ``ONE_COMPARE`` (``launch.triton_decode.one_compare``): visibility by one unsigned compare per score, as the
    secure FP8 gather's since v53: a key's index from ``start`` (:func:`_from_start`) below its row's ``seen_count``,
    and a key loaded when that index is below ``key_count`` (the keys in ``[start, L)``). Otherwise the key range
    (``start``, ``L``), the real rows (``row_ok``) and, causal, each row's last key (``see_to``) as three selects.
    ``FP8``: ``q``/``q_hi``, ``acc``/``acc_hi`` hold the even and the odd head-dim columns (:func:`_widen_fp8_pairs`).
    ``SAME_KV``: K and V have the same strides, so V's tile is addressed by K's offsets (a page gather's per-key
    address arithmetic once per tile, not twice)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    if FP8:
        KP, stride_kp, stride_kt, stride_kh = _as_pairs(KC, stride_kp, stride_kt, stride_kh)
        VP, stride_vp, stride_vt, stride_vh = _as_pairs(VC, stride_vp, stride_vt, stride_vh)
        offs_dv = tl.arange(0, BLOCK_D // 2)
        d_ok = offs_dv < HEAD_DIM // 2  # (not offs_dv * 2 < HEAD_DIM: a mask the compiler must see per 8 lanes)
    else:
        KP = KC
        VP = VC
        offs_dv = offs_d
        d_ok = offs_d < HEAD_DIM
    for t0 in range(lo, hi, step):
        n0 = t0
        if SKIP:
            n0 = tl.where(t0 >= gap_at, t0 + gap, t0)
        offs_n = n0 + offs_n0
        if MASKED and ONE_COMPARE:
            from_start = _from_start(offs_n0, n0 - start, ASM)
            key_ok = from_start < key_count
        elif MASKED:
            key_ok = (offs_n >= start) & (offs_n < L)
        koff = _key_offsets(b, hkv, n0, offs_n, offs_dv, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, capacity,
                            stride_kp, stride_kt, stride_kh, PAGE_SIZE, BLOCK_N, PAGED, HAS_BATCH_IDX, ASM, REG_PAGES)
        kp = KP + koff
        if MASKED:
            kt = tl.load(kp, mask=key_ok[:, None] & d_ok[None, :], other=0)
        elif BLOCK_D == HEAD_DIM:
            kt = tl.load(kp)
        else:
            kt = tl.load(kp, mask=d_ok[None, :], other=0)
        if FP8:
            k_lo, k_hi = _widen_fp8_pairs(kt, ASM)
            s = tl.dot(q_hi, tl.trans(k_hi), tl.dot(q, tl.trans(k_lo), input_precision=PRECISION),
                       input_precision=PRECISION) * scale2
        else:
            s = tl.dot(q, tl.trans(kt), input_precision=PRECISION) * scale2
        if MASKED and ONE_COMPARE:
            s = tl.where(from_start[None, :] < seen_count[:, None], s, float("-inf"))
        elif MASKED:
            vis = key_ok[None, :] & row_ok[:, None]
            if CAUSAL:
                vis = vis & (offs_n[None, :] <= see_to[:, None])
            s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if MASKED:
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_safe = m_new
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if SAME_KV:
            vp = VP + koff
        else:
            vp = _key_pointers(VP, b, hkv, n0, offs_n, offs_dv, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages,
                               capacity, stride_vp, stride_vt, stride_vh, PAGE_SIZE, BLOCK_N, PAGED, HAS_BATCH_IDX,
                               False, ASM, REG_PAGES)
        if MASKED:
            vt = tl.load(vp, mask=key_ok[:, None] & d_ok[None, :], other=0)
        elif BLOCK_D == HEAD_DIM:
            vt = tl.load(vp)
        else:
            vt = tl.load(vp, mask=d_ok[None, :], other=0)
        if FP8:
            v_lo, v_hi = _widen_fp8_pairs(vt, ASM)
            p16 = p.to(tl.float16)
            acc = acc * alpha[:, None] + tl.dot(p16, v_lo, input_precision=PRECISION)
            acc_hi = acc_hi * alpha[:, None] + tl.dot(p16, v_hi, input_precision=PRECISION)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        m_i = m_new
    return m_i, l_i, acc, acc_hi


@triton.jit
def decode_split_kernel(
    Q, KC, VC, O, LSE, PART_O, PART_LSE,
    CACHE_SEQLENS, PAGE_TABLE, BATCH_IDX, LEFTPAD, CU_Q, K_DESCALE, V_DESCALE, KEY_POS,
    qk_scale,
    stride_qb, stride_qs, stride_qh,
    stride_kp, stride_kt, stride_kh,
    stride_vp, stride_vt, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh, stride_ls,
    stride_pt,
    seqlen_q, total_q, capacity, num_pages, num_heads_kv, num_splits, part_rows,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, PACKED: tl.constexpr,
    APPENDED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, HAS_LEFTPAD: tl.constexpr, CAUSAL: tl.constexpr,
    SECURE: tl.constexpr, FP8: tl.constexpr, Q_PRESCALE: tl.constexpr, SPLIT: tl.constexpr, FULL_TILES: tl.constexpr,
    REG_PAGES: tl.constexpr, ASM: tl.constexpr, SAME_KV: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL_TRIGGER: tl.constexpr = False,
    SEEN_BY_LOAD: tl.constexpr = False,
    HOISTED: tl.constexpr = False,
    WHOLE_TILES: tl.constexpr = False,
    SEEN_PER_KEY: tl.constexpr = False,
    GATHER_KV_OFFSETS: tl.constexpr = False,
    ONE_COMPARE: tl.constexpr = False,
    ROUND_ROBIN: tl.constexpr = False,
    WARM_TABLE: tl.constexpr = False,
):
    if WARM_TABLE and PAGED and ASM and not SECURE:
        # the sequence's page-table row (public, at most a few lines) on its way to the L2 beside the length's load:
        # the split's page indices, whose addresses wait for the length, then find their line there
        # (launch.triton_decode.warm_table)
        _prefetch_table_lines(PAGE_TABLE + (tl.program_id(1) // num_heads_kv).to(tl.int64) * stride_pt,
                              tl.cdiv(tl.cdiv(capacity, PAGE_SIZE), 32))
    if PDL_TRIGGER and SPLIT and ASM:
        # the combine step, a programmatic dependent of this one, may launch now: its programs start and wait
        # (griddepcontrol.wait, which returns once this whole grid has completed) beside these
        # (launch.triton_decode.triggers_combine; safe where the combine is not launched as a dependent)
        gdc_launch_dependents()
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    split = pid_s % num_splits
    m_tile = pid_s // num_splits
    b = pid_bh // num_heads_kv
    hkv = pid_bh % num_heads_kv

    # query rows: token r // GROUP of head hkv * GROUP + r % GROUP
    offs_r = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = offs_r // GROUP
    head = hkv * GROUP + offs_r % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    if PACKED:
        # clamped into q (and max_seqlen_q), so unchecked offsets (CUDA-graph replays) never address past it
        q0 = tl.minimum(tl.maximum(tl.load(CU_Q + b), 0), total_q)
        n_q = tl.minimum(tl.maximum(tl.load(CU_Q + b + 1) - q0, 0), tl.minimum(seqlen_q, total_q - q0))
        tok_abs = (q0 + tok).to(tl.int64)
        q_base = Q + tok_abs[:, None] * stride_qs
    else:
        n_q = seqlen_q
        tok_abs = tok.to(tl.int64)
        q_base = Q + b.to(tl.int64) * stride_qb + tok_abs[:, None] * stride_qs
    row_ok = tok < n_q
    if FP8:  # the even and the odd head-dim columns (_widen_fp8_pairs)
        dq = tl.arange(0, BLOCK_D // 2)
        q_ptr = q_base + head[:, None] * stride_qh + 2 * dq[None, :]
        q = tl.load(q_ptr, mask=row_ok[:, None] & (dq[None, :] < HEAD_DIM // 2), other=0.0)
        q_hi = tl.load(q_ptr + 1, mask=row_ok[:, None] & (dq[None, :] < HEAD_DIM // 2), other=0.0)
        q_hi = (q_hi.to(tl.float32) * Q_PRESCALE).to(tl.float16)
    else:
        q = tl.load(q_base + head[:, None] * stride_qh + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        q_hi = q  # unused

    # clamped to the capacity, so unchecked lengths (CUDA-graph replays) never address past the cache
    L = tl.load(CACHE_SEQLENS + b)
    if APPENDED:
        L = L + n_q
    L = tl.minimum(tl.maximum(L, 0), capacity)
    if HAS_LEFTPAD:
        start = tl.minimum(tl.maximum(tl.load(LEFTPAD + b), 0), L)
    else:
        start = 0
    scale2 = qk_scale
    if FP8:  # float16 products; the powers of two of q's prescale and of the widening are undone here
        q = (q.to(tl.float32) * Q_PRESCALE).to(tl.float16)
        if ASM:  # the hardware convert (_widen_fp8_pairs): e4m3 values as they are
            scale2 = scale2 * (tl.load(K_DESCALE + b * num_heads_kv + hkv) / Q_PRESCALE)
        else:
            scale2 = scale2 * (tl.load(K_DESCALE + b * num_heads_kv + hkv) / (Q_PRESCALE * FP8_WIDEN_C))
    # the last key any row of this tile may see (causal: the tile's last real token)
    last_tok = tl.minimum(((m_tile + 1) * BLOCK_M - 1) // GROUP + 1, n_q) - 1
    if CAUSAL:
        hi = tl.minimum(L, L - n_q + last_tok + 1)
    else:
        hi = L
    if SECURE:
        # public: every split covers a fixed share of the capacity
        chunk = tl.cdiv(tl.cdiv(capacity, BLOCK_N), num_splits) * BLOCK_N
        lo_s = split * chunk
        hi_s = tl.minimum(lo_s + chunk, capacity)
    elif ROUND_ROBIN:  # split s takes the tiles s, s + num_splits, ...: its first tiles' addresses do not wait for
        # the length's load, only the loop's bound does (launch.triton_decode.round_robin)
        lo_s = (start // BLOCK_N) * BLOCK_N + split * BLOCK_N
        hi_s = hi
    else:
        lo = (start // BLOCK_N) * BLOCK_N  # tiles start at multiples of BLOCK_N (one page per tile)
        chunk = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N), num_splits) * BLOCK_N
        lo_s = lo + split * chunk
        hi_s = tl.minimum(lo_s + chunk, hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if FP8:  # the even and the odd head-dim columns (_widen_fp8_pairs), interleaved at the end
        acc = tl.zeros([BLOCK_M, BLOCK_D // 2], dtype=tl.float32)
        acc_hi = tl.zeros([BLOCK_M, BLOCK_D // 2], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        acc_hi = tl.zeros([1, 1], dtype=tl.float32)  # unused
    offs_n0 = tl.arange(0, BLOCK_N)
    see_to = L - n_q + tok  # causal: the last key each row sees
    if not SECURE:  # (ONE_COMPARE: _attend_tiles's visibility) each row's visible keys from start, and [start, L)'s
        key_count = tl.maximum(L - start, 0).to(tl.uint32)
        seen_count = _seen_counts(row_ok, see_to, start, L, CAUSAL)
    if SECURE:  # the form the SASS gate has passed (machine code pinned); HOISTED: v48's arithmetic, same tiles
        if HOISTED:  # each key's row within its tile, and its head and columns: the same for every tile
            if FP8:
                k_rows = offs_n0.to(tl.int64)[:, None] * (stride_kt // 2) + hkv * (stride_kh // 2) + tl.arange(0, BLOCK_D // 2)[None, :]
                v_rows = offs_n0.to(tl.int64)[:, None] * (stride_vt // 2) + hkv * (stride_vh // 2) + tl.arange(0, BLOCK_D // 2)[None, :]
            else:
                k_rows = offs_n0.to(tl.int64)[:, None] * stride_kt + hkv * stride_kh + offs_d[None, :]
                v_rows = offs_n0.to(tl.int64)[:, None] * stride_vt + hkv * stride_vh + offs_d[None, :]
        if GATHER_KV_OFFSETS:  # one compare per score instead of three, and 32-bit (ptxas had widened them to 64)
            seen_count = _seen_counts(row_ok, see_to, start, L, CAUSAL)
        for n0 in range(lo_s, hi_s, BLOCK_N):
            offs_n = n0 + offs_n0
            if HOISTED:  # 32-bit compares of the tile's own key indices against bounds moved by n0
                key_ok = (offs_n0 >= start - n0) & (offs_n0 < L - n0)
            else:
                key_ok = (offs_n >= start) & (offs_n < L)
            load_ok = offs_n < capacity  # public bound; visibility is a select below
            if FP8:  # two e4m3 values per uint16 (_widen_fp8_pairs)
                KP, skp, skt, skh = _as_pairs(KC, stride_kp, stride_kt, stride_kh)
                if HOISTED:
                    koff = _tile_base(b, n0, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, skp, skt, PAGE_SIZE, PAGED,
                                      HAS_BATCH_IDX, ASM, REG_PAGES) + k_rows
                    kp = KP + koff
                elif GATHER_KV_OFFSETS:  # one per-key address computation for K and V (v52)
                    koff = _key_offsets(b, hkv, n0, offs_n, tl.arange(0, BLOCK_D // 2), PAGE_TABLE, stride_pt,
                                        BATCH_IDX, num_pages, capacity, skp, skt, skh, PAGE_SIZE, BLOCK_N, PAGED,
                                        HAS_BATCH_IDX, ASM, REG_PAGES)
                    kp = KP + koff
                else:
                    kp = _key_pointers(KP, b, hkv, n0, offs_n, tl.arange(0, BLOCK_D // 2), PAGE_TABLE, stride_pt,
                                       BATCH_IDX, num_pages, capacity, skp, skt, skh, PAGE_SIZE, BLOCK_N, PAGED,
                                       HAS_BATCH_IDX, SECURE, ASM, REG_PAGES)
                if WHOLE_TILES:
                    kt = tl.load(kp)
                else:
                    kt = tl.load(kp, mask=load_ok[:, None] & (tl.arange(0, BLOCK_D // 2)[None, :] < HEAD_DIM // 2),
                                 other=0)
                k_lo, k_hi = _widen_fp8_pairs_two_permutes(kt, ASM)
                s = tl.dot(q_hi, tl.trans(k_hi), tl.dot(q, tl.trans(k_lo), input_precision=PRECISION),
                           input_precision=PRECISION) * scale2
            else:
                if HOISTED:
                    koff = _tile_base(b, n0, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, stride_kp, stride_kt,
                                      PAGE_SIZE, PAGED, HAS_BATCH_IDX, ASM, REG_PAGES) + k_rows
                    kp = KC + koff
                elif GATHER_KV_OFFSETS:  # one per-key address computation for K and V (v57)
                    koff = _key_offsets(b, hkv, n0, offs_n, offs_d, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages,
                                        capacity, stride_kp, stride_kt, stride_kh, PAGE_SIZE, BLOCK_N, PAGED,
                                        HAS_BATCH_IDX, ASM, REG_PAGES)
                    kp = KC + koff
                else:
                    kp = _key_pointers(KC, b, hkv, n0, offs_n, offs_d, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages,
                                       capacity, stride_kp, stride_kt, stride_kh, PAGE_SIZE, BLOCK_N, PAGED,
                                       HAS_BATCH_IDX, SECURE, ASM, REG_PAGES)
                if WHOLE_TILES:
                    kt = tl.load(kp)
                else:
                    kt = tl.load(kp, mask=load_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
                s = tl.dot(q, tl.trans(kt), input_precision=PRECISION) * scale2
            if GATHER_KV_OFFSETS:  # one unsigned compare per score (v53): key - start below the row's count
                vis = _from_start(offs_n0, n0 - start, ASM)[None, :] < seen_count[:, None]
            else:
                vis = key_ok[None, :] & row_ok[:, None]
                if CAUSAL:
                    if HOISTED:
                        vis = vis & (offs_n0[None, :] <= (see_to - n0)[:, None])
                    else:
                        vis = vis & (offs_n[None, :] <= see_to[:, None])
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if FP8:  # two e4m3 values per uint16 (_widen_fp8_pairs)
                VP, svp, svt, svh = _as_pairs(VC, stride_vp, stride_vt, stride_vh)
                if HOISTED:
                    if SAME_KV:
                        vp = VP + koff
                    else:
                        vp = VP + _tile_base(b, n0, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, svp, svt, PAGE_SIZE,
                                             PAGED, HAS_BATCH_IDX, ASM, REG_PAGES) + v_rows
                elif GATHER_KV_OFFSETS:
                    vp = VP + koff
                else:
                    vp = _key_pointers(VP, b, hkv, n0, offs_n, tl.arange(0, BLOCK_D // 2), PAGE_TABLE, stride_pt,
                                       BATCH_IDX, num_pages, capacity, svp, svt, svh, PAGE_SIZE, BLOCK_N, PAGED,
                                       HAS_BATCH_IDX, SECURE, ASM, REG_PAGES)
                if WHOLE_TILES:
                    vt = tl.load(vp)
                else:
                    vt = tl.load(vp, mask=load_ok[:, None] & (tl.arange(0, BLOCK_D // 2)[None, :] < HEAD_DIM // 2),
                                 other=0)
                # zeroed by visibility before the widening (stale slots may hold NaN); this select keeps the tile out
                # of the MMA's register layout (a shared-memory round trip per tile), but zeroing NaNs by value and
                # counting the visible ones in a second product ran slower still (docs/perf-notes.md v24.4)
                if SEEN_BY_LOAD:
                    seen_v = _v_rows_seen(KEY_POS, CACHE_SEQLENS, LEFTPAD, b, n0, offs_n0, HAS_LEFTPAD, SEEN_PER_KEY)
                if SEEN_BY_LOAD and (HOISTED or GATHER_KV_OFFSETS):
                    vt = _keep_rows(vt, seen_v, ASM)
                elif SEEN_BY_LOAD:
                    vt = tl.where(seen_v[:, None], vt, 0)
                else:
                    vt = tl.where(key_ok[:, None], vt, 0)
                v_lo, v_hi = _widen_fp8_pairs_two_permutes(vt, ASM)
                p16 = p.to(tl.float16)
                acc = acc * alpha[:, None] + tl.dot(p16, v_lo, input_precision=PRECISION)
                acc_hi = acc_hi * alpha[:, None] + tl.dot(p16, v_hi, input_precision=PRECISION)
            else:
                if HOISTED:
                    if SAME_KV:
                        vp = VC + koff
                    else:
                        vp = VC + _tile_base(b, n0, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, stride_vp, stride_vt,
                                             PAGE_SIZE, PAGED, HAS_BATCH_IDX, ASM, REG_PAGES) + v_rows
                elif GATHER_KV_OFFSETS:
                    vp = VC + koff
                else:
                    vp = _key_pointers(VC, b, hkv, n0, offs_n, offs_d, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages,
                                       capacity, stride_vp, stride_vt, stride_vh, PAGE_SIZE, BLOCK_N, PAGED,
                                       HAS_BATCH_IDX, SECURE, ASM, REG_PAGES)
                if WHOLE_TILES:
                    vt = tl.load(vp)
                else:
                    vt = tl.load(vp, mask=load_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
                if SEEN_BY_LOAD:
                    seen_v = _v_rows_seen(KEY_POS, CACHE_SEQLENS, LEFTPAD, b, n0, offs_n0, HAS_LEFTPAD, SEEN_PER_KEY)
                if SEEN_BY_LOAD and (HOISTED or GATHER_KV_OFFSETS):
                    vt = _keep_rows(vt, seen_v, ASM)
                elif SEEN_BY_LOAD:
                    vt = tl.where(seen_v[:, None], vt, 0.0)
                else:
                    vt = tl.where(key_ok[:, None], vt, 0.0)
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
            m_i = m_new
    elif not FULL_TILES:  # one masked loop
        m_i, l_i, acc, acc_hi = _attend_tiles(
            q, q_hi, m_i, l_i, acc, acc_hi, lo_s, hi_s, 0, start, L, see_to, row_ok, key_count, seen_count, scale2, KC,
            VC, b, hkv, offs_d, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, capacity, stride_kp, stride_kt, stride_kh,
            stride_vp, stride_vt, stride_vh, HEAD_DIM, BLOCK_N, PAGE_SIZE, PAGED, HAS_BATCH_IDX, CAUSAL, FP8, PRECISION,
            True, BLOCK_D, 0, False, ASM, REG_PAGES, SAME_KV, ONE_COMPARE,
            num_splits * BLOCK_N if ROUND_ROBIN else BLOCK_N)
    else:
        # Tiles every row of this query tile sees whole (inside [start, L) and, causal, at or below the first
        # row's last key) need no mask: a loop of their own, then the masked rest (the leading tile of a left
        # pad, the diagonal band, the tail at L). A chunked-prefill tile otherwise masks every one of its tiles.
        first_tok = tl.minimum((m_tile * BLOCK_M) // GROUP, tl.maximum(n_q - 1, 0))
        full_to = L
        if CAUSAL:
            full_to = tl.minimum(L, L - n_q + first_tok + 1)
        u_lo = tl.minimum(tl.maximum(lo_s, tl.cdiv(start, BLOCK_N) * BLOCK_N), hi_s)
        u_hi = tl.maximum(tl.minimum(hi_s, lo_s + ((full_to - lo_s) // BLOCK_N) * BLOCK_N), u_lo)
        if n_q == 0:
            u_hi = u_lo
        m_i, l_i, acc, acc_hi = _attend_tiles(
            q, q_hi, m_i, l_i, acc, acc_hi, u_lo, u_hi, 0, start, L, see_to, row_ok, key_count, seen_count, scale2, KC,
            VC, b, hkv, offs_d, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, capacity, stride_kp, stride_kt, stride_kh,
            stride_vp, stride_vt, stride_vh, HEAD_DIM, BLOCK_N, PAGE_SIZE, PAGED, HAS_BATCH_IDX, CAUSAL, FP8, PRECISION,
            False, BLOCK_D, 0, False, ASM, REG_PAGES, SAME_KV, ONE_COMPARE, BLOCK_N)
        # the masked tiles: those before u_lo, then those from u_hi on (one loop; the index jumps the gap)
        m_i, l_i, acc, acc_hi = _attend_tiles(
            q, q_hi, m_i, l_i, acc, acc_hi, lo_s, hi_s - (u_hi - u_lo), u_hi - u_lo, start, L, see_to, row_ok, key_count,
            seen_count, scale2, KC, VC, b, hkv, offs_d, PAGE_TABLE, stride_pt, BATCH_IDX, num_pages, capacity, stride_kp,
            stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, HEAD_DIM, BLOCK_N, PAGE_SIZE, PAGED, HAS_BATCH_IDX,
            CAUSAL, FP8, PRECISION, True, BLOCK_D, u_lo, True, ASM, REG_PAGES, SAME_KV, ONE_COMPARE, BLOCK_N)

    if FP8:
        acc = tl.reshape(tl.join(acc, acc_hi), [BLOCK_M, BLOCK_D])  # columns 2j and 2j + 1 side by side
        if ASM:
            acc = acc * tl.load(V_DESCALE + b * num_heads_kv + hkv)
        else:
            acc = acc * (tl.load(V_DESCALE + b * num_heads_kv + hkv) / FP8_WIDEN_C)
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    o = acc / l_safe[:, None]
    o = tl.where(seen[:, None], o, 0.0)
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))
    if SPLIT:
        # workspace [num_splits, B * Hkv, part_rows, BLOCK_D] (part_rows: the query tiles' rows)
        rows = (split * tl.num_programs(1) + pid_bh).to(tl.int64) * part_rows + offs_r
        tl.store(PART_O + rows[:, None] * BLOCK_D + offs_d[None, :], o)
        tl.store(PART_LSE + rows, lse)
    else:
        if PACKED:
            o_base = O + tok_abs[:, None] * stride_os
        else:
            o_base = O + b.to(tl.int64) * stride_ob + tok_abs[:, None] * stride_os
        tl.store(o_base + head[:, None] * stride_oh + offs_d[None, :], o.to(O.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
        if RETURN_LSE:
            tl.store(LSE + b.to(tl.int64) * stride_lb + head * stride_lh + tok_abs * stride_ls, lse, mask=row_ok)


CAPABILITIES = Capabilities(
    name="triton_decode", module=__name__,
    role="KV-cache attention, split-KV: every CUDA GPU and the CPU interpreter",
    dtypes=("fp16", "bf16", "fp32"), head_dims=tuple(range(8, 257, 8)), archs=None,
    features=("causal", "gqa", "paged", "fp8_cache", "secure", "lse", "split_kv", "any_strides"),
    secret=("Q", "KC", "VC"), secret_secure=("CACHE_SEQLENS", "LEFTPAD"))


# Below every kernel's code, so that adding it moved no line of theirs (each cubin carries its line table: the fast
# forms' machine code and gate-1 analyses stay as they were).
@triton.jit
def _widen_fp8_pairs_two_permutes(u, ASM: tl.constexpr):
    """:func:`_widen_fp8_pairs` as before v62 (two converts, then two byte permutes that part the even from the odd
    values; the same values in the same registers), for the secure FP8 loops. v62's one permute before the converts
    made the secure FP8 page gather with splits fail gate 2 on the SMs' L2 read sectors (``inf_pad`` about +350 of
    267,000, p = 3e-6, B1 4k page 16, 2026-12-01; docs/security.md §5.26), which this form had passed (§5.20):
    the effect the FP8 split forms showed at other stage counts (§5.15-§5.16), so the secure loops keep the
    instruction stream the gate passed."""
    if ASM:
        return tl.inline_asm_elementwise(
            """{
            .reg .b16 a, b;
            .reg .b32 r, q;
            mov.b32 {a, b}, $2;
            cvt.rn.f16x2.e4m3x2 r, a;
            cvt.rn.f16x2.e4m3x2 q, b;
            prmt.b32 $0, r, q, 0x5410;
            prmt.b32 $1, r, q, 0x7632;
            }""", "=r,=r,r", [u], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)
    else:
        return _widen_fp8_pairs(u, ASM)
