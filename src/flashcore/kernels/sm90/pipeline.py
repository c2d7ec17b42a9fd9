"""The loader side of the sm_90 forward kernel's pipeline: TMA copies of Q and of the K/V tiles into
shared-memory rings, each slot guarded by a ready/empty mbarrier pair. Device code only.

A paged KV cache (``PAGE_SIZE`` > 0, with per-sequence key lengths: ``plan.prefill``; in secure mode too, at secure
mode's page sizes) is read through the page table: K/V descriptors over ``[num_pages, Hkv, page_size, D]`` whose box is one page (at most one key
tile), one copy per page of a key tile, each into its rows of the tile's slot (``_copy_key_tile``)."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
)

from .clear_rows import _zero_rows_past
from .gluon_compat import async_load, thread_barrier
from .secure_pad import column_pattern, pad_v_tile
from .tile_scheduler import _head_coords, _kv_blocks, _tile_coords
from .trace import _stamp


@gluon.jit
def _loader(shared, form, WG: gl.constexpr):
    """The loader partition (one warp; a warpgroup in secure mode with key lengths, which also clears V's rows past
    the key length: _sanitise_v, and with SANITISE, which writes secure mode's V padding: _pad_v): Q and the K/V
    tiles of this program's work items, through the rings."""
    BLOCK_M: gl.constexpr = form.BLOCK_M
    BLOCK_N: gl.constexpr = form.BLOCK_N
    K_STAGES: gl.constexpr = form.K_STAGES
    V_STAGES: gl.constexpr = form.V_STAGES
    CAUSAL: gl.constexpr = form.CAUSAL
    NUM_WG: gl.constexpr = form.NUM_WG
    PAIRED: gl.constexpr = form.PAIRED
    SUM_MMA: gl.constexpr = form.SUM_MMA
    TRACE: gl.constexpr = form.TRACE
    EARLY_LOADS: gl.constexpr = form.EARLY_LOADS
    KEY_LENS: gl.constexpr = form.KEY_LENS
    PAGE_SIZE: gl.constexpr = form.PAGE_SIZE
    SECURE: gl.constexpr = form.SECURE
    q_desc = shared.q_desc
    k_desc = shared.k_desc
    v_desc = shared.v_desc
    w_desc = shared.w_desc
    q_smem = shared.q_smem
    k_smem = shared.k_smem
    v_smem = shared.v_smem
    w_smem = shared.w_smem
    q_ready = shared.q_ready
    q_empty = shared.q_empty
    k_ready = shared.k_ready
    v_ready = shared.v_ready
    k_empty = shared.k_empty
    v_empty = shared.v_empty
    seqlens_q_ptr = shared.seqlens_q_ptr
    seqlen_q = shared.seqlen_q
    seqlen_k = shared.seqlen_k
    num_heads = shared.num_heads
    group = shared.group
    num_m_tiles = shared.num_m_tiles
    num_tiles = shared.num_tiles
    kc = 0  # K/V tiles loaded so far, over all work items: ring slot and phase
    it = 0  # work items so far: Q slot and phase
    _stamp(seqlens_q_ptr, 4, TRACE, WG, NUM_WG)
    for unit in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        for half in gl.static_range(2 if PAIRED else 1):
            pid_m, bh, valid = _tile_coords(unit, half, num_m_tiles, CAUSAL, PAIRED)
            if valid:
                n = _load_item(pid_m, bh, kc, it, q_desc, k_desc, v_desc, w_desc, q_smem, k_smem, v_smem, w_smem,
                               q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, seqlen_q, seqlen_k, num_heads,
                               group, BLOCK_M, BLOCK_N, K_STAGES, V_STAGES, CAUSAL, NUM_WG, SUM_MMA,
                               EARLY_LOADS, seqlens_q_ptr, TRACE, KEY_LENS, shared.page_table, shared.table_stride,
                               PAGE_SIZE, SECURE, shared.v_landed, form.HEAD_DIM, form.SANITISE,
                               shared.seqlens_k_ptr, form.PDL_WAIT, form.V_PREPASS)
                kc += n
                it += 1


@gluon.jit
def _wait_for_prior_grid():
    """``griddepcontrol.wait``: returns once the grid this one is a programmatic dependent of has completed and its
    memory operations are visible (at once where the launch was not programmatic)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], gl.int32, False, 1)


@gluon.jit
def _issue_q(q_desc, q_smem, q_ready, qs, b, h, m0, BLOCK_M: gl.constexpr, NUM_WG: gl.constexpr):
    """One work item's Q tiles (one per consumer warpgroup) into Q slot ``qs``."""
    mbarrier.expect(q_ready.index(qs), NUM_WG * q_desc.block_type.nbytes)
    for w in gl.static_range(NUM_WG):
        async_load(q_desc, [b, h, m0 + w * BLOCK_M, 0], q_ready.index(qs), q_smem.index(NUM_WG * qs + w))


@gluon.jit
def _page_offsets(PER_TILE: gl.constexpr):
    """0 .. PER_TILE - 1, held whole by every thread of the calling warps (the loader warp, or the default warps
    that issue the first loads), so that picking one out is in-thread."""
    return gl.arange(0, PER_TILE, layout=gl.BlockedLayout([PER_TILE], [32], [gl.num_warps()], [0]))


@gluon.jit
def _tile_pages(page_table, table_stride, b, j, capacity, BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Paged: the physical pages of key tile ``j`` of sequence ``b``, read from its row of the page table (rows
    ``table_stride`` apart, ``capacity // PAGE_SIZE`` columns): a page of at least a tile, its one index; smaller
    pages, ``[BLOCK_N // PAGE_SIZE]`` indices held whole by every lane. Columns past the table's last read the
    last: a tile past it (the capacity not a multiple of the tile; or the prefetch past an item's last tile)
    holds only keys past every length, which the consumers mask (K) and clear (V)."""
    row = page_table + b * table_stride
    last = capacity // PAGE_SIZE - 1
    if PAGE_SIZE >= BLOCK_N:
        return gl.load(row + gl.minimum((j * BLOCK_N) // PAGE_SIZE, last))
    else:
        PER_TILE: gl.constexpr = BLOCK_N // PAGE_SIZE
        return gl.load(row + gl.minimum(j * PER_TILE + _page_offsets(PER_TILE), last))


@gluon.jit
def _copy_key_tile(desc, slot, bar, b, hk, j, tile_pages, BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Key tile ``j`` (BLOCK_N rows of K/V head ``hk`` of sequence ``b``) into ``slot``, signalling ``bar``.

    Paged (``PAGE_SIZE`` > 0; ``tile_pages``: the tile's pages, from _tile_pages): a page of at least a tile is one
    copy from inside the page; smaller pages are one copy each, into their rows of the slot (a row slice of the
    swizzled tile: whole 8-row swizzle atoms, as the page sizes served are multiples of 8)."""
    if PAGE_SIZE == 0:
        async_load(desc, [b, hk, j * BLOCK_N, 0], bar, slot)
    elif PAGE_SIZE >= BLOCK_N:
        async_load(desc, [tile_pages, hk, (j * BLOCK_N) % PAGE_SIZE, 0], bar, slot)
    else:
        PER_TILE: gl.constexpr = BLOCK_N // PAGE_SIZE
        offs = _page_offsets(PER_TILE)
        for i in gl.static_range(PER_TILE):
            page = gl.sum(gl.where(offs == i, tile_pages, 0), axis=0)  # (in-lane: every lane holds all of them)
            async_load(desc, [page, hk, 0, 0], bar, slot.slice(i * PAGE_SIZE, PAGE_SIZE, dim=2))


@gluon.jit
def _issue_k(k_desc, k_smem, k_ready, ks, b, hk, j, pages, BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr):
    # a tile's bytes: the descriptor's box is the whole tile, or (paged) one page of it
    mbarrier.expect(k_ready.index(ks), k_desc.block_type.nbytes * (BLOCK_N // k_desc.block_type.shape[2]))
    _copy_key_tile(k_desc, k_smem.index(ks), k_ready.index(ks), b, hk, j, pages, BLOCK_N, PAGE_SIZE)


@gluon.jit
def _issue_v(v_desc, w_desc, v_smem, w_smem, v_ready, vs, b, hk, j, pages, BLOCK_N: gl.constexpr,
             SUM_MMA: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """V tile ``j`` (with SUM_MMA also its key weights) into V slot ``vs``."""
    if SUM_MMA:
        mbarrier.expect(v_ready.index(vs), v_desc.block_type.nbytes + w_desc.block_type.nbytes)
        async_load(w_desc, [b, 0, j * BLOCK_N], v_ready.index(vs), w_smem.index(vs))
    else:  # a tile's bytes: the descriptor's box is the whole tile, or (paged) one page of it
        mbarrier.expect(v_ready.index(vs), v_desc.block_type.nbytes * (BLOCK_N // v_desc.block_type.shape[2]))
    _copy_key_tile(v_desc, v_smem.index(vs), v_ready.index(vs), b, hk, j, pages, BLOCK_N, PAGE_SIZE)




@gluon.jit
def _load_q(q_desc, q_smem, q_ready, q_empty, it, b, h, m0, BLOCK_M: gl.constexpr, NUM_WG: gl.constexpr):
    """Item ``it``'s Q, once its slot is free. Q is double-buffered: the next item's Q arrives while the
    consumers finish this one."""
    qs = it % 2
    mbarrier.wait(q_empty.index(qs), ((it // 2) & 1) ^ 1)
    _issue_q(q_desc, q_smem, q_ready, qs, b, h, m0, BLOCK_M, NUM_WG)


@gluon.jit
def _load_k(k_desc, k_smem, k_ready, k_empty, c, b, hk, j, pages, BLOCK_N: gl.constexpr, K_STAGES: gl.constexpr,
            PAGE_SIZE: gl.constexpr):
    """The program's ``c``-th K tile (tile ``j`` of its item), once its ring slot is free."""
    ks = c % K_STAGES
    mbarrier.wait(k_empty.index(ks), ((c // K_STAGES) & 1) ^ 1)
    _issue_k(k_desc, k_smem, k_ready, ks, b, hk, j, pages, BLOCK_N, PAGE_SIZE)


@gluon.jit
def _load_v(v_desc, w_desc, v_smem, w_smem, v_ready, v_empty, c, b, hk, j, pages, BLOCK_N: gl.constexpr,
            V_STAGES: gl.constexpr, SUM_MMA: gl.constexpr, PAGE_SIZE: gl.constexpr):
    vs = c % V_STAGES
    mbarrier.wait(v_empty.index(vs), ((c // V_STAGES) & 1) ^ 1)
    _issue_v(v_desc, w_desc, v_smem, w_smem, v_ready, vs, b, hk, j, pages, BLOCK_N, SUM_MMA, PAGE_SIZE)


@gluon.jit
def _sanitise_v(v_smem, v_landed, v_ready, c, valid_rows, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                V_STAGES: gl.constexpr):
    """Secure mode with key lengths: the program's ``c``-th V tile, once landed (``v_landed``), with its rows at or
    past ``valid_rows`` (secret) zeroed, then handed to the consumers (``v_ready``). Every tile, every row read and
    written (a select): the work and the addresses follow the public shape only. The consumers mask those keys'
    scores (K needs nothing: a masked score is a select), but their probabilities of 0 times a NaN or Inf that a
    stale cache slot may hold would still reach P V."""
    vs = c % V_STAGES
    mbarrier.wait(v_landed.index(vs), (c // V_STAGES) & 1)
    _zero_rows_past(v_smem.index(vs).reshape([BLOCK_N, HEAD_DIM]), valid_rows, 16, 0, 1, BLOCK_N)
    fence_async_shared()  # these generic-proxy writes, before the consumers' wgmma (async proxy) reads them
    thread_barrier()  # every warp of this warpgroup has written its rows
    mbarrier.arrive(v_ready.index(vs), count=1)


@gluon.jit
def _pad_v(v_smem, v_landed, v_ready, c, j, col, len_k, salt, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
           V_STAGES: gl.constexpr):
    """SANITISE (secure, causal self-attention): the program's ``c``-th V tile (tile ``j`` of its item), once landed,
    with secure mode's padding written over its rows at or past the secret key length ``len_k``
    (kernels/sm90/secure_pad.py), then handed to the consumers. Every tile, every row read and written (selects)."""
    vs = c % V_STAGES
    mbarrier.wait(v_landed.index(vs), (c // V_STAGES) & 1)
    pad_v_tile(v_smem.index(vs).reshape([BLOCK_N, HEAD_DIM]), col, len_k, j * BLOCK_N, salt, BLOCK_N)
    fence_async_shared()  # these generic-proxy writes, before the consumers' wgmma (async proxy) reads them
    thread_barrier()  # every warp of this warpgroup has written its rows
    mbarrier.arrive(v_ready.index(vs), count=1)


@gluon.jit
def _issue_first_loads(q_desc, k_desc, v_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, k_ready, v_ready,
                       num_heads, group, num_m_tiles, page_table, table_stride, capacity, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, NUM_WG: gl.constexpr, CAUSAL: gl.constexpr, PAIRED: gl.constexpr,
                       SUM_MMA: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """EARLY_LOADS: the program's first work item's Q, K_0 and V_0, requested at kernel entry by the
    default warps instead of by the loader once the partitions have started (~1.1 us later: perf-notes
    v16). The first item is unit program_id's half 0, which always exists and has >= 1 key tile; the
    loader skips exactly these loads (Q of item 0, K/V tile 0 of the program)."""
    pid_m, bh, valid = _tile_coords(gl.program_id(0), 0, num_m_tiles, CAUSAL, PAIRED)
    b, h, hk = _head_coords(bh, num_heads, group)
    fence_async_shared()  # the barriers' initialisation, before the copy engine signals them
    _issue_q(q_desc, q_smem, q_ready, 0, b, h, pid_m * NUM_WG * BLOCK_M, BLOCK_M, NUM_WG)
    pages = None
    if PAGE_SIZE > 0:
        pages = _tile_pages(page_table, table_stride, b, 0, capacity, BLOCK_N, PAGE_SIZE)
    _issue_k(k_desc, k_smem, k_ready, 0, b, hk, 0, pages, BLOCK_N, PAGE_SIZE)
    _issue_v(v_desc, w_desc, v_smem, w_smem, v_ready, 0, b, hk, 0, pages, BLOCK_N, SUM_MMA, PAGE_SIZE)


@gluon.jit
def _load_item(pid_m, bh, kc, it, q_desc, k_desc, v_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
               k_ready, v_ready, k_empty, v_empty, seqlen_q, seqlen_k, num_heads, group, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
               NUM_WG: gl.constexpr, SUM_MMA: gl.constexpr, EARLY_LOADS: gl.constexpr, trace_ptr,
               TRACE: gl.constexpr, KEY_LENS: gl.constexpr, page_table, table_stride, PAGE_SIZE: gl.constexpr,
               SECURE: gl.constexpr, v_landed, HEAD_DIM: gl.constexpr, SANITISE: gl.constexpr, seqlens_k_ptr,
               PDL_WAIT: gl.constexpr, V_PREPASS: gl.constexpr = False):
    """The loader's side of one work item: its Q tiles, then its K/V tiles through the rings (with
    SUM_MMA each V tile brings its key weights along). Returns the number of K/V tiles loaded. With
    EARLY_LOADS the program's first Q and K/V tile 0 were requested at kernel entry (_issue_first_loads). With
    KEY_LENS ``trace_ptr`` holds the key lengths, and the item's tiles stop at its sequence's (as the consumers').
    Paged (PAGE_SIZE > 0, with KEY_LENS): the tiles' pages come from the sequence's row of ``page_table``.
    SECURE with KEY_LENS: the lengths are secret; the item's tiles are those of the whole cache (public), each V tile
    landing on ``v_landed`` and cleared here past the key length before the consumers see it: tile j - 1 between the
    copies of K_j and V_j (perf-notes v31: cleared after V_j's copy, each clear waited for the consumers' P V of
    tile j - 2, which freed V_j's slot, and the consumers then waited for the clear: 25% of the time at D=128).
    SANITISE (secure, causal self-attention: ``seqlens_k_ptr`` holds the secret key lengths): each V tile lands on
    ``v_landed`` and gets secure mode's padding here (_pad_v), one tile behind the copies in the same way (perf-notes
    v34: padding the previous tile before this one's K copy instead ran 6-11% slower). V_PREPASS (SECURE with
    KEY_LENS): V is the V pre-pass's clean copy ``[B, Hkv, capacity, D]`` (also where K is a paged cache: its V tiles
    are then whole-tile copies from that copy); the loader copies the whole cache's tiles and reads no length."""
    SECRET_KEY_LENS: gl.constexpr = SECURE and KEY_LENS
    b, h, hk = _head_coords(bh, num_heads, group)
    if PAGE_SIZE > 0:  # tile 0's pages; each step then reads the next tile's before it waits for a free slot
        capacity = seqlen_k
        next_pages = _tile_pages(page_table, table_stride, b, 0, capacity, BLOCK_N, PAGE_SIZE)
    v_bar = v_ready
    if SECRET_KEY_LENS:
        # (V_PREPASS: V comes clean from the V pre-pass, and the loader reads no length: the whole cache's tiles)
        if not V_PREPASS:  # secret: clamped into the cache arithmetically, and used by the selects only
            len_k = gl.minimum(gl.maximum(gl.load(trace_ptr + b), 0), seqlen_k)
            v_bar = v_landed
    elif SANITISE:  # secret, as above; the pattern's public salt is the sequence's K/V head
        len_k = gl.minimum(gl.maximum(gl.load(seqlens_k_ptr + b), 0), seqlen_k)
        salt = b * (num_heads // group) + hk
        col = column_pattern(salt, HEAD_DIM)
        v_bar = v_landed
    elif KEY_LENS:
        seqlen_k = gl.minimum(gl.maximum(gl.load(trace_ptr + b), 0), seqlen_k)
    m0 = pid_m * NUM_WG * BLOCK_M
    if EARLY_LOADS:  # (constexpr branches: without EARLY_LOADS the code is the form the secure gate passed)
        if it > 0:
            _load_q(q_desc, q_smem, q_ready, q_empty, it, b, h, m0, BLOCK_M, NUM_WG)
    else:
        _load_q(q_desc, q_smem, q_ready, q_empty, it, b, h, m0, BLOCK_M, NUM_WG)
        if it == 0:
            _stamp(trace_ptr, 5, TRACE, 0, NUM_WG)
            if PDL_WAIT:  # K and V (and the key weights) are the pre-pass's output: its grid must have completed
                _wait_for_prior_grid()

    n_blocks = _kv_blocks(pid_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL, NUM_WG)
    for j in range(n_blocks):
        # K and V have separate rings: K_j is free once both S_j = Q K_j^T are done (early in step
        # j), V_j only after both P_j V_j (step j+1), so K can run further ahead.
        c = kc + j
        pages = None
        if PAGE_SIZE > 0:
            pages = next_pages
        if EARLY_LOADS:
            if c > 0:
                _load_k(k_desc, k_smem, k_ready, k_empty, c, b, hk, j, pages, BLOCK_N, K_STAGES, PAGE_SIZE)
        else:
            _load_k(k_desc, k_smem, k_ready, k_empty, c, b, hk, j, pages, BLOCK_N, K_STAGES, PAGE_SIZE)
        if NUM_WG == 1 and not SANITISE:  # (SANITISE: the form as measured in perf-notes v34, without this wait)
            if c == 0:
                # the program's first tiles: with two programs per SM, letting Q and K_0 land before the rest of
                # the rings are requested starts the first S earlier (perf-notes v15.3: +1-2% at 1-2 x 16 x 1024 x 64)
                mbarrier.wait(k_ready.index(0), 0)
        if SANITISE:  # the previous V tile, between this one's K and V copies (as _sanitise_v below)
            if j > 0:
                _pad_v(v_smem, v_landed, v_ready, c - 1, j - 1, col, len_k, salt, BLOCK_N, HEAD_DIM, V_STAGES)
        if SECRET_KEY_LENS and not V_PREPASS:
            # the previous V tile, before this one's copy: that copy waits for a slot that the consumers free only
            # after their P V of the tile before, and they need the previous tile cleared for their next P V
            if j > 0:
                _sanitise_v(v_smem, v_landed, v_ready, c - 1, len_k - (j - 1) * BLOCK_N, BLOCK_N, HEAD_DIM, V_STAGES)
        if EARLY_LOADS:
            if c > 0:
                _load_v(v_desc, w_desc, v_smem, w_smem, v_bar, v_empty, c, b, hk, j, pages, BLOCK_N, V_STAGES,
                        SUM_MMA, PAGE_SIZE)
        elif V_PREPASS:  # V: the pre-pass's contiguous copy, also where K is a paged cache
            _load_v(v_desc, w_desc, v_smem, w_smem, v_bar, v_empty, c, b, hk, j, pages, BLOCK_N, V_STAGES, SUM_MMA, 0)
        else:
            _load_v(v_desc, w_desc, v_smem, w_smem, v_bar, v_empty, c, b, hk, j, pages, BLOCK_N, V_STAGES, SUM_MMA,
                    PAGE_SIZE)
        if PAGE_SIZE > 0:
            # the next tile's pages, read while this warp waits for its next free slot instead of after it (a
            # dependent table read per tile cost ~20%, perf-notes v30); after this tile's copies, so that the two
            # tiles' page indices are never live at once (the loader has 24 registers)
            next_pages = _tile_pages(page_table, table_stride, b, j + 1, capacity, BLOCK_N, PAGE_SIZE)
    if SECRET_KEY_LENS and not V_PREPASS:  # the item's last V tile
        _sanitise_v(v_smem, v_landed, v_ready, kc + n_blocks - 1, len_k - (n_blocks - 1) * BLOCK_N, BLOCK_N, HEAD_DIM,
                    V_STAGES)
    if SANITISE:  # the item's last V tile
        _pad_v(v_smem, v_landed, v_ready, kc + n_blocks - 1, n_blocks - 1, col, len_k, salt, BLOCK_N, HEAD_DIM,
               V_STAGES)
    return n_blocks
