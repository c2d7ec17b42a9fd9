"""Launch builders of the KV-cache kernels (``kernels/triton/{decode,combine,kv_append}.py``).

Each builder returns everything one launch needs (grid, positional arguments, constexprs, warps, stages),
from public shapes only; the planner (``plan/decode.py``) and the audit's specs both use them, so the audit
compiles exactly what runs. Pointer arguments come first, in the order of the ``*_POINTERS`` tuples."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..kernels.triton.combine import decode_combine_kernel
from ..kernels.triton.decode import LOG2E, decode_split_kernel
from ..kernels.triton.kv_append import kv_append_kernel
from ..plan.knobs import SECURE_HOISTED_ENV, SECURE_HOISTED_MODES, SECURE_V_SEEN_ENV, SECURE_V_SEEN_MODES, env_choice
from ..plan.tables import block_d
from ..runtime import cdiv

def fp8_q_prescale(dtype_name: str) -> float:
    """With an FP8 cache the products run in float16 (``kernels.triton.decode._widen_fp8_pairs``): a bfloat16 q is
    scaled by 2**-8 on the way (its range then fits float16's; exact, and undone in the score scale)."""
    return 1.0 if dtype_name == "fp16" else 2.0 ** -8


SPLIT_POINTERS = ("q", "k_cache", "v_cache", "out", "lse", "part_o", "part_lse", "cache_seqlens", "page_table",
                  "cache_batch_idx", "cache_leftpad", "cu_seqlens_q", "k_descale", "v_descale")
COMBINE_POINTERS = ("part_o", "part_lse", "out", "lse", "cu_seqlens_q")
APPEND_POINTERS = ("k", "v", "k_cache", "v_cache", "cache_seqlens", "page_table", "cache_batch_idx", "cu_seqlens_q")


@dataclass(frozen=True)
class DecodeConfig:
    """The split kernel's tile and schedule: ``block_m`` packed query rows (tokens x group heads) per
    program, ``block_n`` keys per step, ``num_splits`` key ranges per (sequence, K/V head)."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    num_splits: int
    full_tiles: bool | None = None  # None: the measured policy (full_tiles); sweeps set it
    reg_pages: bool | None = None  # page indices by register loads (_load_public_i32); None: the policy (reg_pages)
    seen_by_load: bool | None = None  # secure: V's select from loaded tensors (seen_by_load); None: the policy
    hoisted: bool | None = None  # secure: per-key offsets out of the key loop (hoisted); None: the policy
    seen_per_key: bool | None = None  # secure: V's select reads each key's position every tile (seen_per_key)
    whole_tiles: bool | None = None  # secure: loads without a mask where the capacity is whole tiles (whole_tiles)
    gather_kv_offsets: bool | None = None  # secure FP8 gathers: V by K's offsets (gather_kv_offsets)
    one_compare: bool | None = None  # fast masked loops: visibility by one compare per score (one_compare)
    round_robin: bool | None = None  # fast masked loop with splits: tiles dealt round-robin (round_robin)
    warm_table: bool | None = None  # fast page gathers with splits: the table's row prefetched first (warm_table)


@dataclass(frozen=True)
class DecodeShape:
    """The public facts of a KV-cache call the launches are built from."""
    batch: int
    seqlen_q: int  # queries per sequence (packed: max_seqlen_q)
    num_heads_q: int
    num_heads_kv: int
    head_dim: int
    page_size: int  # paged: tokens per page; contiguous: S_cache
    capacity: int
    num_pages: int  # paged: pages in the cache; contiguous: cache rows
    paged: bool
    packed: bool
    appended: bool
    has_batch_idx: bool
    has_leftpad: bool
    causal: bool
    secure: bool
    fp8: bool
    return_lse: bool
    fp32: bool
    scale: float

    @property
    def group(self) -> int:
        return self.num_heads_q // self.num_heads_kv

    @property
    def rows(self) -> int:
        """Packed query rows per (sequence, K/V head): every query token of every head of the group."""
        return self.seqlen_q * self.group


def query_tiles(shape: DecodeShape, cfg: DecodeConfig) -> int:
    return cdiv(shape.rows, cfg.block_m)


def workspace_shapes(shape: DecodeShape, cfg: DecodeConfig) -> tuple:
    """(name, shape) of the split step's float32 workspace; none with one split."""
    if cfg.num_splits == 1:
        return ()
    part_rows = query_tiles(shape, cfg) * cfg.block_m
    bh = shape.batch * shape.num_heads_kv
    return (("part_o", (cfg.num_splits, bh, part_rows, block_d(shape.head_dim))),
            ("part_lse", (cfg.num_splits, bh, part_rows)))


def _bsh(t: torch.Tensor, packed: bool) -> tuple:
    """(batch, token, head) element strides of q/out/k/v in [B, S, H, D] (packed [T, H, D]: batch stride 0)."""
    if packed:
        return 0, t.stride(0), t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


def lse_strides(shape: DecodeShape, total_q: int) -> tuple:
    """(batch, head, token) strides of lse: ``[B, Hq, Sq]``, packed ``[Hq, total_q]``."""
    if shape.packed:
        return 0, total_q, 1
    return shape.num_heads_q * shape.seqlen_q, shape.seqlen_q, 1


def page_gather(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether the split kernel reads a page index per key: a paged cache whose pages do not hold whole key tiles."""
    return shape.paged and shape.page_size % cfg.block_n != 0


def full_tiles(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether the fast split kernel runs the tiles every row sees whole in a loop without masks. Measured on H200
    (2026-11-26, same-run A/B against one masked loop, docs/perf-notes.md v22): Sq 512 against 8k 569 against
    840 us, FP8 B64 16k 1118 against 1275 us; but a per-key page gather (page size below the key tile) ran
    794 against 497-514 us (B64 8k page 16), and B1 4k 14.4 against 13.4 us. So: not with a gather, and only for
    query tiles of 64 rows or more, an FP8 cache, or a page per tile (B64 8k page 128: 639 -> 491 us, v22.4)."""
    if cfg.full_tiles is not None:
        return cfg.full_tiles and not shape.secure
    gather = page_gather(shape, cfg)
    if unmasked_fp8_gather(shape, cfg):  # v52: with register page loads, the gather keeps its pipeline
        return True
    return not shape.secure and not gather and (cfg.block_m >= 64 or shape.fp8 or shape.paged)


FP8_GATHER_MIN_TILES = 4  # key tiles per split below which the fast FP8 gather keeps its masked loop (v52)


def fp8_gather_few_tiles(shape: DecodeShape, block_n: int, num_splits: int) -> bool:
    """Whether each split of a fast FP8 page gather has too few key tiles for :func:`unmasked_fp8_gather`'s form: with
    two tiles per split (B1 4k page 16, 16 splits) it ran 9.1 us against the masked 5-stage gather's 8.4 (CUDA-graph
    replays interleaved, H200, 2026-11-30, docs/perf-notes.md v52): the loop without masks and the masked loop after
    it each fill and drain their pipeline."""
    return cdiv(cdiv(shape.capacity, block_n), max(num_splits, 1)) < FP8_GATHER_MIN_TILES


def unmasked_fp8_gather(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether a fast FP8 page gather (a page index per key) runs the tiles every row sees whole without masks
    (:func:`full_tiles`) and takes its page indices by register loads (:func:`reg_pages`): D 128, 16-row query tiles,
    4 warps, with enough tiles per split (:func:`fp8_gather_few_tiles`). Together they took the gather's loop from 932
    to 798 instructions per 128-key tile (sm_90a, CPU compile; either alone: 776 with masks off and page indices through
    shared memory, which lost pipelining: 676.8 us; register loads in the masked loop 46.7 against 43.8 us at B1).
    CUDA-graph replays interleaved on one H200 (2026-11-30, docs/perf-notes.md v52, every sequence full), with
    ``plan.decode.choose_config``'s tiles: B64 16k page 16 506.5 us against 554.3 (contiguous 496.7), page 1 507.3
    against 578.7, page 32 508.2 against 560.1; B1 64k page 16 39.9 against 43.8 (contiguous 40.4)."""
    gather = page_gather(shape, cfg)
    return (gather and shape.fp8 and not shape.secure and not shape.fp32 and cfg.block_m == 16
            and shape.head_dim == 128 and cfg.num_warps == 4
            and not fp8_gather_few_tiles(shape, cfg.block_n, cfg.num_splits))


def reg_pages(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether page indices reach the addresses by a register load that the pipeliner keeps out of shared memory
    (``kernels.triton.decode._load_public_i32``). Always in secure mode: the SASS gate cannot tell an index copied
    through shared memory from the secret K/V tiles beside it."""
    if cfg.reg_pages is not None:
        return cfg.reg_pages
    gather = page_gather(shape, cfg)
    # measured on H200 (2026-11-26, docs/perf-notes.md v22.4): a page per tile, B1 64k page 128 103 -> 72 us,
    # B64 8k page 128 639 -> 490 us (with full_tiles), Sq 512 page 128 781 -> 623 us; a per-key gather slower
    # (B64 8k page 16 497 -> 784 us, 128-key tiles on 8 warps). But a 16-bit gather on the 32- and 64-key tiles on 4
    # warps that plan.decode.choose_config gives it at D 128 since v51 is faster with them (H200, 2026-11-30, graph
    # replays): B1 64k page 16 70.1 us against 85.1 at the same tiles without them
    small_gather = (gather and not (shape.fp8 or shape.fp32) and cfg.block_m == 16 and shape.head_dim == 128
                    and cfg.block_n <= 64)
    return shape.secure or (shape.paged and not gather) or small_gather or unmasked_fp8_gather(shape, cfg)


def triggers_combine(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether the split step lets its combine step (a programmatic dependent on sm_90, ``plan.decode.combine_pdl``)
    launch as the split step starts (``griddepcontrol.launch_dependents``), instead of when it completes: the
    combine's programs then start beside the split's and wait in ``griddepcontrol.wait``. Measured on H200
    (2026-11-28, perf-notes v43, CUDA-graph replays, same-run A/B): B1 4k 11.68 -> 10.87 us, page 16 13.66 -> 12.88,
    B1 64k 68.0 -> 67.3, page 16 76.7 -> 75.7, B4 8k 38.7 -> 37.5; eager calls unchanged. Not in secure mode, whose
    machine code the SASS gate audited as it is."""
    return cfg.num_splits > 1 and not shape.secure


def seen_by_load(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether the secure split kernel zeroes V's rows outside each sequence's secret range by a select built from
    loaded tensors (``kernels.triton.decode._v_rows_seen``: key positions from the public table
    :func:`key_positions_needed` sizes, the lengths read as tensors), which Triton keeps in the MMA operand's layout,
    instead of a select on a range and scalars, which costs every V tile a shared-memory round trip (a write and a
    read of the tile in a blocked layout, then the operand's read). Secure mode without appended tokens (secure mode
    takes none: ``_checks``); the fast path masks V's loads instead.

    The policy, from same-run A/Bs on one H200 (2026-11-29, ``bench.experiments.secure_v_seen``, docs/perf-notes.md
    v47, 64x32/8 heads, D 128, every sequence full, secure / fast): at one split, a 16-bit cache (with
    ``plan.decode.choose_config``'s tiles for it) contiguous 8k 0.93 -> 0.98, 16k 0.92 -> 0.97, page 16 0.89 -> 0.99,
    page 32 0.92 -> 0.98, page 64 0.93 -> 0.98; a contiguous FP8 cache 0.76 -> 0.86. Not the FP8 page gathers (page 16
    0.78 -> 0.72 at best, page 32 0.81 -> 0.78), nor with splits (B1 64k contiguous 0.98 -> 0.95, page 16 FP8 0.83
    either way): they keep the select on scalars. With splits, since v49, where the key loop is hoisted
    (:func:`hoisted`, each tile in one page): B1 64k contiguous FP8 0.80 -> 0.99, bf16 0.98 -> 1.01
    (docs/perf-notes.md v48-v49, docs/security.md §5.15-§5.16). Only in the measured regime (16-row query tiles,
    D 128).
    ``FLASHCORE_SECURE_V_SEEN=scalars`` (``plan.knobs``; an audit knob) keeps the select on scalars at the same
    tiles. Outside the policy's forms the new select is not offered: the static gate found ptxas folding it into the
    predicate of V's loads where V is not copied by cp.async (a head dim of 72, whose rows are read element by element),
    so those loads would follow the secret lengths; every form the planner gives it is audited clean (docs/security.md
    §5.14). ``DecodeConfig.seen_by_load`` forces it for measurements only."""
    if cfg.seen_by_load is not None:
        return cfg.seen_by_load and shape.secure and not shape.appended
    if env_choice(SECURE_V_SEEN_ENV, SECURE_V_SEEN_MODES) == "scalars":  # the audit's control: same tiles
        return False
    if not (shape.secure and not shape.appended and not shape.fp32 and cfg.block_m == 16 and shape.head_dim == 128):
        return False
    if gather_kv_offsets(shape, cfg):  # v52: the secure FP8 gather, as an AND (_keep_rows)
        return True
    if cfg.num_splits > 1:  # v49: with splits, where the loop is hoisted, reading each key's position (seen_per_key)
        return hoisted(shape, cfg)
    return not (shape.fp8 and shape.paged)


def seen_per_key(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether V's select from loaded tensors (:func:`seen_by_load`) reads each key's position from the public table
    every tile (``KEY_POS[n0 + j]``: one word per lane, no word read by two warps) instead of the tile's positions
    once and the tile's start every tile (``KEY_POS[n0]``, one word that every warp of the program reads through
    the L1). The policy: a 16-bit cache with splits (where the loop is hoisted), the form the counters gate ran
    clean twice at its tiles (docs/security.md §5.16); the two reads measured the same there (B1 64k 1.007 against
    1.008 of fast, H200, docs/perf-notes.md v49). Not FP8, which reads the tile's start: the per-key read was built
    to take the shared word out of the L1, after v48's FP8 split form showed a class effect in the L2 sectors the SMs
    request, but that effect followed the stage count instead (4 stages over the gate's line with either read, 3
    stages under it with either), and the per-key read costs FP8 about 5% (0.937-0.939 against 0.99-1.00 of fast).
    ``DecodeConfig.seen_per_key`` forces it either way, for measurements."""
    if not seen_by_load(shape, cfg):
        return False
    if cfg.seen_per_key is not None:
        return cfg.seen_per_key
    return cfg.num_splits > 1 and hoisted(shape, cfg) and not shape.fp8


def hoisted(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether the secure split kernel's key loop addresses its tiles as a per-tile scalar plus a per-key offset
    computed once before the loop (K's offsets shared by V when their strides agree), compares its keys' indices
    within the tile against bounds moved by the tile's start (32-bit compares: ptxas had widened the absolute ones
    to 64 bits), zeroes V's stale rows by an AND of their bits (``kernels.triton.decode._keep_rows``, with V's select
    from loaded tensors), and, when the capacity is whole tiles and the head dim a power of two, loads without a
    mask (``WHOLE_TILES``). Only where every tile lies in one page (contiguous, or pages a multiple of the tile).
    Before: the per-key 64-bit address arithmetic of ``_key_pointers`` for K and again for V, a predicate per
    copy against the capacity, and a split, select and pack per pair of V values: 1,013 instructions per 128-key
    FP8 tile against 773 (sm_90a, CPU compile), the fast path's unmasked loop 764.

    The policy: 16-row query tiles, D 128, each tile in one page (contiguous, pages of 32 keys or more), a 16-bit
    cache at one split (v48), any cache with splits (v49), an FP8 cache at one split when not paged (v51);
    ``plan.decode.choose_config`` gives them their tiles.
    Same-run A/Bs on one H200 (2026-11-29, every sequence full, secure / fast): at one split (docs/perf-notes.md
    v48) B64 8k contiguous 0.98-0.99 -> 1.00, 16k 0.97 -> 1.00, pages 32/64 0.98-0.99 -> 0.99-1.00, pages 128/256
    0.97-0.99 -> 1.01; with splits (v49, 128-key tiles, 4 warps, 3 stages, V's select from loaded tensors) B1 64k
    contiguous FP8 0.80 -> 0.99, page 128 0.85 -> 0.98 (read per key), bf16 0.98 -> 1.01, 4k 0.97 -> 1.04 (FP8),
    1.01 -> 1.04 (bf16). The counters gate (docs/security.md §5.15-§5.16) found the FP8 split form's L2 read sectors from the SMs
    higher for one padding class at 4 stages (three runs, two reads of the key positions), under its line at 3
    stages (three runs), as the form before shows it (p = 0.0067): so 3 stages. An FP8 cache at one split: at the
    planner's old tiles (64 keys, 4 warps, 3 stages) B64 16k 0.86 -> 0.87-0.88 (v48), but on 128-key tiles with 4
    stages 0.92-0.93 of fast against 0.80-0.86 for the form before (v51, H200, interleaved with the fast form), gate 2
    passing outright (docs/security.md §5.18); so since v51 where the FP8 cache is not paged (a paged FP8 cache at one
    split keeps its page-per-tile or gather forms). ``FLASHCORE_SECURE_HOISTED=off``
    (``plan.knobs``; an audit knob) keeps the loop as before at the same tiles (with splits, V's select on scalars
    too: the form before v49). ``DecodeConfig.hoisted`` forces it either way, for measurements."""
    one_page = not page_gather(shape, cfg)
    if not (shape.secure and one_page):
        return False
    if cfg.hoisted is not None:
        return cfg.hoisted
    if env_choice(SECURE_HOISTED_ENV, SECURE_HOISTED_MODES) == "off":  # the audit's control: same tiles
        return False
    return (not shape.appended and not shape.fp32 and cfg.block_m == 16 and shape.head_dim == 128
            and (cfg.num_splits > 1 or not shape.fp8 or not shape.paged))


def gather_kv_offsets(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether a secure page gather (a page index per key: its tiles span pages, so the loop is not hoisted; FP8, and
    16-bit with splits since v57) addresses V's tile by K's per-key offsets (when K and V have the same strides)
    instead of computing them again, as the fast path does (``SAME_KV``); the policy pairs it with copies without a
    mask in whole tiles (:func:`whole_tiles`) and V's select from loaded tensors as an AND (:func:`seen_by_load`,
    ``_keep_rows``), which keeps V's tile out of a shared-memory round trip (STS 14 -> 6 per 64-key tile, sm_90a).

    The policy: D 128, 16-row query tiles; FP8: pages below 128 keys (pages 16, 32, 64 at 128-key tiles with splits;
    16 and 32 at one split, where ``plan.decode.choose_config`` gives 128-key tiles too); 16-bit: with splits, on the
    64-key tiles the planner gives pages below 64. CUDA-graph replays interleaved
    with the fast form on one H200 (2026-11-30, docs/perf-notes.md v52.5-v52.7, every sequence full, secure / fast):
    B64 16k page 16 0.69 -> **0.865** (726.8 -> 582.2 us; 64-key tiles 612.7; offsets and unmasked copies alone 0.74),
    page 32 0.72 -> **0.90**, B1 64k page 16 0.71 -> **0.87** (60.7 -> 49.6), page 64 0.77 -> 0.90, 4k page 16
    0.72 -> 0.84; outputs bit-equal to the form before at the same tiles. Since v57 the 16-bit gathers with splits too
    (v50's 64-key tiles, pages below 64): CUDA-graph replays interleaved on one H200 (2026-11-30, docs/perf-notes.md
    v57, every sequence full, against v50's form at the same tiles) B8 4k page 16 41.08 -> 39.70 us (fast 38.41), B1
    4k 11.13 -> 10.42 (fast 8.98), B1 64k 73.01 -> 71.62 (fast 70.28), page 32 71.03 -> 71.38; 1,488 instructions
    against 1,704 (sm_90a, B8 4k page 16); and the timing gate passes on it where v50's form differed (short vs long
    -32.9 ns, |t| 11.2; docs/security.md §5.24). ``DecodeConfig.gather_kv_offsets`` forces it either way, for
    measurements."""
    gather = page_gather(shape, cfg)
    if not (shape.secure and gather and not hoisted(shape, cfg)):
        return False
    if cfg.gather_kv_offsets is not None:
        return cfg.gather_kv_offsets
    if shape.appended or shape.fp32 or cfg.block_m != 16 or shape.head_dim != 128:
        return False
    if shape.fp8:
        return cfg.block_n == 128
    return cfg.num_splits > 1 and cfg.block_n == 64  # v57: the 16-bit gathers with splits, on v50's tiles


def one_compare(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether the fast path's masked key loops (``kernels.triton.decode._attend_tiles``) test visibility by one
    unsigned compare per score (a key's index from the first visible key against its row's count of visible keys)
    instead of three selects (key range, real row, causal), as the secure FP8 gather does since v53. Fewer
    instructions everywhere (sm_90a, CPU compile, per masked loop: 16-bit contiguous 456 -> 408 with splits and 448 ->
    400 at one split, page 1 555 -> 502, page 16 530 -> 481, page 64 508 -> 469), but not faster everywhere.

    The policy: a 16-bit cache, D 128, 16-row query tiles, contiguous or pages of one key. CUDA-graph replays
    interleaved on one H200 (2026-11-30, docs/perf-notes.md v54, B 32/8 heads, every sequence full, two runs, against
    the three selects): B1 64k page 1 70.3 / 70.7 us against 72.5 / 72.6, B1 4k contiguous 8.60 / 8.62 against 8.74
    / 8.71, B1 64k contiguous 67.0 / 67.0 against 66.9 / 67.5, B8 16k and B64 8k contiguous within 0.1%; slower
    where each key's page is gathered from a larger page (B1 64k page 16 70.5-71.0 against 69.9-70.6, B8 16k page 16
    +1.1%, B64 8k page 16 +0.4-0.6%) and for FP8 caches (B64 16k page 16 +2.3%, B1 64k +0.6-1.8%), whose masked loops
    run few tiles. ``DecodeConfig.one_compare`` forces it either way, for measurements."""
    if shape.secure:
        return False
    if cfg.one_compare is not None:
        return cfg.one_compare
    return (not (shape.fp8 or shape.fp32) and shape.head_dim == 128 and cfg.block_m == 16
            and (not shape.paged or shape.page_size == 1))


def round_robin(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether the fast split kernel deals its key tiles to the splits round-robin (split s: tiles s, s + splits,
    ...) instead of in contiguous ranges sized from the sequence's length. Either way each split's share is within a
    tile of the others'; round-robin, a split's first tiles' addresses do not wait for the length's load, only the
    loop's bound does. Only the one masked loop (:func:`full_tiles` false: the unmasked form's ranges are contiguous)
    and not secure (its splits cover fixed shares of the capacity).

    The policy, where splits hold few tiles: v58's short contiguous form (16-bit, D 128, 64-key tiles) and the FP8
    page gathers with few tiles a split (:func:`fp8_gather_few_tiles`). The bench's timer per call and CUDA-graph
    replays, interleaved, one H200 (2026-11-30, docs/perf-notes.md v59, B1 32/8 D128, every sequence full): 1k 9.18 ->
    9.02 us (graphs 6.11 -> 5.92), 4k 12.99 -> 12.86 (9.94 -> 9.66), FP8 page 16 4k 12.90 -> 12.58 (9.77 -> 9.56), 2k
    11.42 -> 11.17; not on longer splits (16k contiguous on 128-key tiles 24.74 -> 25.47, 64k 68.29 -> 69.31) nor the
    16-bit page gathers (4k page 16 13.79 -> 14.69, 64k 70.66 -> 75.49, page 1 64k 71.58 -> 71.81).
    ``DecodeConfig.round_robin`` forces it either way, for measurements."""
    if shape.secure or cfg.num_splits <= 1 or full_tiles(shape, cfg):
        return False
    if cfg.round_robin is not None:
        return cfg.round_robin
    if shape.head_dim != 128 or cfg.block_m != 16 or shape.fp32:
        return False
    if shape.fp8:
        return page_gather(shape, cfg) and fp8_gather_few_tiles(shape, cfg.block_n, cfg.num_splits)
    return not shape.paged and cfg.block_n == 64


WARM_TABLE_MAX_LINES = 8  # 128-byte lines of page-table row: 1 KB, 4k keys in pages of 16


def warm_table(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Whether the fast split kernel prefetches the sequence's page-table row into L2 as it starts (one request per
    128-byte line, from thread 0 on), beside the length's load that the split's page indices wait for. Policy: the
    16-bit page gathers with splits (contiguous ranges, :func:`round_robin` false) at the page sizes measured (16 and
    32) whose row is at most ``WARM_TABLE_MAX_LINES`` lines. The bench's timer per call and CUDA-graph replays,
    interleaved, one H200 (2026-11-30, docs/perf-notes.md v59, B1 32/8 D128, every sequence full): 4k page 16 13.79 ->
    13.57 us (graphs 10.52 -> 10.36), 2k page 16 11.39 -> 11.01-11.04 (8.16 -> 7.97), 4k page 32 13.55 -> 13.47-13.50;
    16k page 16 (32 lines) 26.56 -> 26.75 and the FP8 gather with round-robin splits 12.64 -> 12.70-12.74, so
    neither. A tensor of the lines' addresses (a request per thread) lost 0.5-1.0 us at the same shapes.
    ``DecodeConfig.warm_table`` forces it either way, for measurements."""
    if shape.secure or not shape.paged or cfg.num_splits <= 1:
        return False
    if cfg.warm_table is not None:
        return cfg.warm_table
    lines = cdiv(cdiv(shape.capacity, shape.page_size), 32)  # int32 entries, 32 to a line (as the kernel counts)
    return (page_gather(shape, cfg) and shape.page_size in (16, 32) and not shape.fp8 and not round_robin(shape, cfg)
            and lines <= WARM_TABLE_MAX_LINES)


def whole_tiles(shape: DecodeShape, cfg: DecodeConfig) -> bool:
    """Secure loads without a mask, in the hoisted loop and in v52's FP8 gather (:func:`gather_kv_offsets`): every key
    tile lies inside the capacity (a public multiple of the tile) and every row's columns are the head dim's (no
    padding columns)."""
    whole = shape.capacity % cfg.block_n == 0 and block_d(shape.head_dim) == shape.head_dim
    if cfg.whole_tiles is not None:  # measurements: the secure loop's copies unmasked without the hoisted loop too
        return cfg.whole_tiles and shape.secure and whole
    return (hoisted(shape, cfg) or gather_kv_offsets(shape, cfg)) and whole


def key_positions_needed(shape: DecodeShape, cfg: DecodeConfig) -> int:
    """Entries of the key-position table the split kernel reads (its key tiles cover the capacity rounded up to
    whole tiles); 0 when it reads none."""
    return cdiv(shape.capacity, cfg.block_n) * cfg.block_n if seen_by_load(shape, cfg) else 0


def build_split(shape: DecodeShape, cfg: DecodeConfig, q, k_cache, v_cache, out, page_table_stride: int):
    """(grid, scalar args, constexprs) of the split kernel (pointers are passed per call)."""
    same_kv = k_cache.stride()[:3] == v_cache.stride()[:3]
    if not same_kv and cfg.gather_kv_offsets is None and gather_kv_offsets(shape, cfg):
        # V with strides of its own cannot take K's offsets: the secure gather's form before v52 (FP8) or v57 (16-bit)
        # at these tiles (V's own offsets, masked copies, V's select on scalars), not the select without them
        cfg = replace(cfg, gather_kv_offsets=False)
    total_q = q.shape[0] if shape.packed else shape.batch * shape.seqlen_q
    part_rows = query_tiles(shape, cfg) * cfg.block_m
    args = (shape.scale * LOG2E, *_bsh(q, shape.packed),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            *_bsh(out, shape.packed), *lse_strides(shape, total_q), page_table_stride,
            shape.seqlen_q, total_q, shape.capacity, shape.num_pages, shape.num_heads_kv, cfg.num_splits, part_rows)
    constexprs = dict(
        GROUP=shape.group, HEAD_DIM=shape.head_dim, BLOCK_D=block_d(shape.head_dim), BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, PAGE_SIZE=shape.page_size if shape.paged else 1, PAGED=shape.paged,
        PACKED=shape.packed, APPENDED=shape.appended, HAS_BATCH_IDX=shape.has_batch_idx,
        HAS_LEFTPAD=shape.has_leftpad, CAUSAL=shape.causal, SECURE=shape.secure, FP8=shape.fp8,
        Q_PRESCALE=fp8_q_prescale("fp16" if q.dtype == torch.float16 else "bf16") if shape.fp8 else 1.0,
        SPLIT=cfg.num_splits > 1, FULL_TILES=full_tiles(shape, cfg), REG_PAGES=reg_pages(shape, cfg),
        ASM=True, SAME_KV=same_kv, RETURN_LSE=shape.return_lse,
        PRECISION="ieee" if shape.fp32 else "tf32", PDL_TRIGGER=triggers_combine(shape, cfg),
        SEEN_BY_LOAD=seen_by_load(shape, cfg), HOISTED=hoisted(shape, cfg), WHOLE_TILES=whole_tiles(shape, cfg),
        SEEN_PER_KEY=seen_per_key(shape, cfg),
        GATHER_KV_OFFSETS=gather_kv_offsets(shape, cfg) and same_kv, ONE_COMPARE=one_compare(shape, cfg),
        ROUND_ROBIN=round_robin(shape, cfg), WARM_TABLE=warm_table(shape, cfg))
    grid = (cfg.num_splits * query_tiles(shape, cfg), shape.batch * shape.num_heads_kv)
    return decode_split_kernel, grid, args, constexprs


COMBINE_WARPS, COMBINE_STAGES = 1, 1  # one warp merges one row (kernels/triton/combine.py)
COMBINE_TILE = 4096  # partial-output elements per chunk of splits: 128 fp32 registers per lane; twice that spills
# (sm_90a, D 128 with 64 splits and D 256 with 32: 36 and 29 local loads/stores, CPU compile, 2026-11-27)


def combine_block_s(head_dim: int) -> int:
    """Splits per chunk of the combine step: as many as the register cap holds (up to 64), whatever the split
    count, so one binary per head dim serves every count (the audit's list compiles one); unused ones are masked
    loads, issued but never sent."""
    return min(64, COMBINE_TILE // block_d(head_dim))


def build_combine(shape: DecodeShape, cfg: DecodeConfig, q, out, pdl: bool = False):
    """(kernel, grid, scalar args, constexprs) of the combine step. ``pdl``: the step is launched as a
    programmatic dependent of the split step (``launch_pdl``) and waits for it in the kernel."""
    total_q = q.shape[0] if shape.packed else shape.batch * shape.seqlen_q
    part_rows = query_tiles(shape, cfg) * cfg.block_m
    args = (*_bsh(out, shape.packed), *lse_strides(shape, total_q), shape.seqlen_q, total_q, shape.num_heads_kv,
            cfg.num_splits, part_rows)
    constexprs = dict(GROUP=shape.group, HEAD_DIM=shape.head_dim, BLOCK_D=block_d(shape.head_dim),
                      BLOCK_S=combine_block_s(shape.head_dim), PACKED=shape.packed,
                      RETURN_LSE=shape.return_lse, PDL=pdl, COUNT_MASKS=False)
    grid = (shape.rows, shape.batch * shape.num_heads_kv)  # rows past the split's tile padding hold nothing
    return decode_combine_kernel, grid, args, constexprs


def build_append(shape: DecodeShape, k, v, k_cache, v_cache, page_table_stride: int):
    args = (*_bsh(k, shape.packed), *_bsh(v, shape.packed),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            page_table_stride, shape.seqlen_q, k.shape[0] if shape.packed else shape.batch * shape.seqlen_q,
            shape.num_heads_kv, shape.capacity, shape.num_pages)
    constexprs = dict(HEAD_DIM=shape.head_dim, BLOCK_H=max(1, 1 << (shape.num_heads_kv - 1).bit_length()),
                      BLOCK_D=block_d(shape.head_dim), PAGE_SIZE=shape.page_size if shape.paged else 1,
                      PAGED=shape.paged, PACKED=shape.packed, HAS_BATCH_IDX=shape.has_batch_idx)
    grid = (shape.seqlen_q, shape.batch)
    return kv_append_kernel, grid, args, constexprs
