"""Plans of KV-cache calls: the configuration (tile, split count) chosen from public shapes only, and the
ordered steps (append, split, combine) replayed on every call with the same key.

The split count depends on the batch, the K/V heads, the query tiles, the cache's capacity (the page
table's width times the page size) and the SM count, never on ``cache_seqlens``: a CUDA graph captured once
stays valid for any lengths, and in secure mode the schedule reveals nothing."""
from __future__ import annotations

import math
import threading

import torch

from ..launch.triton_decode import (COMBINE_STAGES, COMBINE_WARPS, DecodeConfig, DecodeShape, build_append,
                                    build_combine, build_split, fp8_gather_few_tiles, key_positions_needed,
                                    query_tiles, workspace_shapes)
from ..runtime import (KernelStep, capturing, cdiv, current_stream, device_arch, in_compiled_graph, interpreting,
                       keeps_buffers, sm_count)
from .build import clear_unowned_rows
from .cache import PlanCache
from .prefill import prefill_launch, prefill_serves, run_prefill

MIN_TILES_PER_SPLIT = 2  # fewer key tiles per split and the combine's reads stop being negligible
GATHER_MIN_TILES_PER_SPLIT = 4  # the fast two-wave page gather's at two programs per SM (v58)


def choose_config(shape: DecodeShape, num_splits: int, device: torch.device) -> DecodeConfig:
    """The split kernel's configuration. ``num_splits`` 0 chooses the split count (public facts only)."""
    d = shape.head_dim
    block_m = 16 if shape.rows <= 16 else (32 if shape.rows <= 32 else 64)
    if shape.rows >= 128 and d <= 128 and not shape.fp32 and not shape.secure:
        # chunked prefill: 128-row tiles halve the K/V reads per query (measured on H200, 2026-11-26, Sq 512 against
        # 8k, 32/8 heads, D 128: 566 us against 1002 us with 64-row tiles; docs/perf-notes.md v22). Not in secure
        # mode: the SASS gate's secure decode forms have tiles of 16 to 64 rows (audit/specs.py)
        block_m = 128
    if shape.secure and shape.fp32:
        # fp32 with 64-row tiles spills, and ptxas guards the spill stores with a predicate that follows the secret
        # lengths (`flashcore audit sass`: predicated-memory STL, 2026-11-26); the 32-row form is clean
        block_m = min(block_m, 32)
    if shape.fp32:
        block_n = 32
    else:
        block_n = 128 if d <= 128 else 64
    gather = shape.paged and shape.page_size % block_n != 0  # a page index per key, not per tile
    # A fast bf16/fp16 decode gather with splits (B1-like): one program per SM, 8 warps, 5 stages. Below 5 stages
    # the gather's loop holds one K/V slot (docs/perf-notes.md v25.2), which two programs per SM (4 warps, 2 stages,
    # the v18.3 form) partly hid. Measured on H200 (2026-11-26, v25.6-v25.7, two runs, V addressed by K's offsets):
    # B1 64k page 16 80.0/79.6 us against 81.9/82.0, page 64 76.3/75.8 against 81.0/81.1.
    one_wave_gather = gather and not (shape.secure or shape.fp32 or shape.fp8) and block_m == 16 and d <= 128
    # v51: at D 128 and pages of 16 to 127 keys, the same gather with splits on 64-key tiles, 4 warps, 3 stages and
    # register page loads (launch.triton_decode.reg_pages; two programs per SM, the tiles that made the secure gather
    # faster than it in v50) ran
    # faster still. CUDA-graph replays on one H200 (2026-11-30, docs/perf-notes.md v51, B1 32/8, every sequence
    # full, `bench.experiments.kv_configs` v51/v51b, contiguous 66.9 us at 64k and 8.6-8.7 at 4k in the same runs):
    # 64k page 16 70.1/70.1 us against 75.4/75.2 (without register page loads 85.1; 4 stages 71.7; 49 splits on 2
    # stages 71.4; 32-key tiles 71.2-73.7), page 32 69.8 against 72.8, page 64 70.5 against 71.7 (a page per tile
    # there), 4k page 16 8.8-8.9 against 10.0-10.2. Page 1 keeps the one-wave form (72.6 against 72.0)
    two_wave_gather = (one_wave_gather and d == 128 and 16 <= shape.page_size < 128
                       and (num_splits == 0 or num_splits > 1))
    if two_wave_gather:
        one_wave_gather = False
        block_n = 64
    # v53: pages of 64 keys with splits take the contiguous cache's tiles instead (128 keys, 8 warps, 3 stages, one
    # program per SM), each tile's two pages by register page loads. CUDA-graph replays interleaved on one H200
    # (2026-11-30, docs/perf-notes.md v53, B1 32/8 64k, every sequence full, two runs): 69.3/69.0 us against
    # 70.4/70.8 for v51's form (contiguous 67.1/67.3); unmasked whole tiles 71.4, 4 warps at 33 splits 77.0-79.4
    pair_pages = two_wave_gather and shape.page_size == 64
    # v52: a fast FP8 cache at D 128 with splits (B1-like), any layout, on 128-key tiles, 4 warps, 3 stages, two
    # programs per SM. CUDA-graph replays interleaved replay by replay on one H200 (2026-11-30, docs/perf-notes.md
    # v52, kv_configs v52c, B1 32/8, every sequence full): 64k contiguous 40.4 us against 48.4 (128 keys, 8 warps, 3
    # stages, one program per SM; 64-key tiles at 49 splits 40.9), 4k 8.0 against 8.3; the page gathers below
    fp8_two_per_sm = (shape.fp8 and not shape.secure and block_m == 16 and d == 128
                      and (num_splits == 0 or num_splits > 1))
    auto_splits, short_split = num_splits == 0, False
    if num_splits == 0:
        # One wave: as many splits as fit beside the other programs on the SMs (measured on H100, 2026-11-25:
        # filling each SM once beat two programs per SM for a contiguous cache); per-key page gathers (secure, FP8)
        # hide their extra latency better with two programs per SM.
        programs = shape.batch * shape.num_heads_kv * cdiv(shape.rows, block_m)
        # v53: secure FP8 decode with splits where each tile is one page (the hoisted loop: contiguous, rows, left
        # pads) counts its splits for two programs per SM as the fast FP8 form does since v52 (its 4-warp programs
        # ran one per SM). CUDA-graph replays interleaved on one H200 (2026-11-30, docs/perf-notes.md v53, B1 32/8 64k):
        # 64k 43.2 us at 33 splits against 50.3 at 16 (fast 41.6), 16k 16.4 against 16.8 (fast 15.0); gate 2 at 8k (32
        # splits): every instruction's count identical, the SMs' L2 requests and sectors within noise
        # (docs/security.md §5.20). Not paged: the secure FP8 gathers count theirs that way already, and pages of 128
        # keys or more fail gate 2 with splits (§5.17)
        secure_fp8_two_per_sm = (shape.fp8 and shape.secure and not shape.paged and block_m == 16 and d == 128
                                 and not shape.fp32 and not shape.appended)
        target = sm_count(device) * (2 if gather and not (one_wave_gather or pair_pages) or fp8_two_per_sm
                                     or secure_fp8_two_per_sm else 1)
        tiles = cdiv(shape.capacity, block_n)
        num_splits = max(1, min(target // programs, tiles // MIN_TILES_PER_SPLIT, 128))
        if (not (shape.secure or shape.fp32 or shape.fp8 or shape.paged) and block_m == 16 and d == 128
                and num_splits > 1 and cdiv(tiles, num_splits) <= MIN_TILES_PER_SPLIT):
            # v58: a contiguous 16-bit cache whose splits hold two 128-key tiles or fewer (B1 4k and below) runs
            # 64-key tiles on 4 warps (warps and stages below), as many splits as before at two tiles each. The
            # bench's timer per call (cold L2, queue pre-filled; H200, 2026-11-30, docs/perf-notes.md v58, B1 32/8
            # D128, every sequence full, two runs): 4k 12.86-12.96 us against 13.57-13.66 (8 warps 13.09, 4
            # stages 13.12, 32 splits 13.60-13.66, 32-key tiles 14.59), 2k 10.82 against 11.90; 8k stays on
            # 128-key tiles (16.86 against 17.06-17.18)
            short_split = True
            block_n = 64
            num_splits = max(1, min(target // programs, cdiv(shape.capacity, block_n) // MIN_TILES_PER_SPLIT, 128))
        elif (two_wave_gather and not pair_pages and not shape.secure
              and cdiv(tiles, num_splits) < GATHER_MIN_TILES_PER_SPLIT):
            # v58: the fast two-wave page gather (pages 16, 32) fills each SM once where two programs per SM would
            # hold fewer than four 64-key tiles each: B1 4k page 16 13.95 us per call at 16 splits against
            # 14.43-14.46 at 32 (same timer and run as above); 16k keeps two per SM (26.53 us at 32 splits, 28.29 at 16)
            num_splits = max(1, min(sm_count(device) // programs, tiles // MIN_TILES_PER_SPLIT, 128))
    num_warps, num_stages = (4, 2) if shape.fp32 or gather and num_splits > 1 else (8, 3)
    if one_wave_gather and num_splits > 1:
        num_warps, num_stages = 8, 5
    if short_split:
        num_warps, num_stages = 4, 3
    reg_pages = None
    if two_wave_gather and num_splits > 1 and pair_pages:
        block_n, num_warps, num_stages, reg_pages = 128, 8, 3, True
    elif two_wave_gather and num_splits > 1:
        num_warps, num_stages = 4, 3
    elif two_wave_gather:  # one split after all (a short cache): the gather's one-split tiles below
        block_n = 128
    if (gather and num_splits == 1 and not (shape.secure or shape.fp32 or shape.fp8) and block_m == 16 and d == 128
            and shape.page_size < 64):
        # v51: the fast one-split gather (B64-like) on 32-key tiles, 4 warps, 3 stages (register page loads:
        # launch.triton_decode.reg_pages). CUDA-graph
        # replays on one H200 (2026-11-30, docs/perf-notes.md v51, 64x32/8 D128, every sequence full, interleaved):
        # 8k page 16 473.6-473.8 us (three runs) against 487.3-488.2 for 128-key tiles on 8 warps (contiguous
        # 468.4/469.6: 1.0% behind instead of 4.0%), 16k page 16 946-948 against 968-972 (contiguous 928.6), page 32
        # 475.7-475.9 against 482.3-483.2, page 1 485.1 against 496.0; 64-key tiles 484-485 (4 stages), 576 (3)
        block_n, num_warps, num_stages = 32, 4, 3
    if gather and num_splits > 1 and shape.secure and shape.fp8 and block_m == 16 and d <= 128:
        # Secure FP8 gathers with splits (B1-like): its page indices are register loads (reg_pages), not a pipeline
        # stage, so a third stage keeps the next tile's copies in flight (the key loop's cp.async wait: 0 outstanding
        # groups at 2 stages, 2 at 3), and two programs still fit an SM (104 KB of shared memory; 136 KB at 4 stages).
        # H100, 2026-11-28, B1 64k page 16, 33 splits, graph replays (docs/perf-notes.md v37): 62.1 us against 74.0
        # (2 stages), 87.0 (4), 90.0 (5); fast FP8 60.5
        num_stages = 3
    if (gather and num_splits > 1 and shape.secure and not (shape.fp8 or shape.fp32) and block_m == 16 and d == 128
            and shape.page_size <= 64):
        # Secure 16-bit gathers with splits (B1-like, pages below 64 keys: each tile spans pages, so no hoisted loop):
        # 64-key tiles on 4 warps, 3 stages, the split count kept. Same-run A/B on one H200 (2026-11-29, session 35,
        # bench.experiments.secure_v_seen case 46, B1 32/8 D128 64k page 16, every sequence full, secure / fast):
        # 82.3 us (1.02) against 89.8 (0.935; 128-key tiles, 4 warps, 2 stages) and 98.6 (128 keys, 3 stages); 128
        # keys at 4 stages do not fit the shared memory. FP8 did not gain from the same (case 45: 0.80 at 64 keys).
        # Page 64 since v51: there each 64-key tile is one page, so the hoisted loop (launch.triton_decode.hoisted);
        # B1 64k, CUDA-graph replays on one H200 (2026-11-30, kv_configs v51e): 70.4 us against 79.0 (128-key tiles,
        # 4 warps, 2 stages), fast 70.5; gate 2 as page 16's (docs/security.md §5.18)
        block_n, num_warps, num_stages = 64, 4, 3
    gather_at_64 = shape.paged and shape.page_size % 64 != 0
    if shape.fp8 and block_m == 16 and d <= 128 and not (shape.secure and shape.paged):
        # An FP8 tile is half the bytes for the same widening and MMA work, so more programs per SM pay (H200,
        # 2026-11-26, 64x32/8 D128 16k, two runs, docs/perf-notes.md v24): fast at one split 64-key tiles, 4 warps, 4
        # stages, 530/528 us against 566/560 (128 keys, 8 warps, 3 stages) and 535/563 (128 keys, 4 warps, 4
        # stages); with splits (B1) 8 warps tie or win (64k 53.3 against 53.9 us, 4k 12.7 against 13.6); secure
        # 4 warps, 3 stages, 672/669 us against 707/701 (its 4-stage form ran 895). The per-key page gather (page 16,
        # one split) too: 64-key tiles on 4 warps 620 us against 682 (128 keys, 8 warps); pages 1 and 32 follow
        # unmeasured (v24.5)
        if shape.secure and num_splits == 1 and not shape.paged and d == 128 and not shape.appended:
            # v51: the hoisted loop (launch.triton_decode.hoisted) on 128-key tiles, 4 warps, 4 stages. CUDA-graph
            # replays on one H200 (2026-11-30, docs/perf-notes.md v51, kv_configs v51f, 64x32/8 D128 16k, every
            # sequence full): 558.6 us against 612.7 for the form before (128-key tiles, 3 stages, not hoisted), the
            # fast form 524.3 and 571.7 in the same run; hoisted at 3 stages 603.9, at 64 keys 612-615, on 8 warps
            # 809-839
            block_n, num_warps, num_stages = 128, 4, 4
        elif shape.secure:
            num_warps, num_stages = 4, 3
        elif fp8_two_per_sm and num_splits > 1 and not (gather and fp8_gather_few_tiles(shape, 128, num_splits)):
            # v52 (above): with splits 128-key tiles, 4 warps, 3 stages; a page gather then runs its whole tiles
            # without masks, on register page loads (launch.triton_decode.unmasked_fp8_gather): B1 64k page 16
            # 39.9 us against 43.8 for the 5-stage masked gather below (contiguous 40.4), pages 1/32/64 43.2-43.6
            # against 45.2-46.4 (kv_configs v52b, not interleaved). Not where a split has few tiles (B1 4k page 16:
            # 9.1 us against 8.4, v52c), which keeps that gather
            block_n, num_warps, num_stages = 128, 4, 3
        elif shape.paged and not shape.secure and d == 128 and num_splits == 1 and gather_at_64:
            # v52: the fast FP8 page gather at one split (B64-like) on 64-key tiles, 4 warps, 4 stages, its whole
            # tiles without masks, on register page loads (launch.triton_decode.unmasked_fp8_gather): the form a page
            # of 64 keys runs as a page per tile. CUDA-graph replays interleaved on one H200 (2026-11-30,
            # docs/perf-notes.md v52, kv_configs v52c, 64x32/8 D128 16k, every sequence full): page 16 506.5 us
            # against 554.3 (128-key tiles, 4 warps, 5 stages, masked; 128-key tiles unmasked 527.4, 64-key at 3
            # stages 520.5), page 1 507.3 against 578.7, page 32 508.2 against 560.1; contiguous 496.7, the bf16
            # cache at page 16 952.4 (1.88x)
            block_n, num_warps, num_stages = 64, 4, 4
        elif shape.paged and (shape.page_size % 64 != 0 or gather and num_splits > 1):
            # A per-key page gather at any tile size: its loop holds one K/V slot below 5 stages (the page index is
            # a load stage of its own ahead of K/V: TTGIR, one buffer and async_wait 0), so each tile waited for its
            # whole load. 128-key tiles, 4 warps, 5 stages (two slots) measured on H200 (2026-11-26, docs/perf-notes.md
            # v25, two runs each): B1 64k page 16 (33 splits) 58.7/59.1 us against 70.4/70.8 (4 warps, 2 stages);
            # B64 16k page 16 597/610 against 622/631 (64-key tiles, 4 warps, 4 stages). Through the planner (v25.4):
            # B1 pages 1/32 54.8/59.5 us against 66.4/69.7, B64 pages 1/32 606/635 against 650/635. Page 64 with
            # splits is a gather at these 128-key tiles as well: B1 64k 55.7 us against 64.8 (one run, v25.9; a page
            # per 64-key tile 57.0). At one split, pages of 64 keys or more keep a page per 64-key tile.
            block_n, num_warps, num_stages = 128, 4, 5
        elif num_splits == 1:
            block_n, num_warps, num_stages = 64, 4, 4
    if shape.secure and shape.paged and num_splits == 1 and not shape.fp32 and block_m == 16 and d <= 128:
        # Secure mode reads every page with register page loads (launch.triton_decode.reg_pages) and masks every
        # tile; at one split, tiles of at most one page and 64 keys ran fastest (H200, 2026-11-26, 64x32/8 D128 8k,
        # docs/perf-notes.md v22.4-v22.5): page 16 556 us (16-key tiles, 2 warps, 4 stages) against 833 for the
        # per-key gather; page 64 547 us (64-key tiles) against 618; page 128 521 us (64-key tiles) against 576
        # (128-key tiles). Pages 32 and 256 follow 16 and 128 unmeasured. With splits (B1 64k, page 16) the
        # gather won (94.5 us against 133-237), so it stays there; and only in the measured decode regime (16-row
        # tiles, D <= 128): 64-row tiles at D 256 on two warps spill under a secret guard (the SASS gate)
        block_n = min(shape.page_size, 64, block_n)
        num_warps, num_stages = (2, 4) if block_n <= 32 else (8, 3)
        if shape.page_size < 64 and shape.fp8 and d == 128:
            # v52: 128-key tiles, 4 warps, 3 stages gathering their pages, V by K's offsets, unmasked copies, V's
            # select from loaded tensors as an AND (launch.triton_decode.gather_kv_offsets). CUDA-graph replays
            # interleaved with the fast form on one H200 (2026-11-30, docs/perf-notes.md v52.6-v52.7, 64x32/8 D128
            # 16k, every sequence full): page 16 582.2 us against 726.8 (the 64-key form below; the new select on
            # 64-key tiles 612.7, at 4 stages 606.8, on 8 warps 1001), page 32 560.0 against 700.5; fast 503.7 / 506.2.
            # v53: with its one-compare visibility, page 16 on 2 stages (same runs, 3 stages / 2 stages / fast, us):
            # 576.8 / 541.9 / 515.7 and 579.0 / 545.5 / 517.8; not page 32 (566.8 / 682.4); not with splits, where 2
            # stages ran faster only for splits of 4 tiles or fewer (B1 4k page 16 9.81 / 9.21 / 8.42; B1 64k page 16
            # 47.5 / 54.7) and the counters gate found the SMs' L2 read sectors higher for the inf_pad class at B1 4k
            # (p = 0.00076, docs/security.md §5.20), the class effect of §5.15-§5.16 that 3 stages keep under its line
            # (the appended form, V by its own offsets, not measured: 3)
            block_n, num_warps = 128, 4
            num_stages = 2 if shape.page_size == 16 and not shape.appended else 3
        elif shape.page_size < 64 and (shape.fp8 or shape.page_size == 32):
            # 64-key tiles gathering their 2 or 4 pages (a page index per key, by register loads since v37) instead of a
            # tile per page. CUDA-graph replays on the H200 (2026-11-29, docs/perf-notes.md v46, fast form in the
            # same run): FP8 B64 16k page 16 741.5 us against 972.8 (fast 589.1), page 32 709.6 against 753.0 (fast
            # 596.9); bf16 B64 8k page 32 535.7 against 684.8 (fast 492.8). bf16 page 16 keeps its 16-key tiles
            # (562.2 against 588.7-681.5 for the 32-128-key gathers; fast 497.9)
            block_n, num_warps, num_stages = 64, 4, 3
    if (shape.secure and num_splits == 1 and not (shape.fp32 or shape.fp8) and block_m == 16 and d == 128
            and not shape.appended):
        # V's select from loaded tensors (launch.triton_decode.seen_by_load) takes V's tile to the MMA without a
        # shared-memory round trip, and then smaller tiles on 4 warps ran fastest. Same-run A/B on one H200
        # (2026-11-29, docs/perf-notes.md v47, 64x32/8, every sequence full, secure / fast): contiguous 8k 64-key
        # tiles, 4 warps, 4 stages 0.977 (0.975 on 8 warps, 0.978 with 128 keys on 4 warps and 3 stages; 0.82 on 4
        # warps and 3 stages), 16k 0.971 (the select on scalars 0.93 / 0.92 at 128 keys on 8 warps); page 16 32-key
        # tiles 0.986 (3 stages 1.003, 2 warps 0.993; 16-key tiles 0.92, 64-key 0.86; before 0.89), page 32 0.975
        # (64-key 0.945; before 0.92), page 64 64-key tiles 0.976 (before 0.93)
        block_n = 32 if shape.paged and shape.page_size < 64 else 64
        num_warps, num_stages = 4, 4
    if (shape.secure and num_splits == 1 and not (shape.fp32 or shape.fp8) and block_m == 16 and d == 128
            and not shape.appended and (not shape.paged or shape.page_size % 128 == 0)):
        # The hoisted secure loop (launch.triton_decode.hoisted: tile addresses out of the loop, V's stale rows zeroed
        # by an AND) takes 128-key tiles on 4 warps, 3 stages. Same-run A/Bs on one H200 (2026-11-29,
        # docs/perf-notes.md v48, 64x32/8, every sequence full, secure / fast): 8k contiguous 1.002/1.002/1.001
        # (64-key tiles 0.986/0.980; not hoisted 0.977-0.987), 16k 0.999 (64-key 0.974), page 128 1.010 (64-key
        # 0.989), page 256 1.010 (64-key 0.988)
        block_n, num_warps, num_stages = 128, 4, 3
    if (shape.secure and num_splits > 1 and not shape.fp32 and block_m == 16 and d == 128 and not shape.appended
            and (not shape.paged or shape.page_size % 128 == 0)):
        # With splits (B1-like), the hoisted loop with V's select from loaded tensors (launch.triton_decode.hoisted,
        # seen_per_key) on 128-key tiles, 4 warps, 3 stages. Same-run A/Bs on one H200 (2026-11-29, docs/perf-notes.md
        # v48-v49, 1x32/8, every sequence full, secure / fast): FP8 64k contiguous 0.990 (4 stages 1.012; before
        # 0.80), 4k 1.043 (before 0.97), page 128 0.978 reading each key's position (before 0.85); bf16
        # 64k 1.007 (8 warps 0.969; before 0.98), 4k 1.040 (before 1.01). Not FP8's 4 stages: the counters gate found
        # its L2 read sectors from the SMs higher for the inf_pad class (p <= 4e-6, three runs), an effect every FP8
        # split form shows (the one before v49 too, p = 0.0067) that stayed under the gate's line at 3 stages
        # (docs/security.md §5.16)
        block_n, num_warps, num_stages = 128, 4, 3
    if auto_splits and num_splits > 1 and not shape.secure:
        # v58: every split with work: the split count that the same key tiles per split need (33 splits of 256
        # tiles are 32 of 8 and an empty one, whose programs and partials the combine step still pays for). B1
        # 16k page 16, 32 splits 26.53 us per call against 27.42 at 33 (docs/perf-notes.md v58). Not in secure
        # mode, where the split count is an audited launch (a scalar the launcher specialises by its divisibility)
        tiles = cdiv(shape.capacity, block_n)
        num_splits = cdiv(tiles, cdiv(tiles, num_splits))
    return DecodeConfig(block_m, block_n, num_warps, num_stages, num_splits, reg_pages=reg_pages)


def combine_pdl(device: torch.device) -> bool:
    """Whether the combine step launches as a programmatic dependent of the split step (sm_90+): its launch and
    setup overlap the split step's tail, and it waits in the kernel (``griddepcontrol.wait``) before reading."""
    arch = device_arch(device)
    return arch is not None and arch >= (9, 0)


class DecodePlan:
    """Replayable KV-cache call: ``plan(q, k_cache, v_cache, tensors, out)`` runs append (when new tokens are
    given), the split step and (with several splits) the combine step, and returns ``(out, lse or None)``.
    ``tensors``: a dict of the optional tensor arguments by name (``launch.triton_decode.*_POINTERS``)."""
    __slots__ = ("shape", "config", "append", "split", "combine", "prefill", "out_shape", "lse_shape", "workspace",
                 "page_table_stride", "args", "key_positions")

    def __init__(self, shape: DecodeShape, config: DecodeConfig, q, k_cache, v_cache, k, v, out, page_table,
                 prefill: bool = False, lse=None):
        self.shape, self.config = shape, config
        self.args = None  # the validated arguments (``_checks.KvcacheArgs``) of the call that made the plan
        pts = page_table.stride(0) if page_table is not None else 0
        self.page_table_stride = pts
        # prefill: the Gluon forward kernel with per-sequence key lengths instead of split + combine (plan.prefill)
        self.prefill = prefill_launch(shape, q, k_cache, v_cache, out, lse, pts) if prefill else None
        self.split = self.combine = None
        if not prefill:
            fn, grid, args, cx = build_split(shape, config, q, k_cache, v_cache, out, pts)
            if interpreting():  # Triton's CPU interpreter runs no inline assembly: page indices by plain loads, an
                cx = dict(cx, ASM=False)  # FP8 cache widened by Triton's integer operations
            self.split = KernelStep(fn, grid, (None,) * 15 + tuple(args), 15, cx, config.num_warps,
                                    config.num_stages)
        if config.num_splits > 1 and not prefill:
            pdl = combine_pdl(q.device)
            fn, grid, args, cx = build_combine(shape, config, q, out, pdl=pdl)
            if interpreting():  # masks the CPU interpreter of Triton 3.9 accepts (kernels/triton/combine.py)
                cx = dict(cx, COUNT_MASKS=True)
            self.combine = KernelStep(fn, grid, (None,) * 5 + tuple(args), 5, cx, COMBINE_WARPS, COMBINE_STAGES,
                                      options={"launch_pdl": True} if pdl else None)
        self.append = None
        if shape.appended:
            fn, grid, args, cx = build_append(shape, k, v, k_cache, v_cache, pts)
            self.append = KernelStep(fn, grid, (None,) * 8 + tuple(args), 8, cx, 4, 1)
        self.out_shape = tuple(q.shape)
        total_q = q.shape[0] if shape.packed else shape.batch * shape.seqlen_q
        self.lse_shape = None
        if shape.return_lse:
            self.lse_shape = (shape.num_heads_q, total_q) if shape.packed else (
                shape.batch, shape.num_heads_q, shape.seqlen_q)
        self.workspace = workspace_shapes(shape, config) if not prefill else ()
        self.key_positions = key_positions_needed(shape, config) if not prefill else 0

    @property
    def steps(self) -> tuple:
        main = self.prefill.steps if self.prefill is not None else (self.split, self.combine)
        return tuple(s for s in (self.append, *main) if s is not None)

    def __call__(self, q, k_cache, v_cache, tensors: dict, out=None):
        device = q.device
        if device.type == "cuda" and device.index != torch.cuda.current_device():
            with torch.cuda.device(device):
                return self._run(q, k_cache, v_cache, tensors, out)
        return self._run(q, k_cache, v_cache, tensors, out)

    def _run(self, q, k_cache, v_cache, t: dict, out):
        device = q.device
        if out is None:
            out = torch.empty(self.out_shape, dtype=q.dtype, device=device)
        lse = None if self.lse_shape is None else torch.empty(self.lse_shape, dtype=torch.float32, device=device)
        ws = workspace_views(self.workspace, device) if self.workspace else {}
        dummy = t["cache_seqlens"]

        def get(name):  # an unused pointer gets any tensor
            x = t.get(name)
            return dummy if x is None else x

        if self.append is not None:
            self.append.run((t["k"], t["v"], k_cache, v_cache, dummy, get("page_table"), get("cache_batch_idx"),
                             get("cu_seqlens_q")), device)
        if self.prefill is not None:
            run_prefill(self.prefill, self.shape, q, k_cache, v_cache, out, lse, dummy, device, t.get("page_table"))
            return out, lse
        part_o, part_lse = ws.get("part_o", dummy), ws.get("part_lse", dummy)
        self.split.run((q, k_cache, v_cache, out, lse if lse is not None else dummy, part_o, part_lse, dummy,
                        get("page_table"), get("cache_batch_idx"), get("cache_leftpad"), get("cu_seqlens_q"),
                        get("k_descale"), get("v_descale"),
                        key_positions(self.key_positions, device) if self.key_positions else dummy), device)
        if self.combine is not None:
            self.combine.run((part_o, part_lse, out, lse if lse is not None else dummy, get("cu_seqlens_q")), device)
        if self.shape.packed:  # rows of q past cu_seqlens_q[-1] belong to no sequence: output 0, lse -inf
            clear_unowned_rows(out, lse, t["cu_seqlens_q"], None)
        return out, lse


class BoundDecode:
    """A :class:`DecodePlan` with one step's metadata bound (``cache_seqlens``, page table, batch indices, left pads,
    packed query offsets), its workspace and its stream: :meth:`run` launches the plan on each layer's q, caches and
    descales with the pointer tuples made once (``flashcore.kvcache_step``: transformers' decode step calls the
    same plan once per layer). Made only for eager calls on a GPU (``runtime.keeps_buffers``); the caller checks that
    every tensor has the planned facts and that the stream, thread and device are the bound ones.

    Without a launch hook the pointers go to Triton's launcher as integers: for a tensor it calls ``data_ptr`` and
    asks the driver whether the address is device memory (``cuPointerGetAttribute``), ~15 times per split launch;
    the planned facts already say each tensor lies on the plan's device. The bound tensors stay referenced here."""
    __slots__ = ("plan", "stream", "thread", "device", "dummy", "split_fixed", "combine_fixed", "append_fixed",
                 "keypos", "ints", "metadata")

    def __init__(self, plan: DecodePlan, t: dict, device: torch.device):
        self.plan, self.device = plan, device
        self.stream, self.thread = current_stream(device), threading.get_ident()
        dummy = self.dummy = t["cache_seqlens"]

        def get(name):
            x = t.get(name)
            return dummy if x is None else x

        ws = workspace_views(plan.workspace, device) if plan.workspace else {}
        part_o, part_lse = ws.get("part_o", dummy), ws.get("part_lse", dummy)
        self.keypos = key_positions(plan.key_positions, device) if plan.key_positions else dummy
        # the split step's pointers: (q, k_cache, v_cache, out, lse) per run, these, (k_descale, v_descale) per run,
        # the key positions; the combine step's: these, (out, lse) per run, cu_seqlens_q; the append step's: (k, v,
        # k_cache, v_cache) per run, these
        self.split_fixed = (part_o, part_lse, dummy, get("page_table"), get("cache_batch_idx"), get("cache_leftpad"),
                            get("cu_seqlens_q"))
        self.combine_fixed = (part_o, part_lse)
        self.append_fixed = (dummy, get("page_table"), get("cache_batch_idx"), get("cu_seqlens_q"))
        self.ints = tuple(tuple(x.data_ptr() for x in group) for group in (
            self.split_fixed, self.combine_fixed, self.append_fixed, (dummy, self.keypos)))
        # the metadata tensors' memory and layout as bound (resize_/set_ in place would move them under the
        # pointers above)
        self.metadata = tuple((x, x.data_ptr(), x.shape, x.stride()) for x in (t.get(n) for n in (
            "cache_seqlens", "page_table", "cache_batch_idx", "cache_leftpad", "cu_seqlens_q")) if x is not None)

    def metadata_in_place(self) -> bool:
        """Whether every bound metadata tensor still has the memory, shape and strides it was bound with."""
        return all(x.data_ptr() == p and x.shape == s and x.stride() == st for x, p, s, st in self.metadata)

    def ready(self) -> bool:
        """Whether every step has its compiled kernel (a first :class:`DecodePlan` call compiles and keeps them)."""
        p = self.plan
        return (p.prefill is None and not p.shape.packed and p.split.compiled is not None
                and (p.combine is None or p.combine.compiled is not None)
                and (p.append is None or p.append.compiled is not None))

    def run(self, q, k_cache, v_cache, k, v, k_descale, v_descale, out, hooks: bool):
        p = self.plan
        device = self.device
        if out is None:
            out = torch.empty(p.out_shape, dtype=q.dtype, device=device)
        lse = None if p.lse_shape is None else torch.empty(p.lse_shape, dtype=torch.float32, device=device)
        stream = self.stream
        if hooks:  # tensors, for the hooks' launch metadata
            split_fixed, combine_fixed, append_fixed = self.split_fixed, self.combine_fixed, self.append_fixed
            dummy, keypos = self.dummy, self.keypos
            tensors = (q, k_cache, v_cache, out, lse, k, v, k_descale, v_descale)
        else:
            split_fixed, combine_fixed, append_fixed, (dummy, keypos) = self.ints
            tensors = tuple(x if x is None else x.data_ptr()
                            for x in (q, k_cache, v_cache, out, lse, k, v, k_descale, v_descale))
        q_, kc_, vc_, out_, lse_, k_, v_, kd_, vd_ = tensors
        lse_ = dummy if lse_ is None else lse_
        if p.append is not None:
            p.append.launch((k_, v_, kc_, vc_, *append_fixed), stream, hooks)
        p.split.launch((q_, kc_, vc_, out_, lse_, *split_fixed, dummy if kd_ is None else kd_,
                        dummy if vd_ is None else vd_, keypos), stream, hooks)
        if p.combine is not None:
            p.combine.launch((*combine_fixed, out_, lse_, split_fixed[6]), stream, hooks)
        return out, lse


_WORKSPACES = PlanCache(limit=16)  # (workspace shapes, device index, raw stream, thread) -> {name: float32 view}


def workspace_views(shapes: tuple, device: torch.device) -> dict:
    """The split step's float32 workspace, as ``{name: view}`` for ``shapes`` (``((name, shape), ...)``). Eager calls
    reuse one buffer and its views per (shapes, device, stream, thread): the split and combine steps of one call run
    in stream order before the next call's, and calls from two threads on one stream would interleave, so each thread
    has its own (an allocation is ~7 us of a decode call's host time, measured on the H200's host; splitting it into
    views ~5 us more on this CPU). Under graph capture, tracing, or inside a compiled graph's op
    (``runtime.keeps_buffers``) a fresh buffer, which the graph's memory pool keeps for the graph alone."""
    def make():
        sizes = [math.prod(s) for _, s in shapes]
        flat = torch.empty(sum(sizes), dtype=torch.float32, device=device)
        return {name: part.view(s) for (name, s), part in zip(shapes, flat.split(sizes))}

    if not keeps_buffers(device):  # CPU, capture, tracing, or a compiled graph's op (its pool must not keep it)
        return make()
    return _WORKSPACES.get_or_build((shapes, device.index, current_stream(device), threading.get_ident()), make)


_KEY_POSITIONS: dict = {}  # device -> int32 table, KEY_POS[j] = j
# every table ever made, never freed: a CUDA graph captured with a table keeps reading it after a longer one replaced
# it, and a kernel on another stream may still be reading it (at most about twice the longest table per device)
_KEY_POSITIONS_KEPT: list = []
_KEY_POSITIONS_LOCK = threading.Lock()


def key_positions(n: int, device: torch.device) -> torch.Tensor:
    """The public table ``KEY_POS[j] = j`` (int32, at least ``n`` entries) the secure split kernel reads its key
    positions from (``kernels.triton.decode._v_rows_seen``). One per device, grown by powers of two, made on the
    calling stream, which is then synchronised once so that a call on any other stream reads it filled; a table it
    replaces stays allocated (``_KEY_POSITIONS_KEPT``: graphs captured with it read its address). Under graph capture,
    when the device's table is too short, a fresh one that the graph fills itself (an arange node before the kernel),
    kept as well; inside a compiled graph's op (``runtime.inside_compiled_graph``) a fresh one, not kept: the compiled
    graph's CUDA-graph pool holds it for that graph and refuses allocations that outlive the op."""
    t = _KEY_POSITIONS.get(device)
    if t is not None and t.numel() >= n:
        return t
    size = 1 << max(12, (n - 1).bit_length())
    if device.type != "cuda" or torch.compiler.is_compiling() or in_compiled_graph():
        # (a compiled graph's op: its CUDA graphs' pool holds the table for the graph, and must not see it kept)
        return torch.arange(size, dtype=torch.int32, device=device)
    if capturing(device):  # kept too, so the graph's pool never hands its memory to a later allocation
        t = torch.arange(size, dtype=torch.int32, device=device)
        _KEY_POSITIONS_KEPT.append(t)
        return t
    with _KEY_POSITIONS_LOCK:
        t = _KEY_POSITIONS.get(device)
        if t is None or t.numel() < n:
            t = torch.arange(size, dtype=torch.int32, device=device)
            torch.cuda.current_stream(device).synchronize()
            _KEY_POSITIONS_KEPT.append(t)
            _KEY_POSITIONS[device] = t
    return t


def plan_kvcache(a, q, k_cache, v_cache, k, v, page_table, cache_batch_idx, cache_leftpad, out,
                 config: DecodeConfig | None = None) -> DecodePlan:
    """The plan of a validated call (``a``: ``_checks.KvcacheArgs``). ``config`` (sweeps) replaces
    :func:`choose_config`'s."""
    shape = DecodeShape(
        batch=a.batch, seqlen_q=a.seqlen_q, num_heads_q=a.num_heads_q, num_heads_kv=a.num_heads_kv,
        head_dim=a.head_dim, page_size=a.page_size, capacity=a.capacity, num_pages=k_cache.shape[0],
        paged=a.paged, packed=a.packed, appended=a.append, has_batch_idx=cache_batch_idx is not None,
        has_leftpad=cache_leftpad is not None, causal=a.causal, secure=a.secure, fp8=a.fp8,
        return_lse=a.return_lse, fp32=q.dtype == torch.float32, scale=a.scale)
    cfg = config or choose_config(shape, a.num_splits, q.device)
    o = out if out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    prefill = config is None and prefill_serves(shape, a.num_splits, q, k_cache, v_cache, out)
    lse = torch.empty((shape.batch, shape.num_heads_q, shape.seqlen_q), dtype=torch.float32,
                      device=q.device) if prefill and shape.return_lse else None
    plan = DecodePlan(shape, cfg, q, k_cache, v_cache, k, v, o, page_table, prefill=prefill, lse=lse)
    plan.args = a
    return plan


__all__ = ["BoundDecode", "DecodePlan", "choose_config", "lengths_tensor", "plan_kvcache", "query_tiles"]


# --- dense calls with a short query -------------------------------------------------------------------------

SHORT_QUERY = 16  # queries per sequence up to which a dense call may run on the decode kernel
LONG_KEYS = 1024  # ... when it has at least this many keys (and 64 per query): measured on H100, 2026-11-25,
# the forward kernel reached 0.15-0.5x of SDPA there, the decode kernel 1.0x (docs/perf-notes.md)


def decode_serves(seqlen_q: int, seqlen_k: int, secure: bool) -> bool:
    """Whether a dense call runs on the decode kernel (public shapes only)."""
    return not secure and seqlen_q <= SHORT_QUERY and seqlen_k >= max(LONG_KEYS, 64 * seqlen_q)


class DecodeSelection:
    """What :func:`flashcore.plan_attention` reports for a dense call served by the decode kernel."""
    kernel = "triton_decode"

    def __init__(self, config: DecodeConfig):
        self.config = config
        self.rejected = (("triton_fwd", f"a short query (<= {SHORT_QUERY}) against >= {LONG_KEYS} keys reads K/V "
                                        "once per K/V head on the split-KV decode kernel"),)

    def explain(self) -> str:
        c = self.config
        return (f"triton_decode block_m={c.block_m} block_n={c.block_n} warps={c.num_warps} stages={c.num_stages} "
                f"splits={c.num_splits} (not {self.rejected[0][0]}: {self.rejected[0][1]})")


_LENGTHS = PlanCache(limit=64)  # (value, batch, device index, raw stream) -> int32 [batch] tensor, made on that stream


def lengths_tensor(value: int, batch: int, device: torch.device, *, secure: bool) -> torch.Tensor:
    """``cache_seqlens`` given as an int, as the int32 ``[batch]`` tensor the kernels read. Eager calls share one
    per (value, batch, device, stream): transformers passes the same int to every layer of a decode step, and a
    fill is a kernel launch. None is shared under graph capture (a fill made there runs only at replay), none
    across streams (the fill is ordered on its own stream only), and none in secure mode (a hit or
    a miss would make host time depend on the secret length), under tracing, or inside a compiled graph's op
    (``runtime.keeps_buffers``). Nor is a kept one handed to a call being captured: the graph would hold no reference
    to it, and once evicted its memory could be reused."""
    if secure is not False or not keeps_buffers(device):
        return torch.full((batch,), value, dtype=torch.int32, device=device)
    key = (value, batch, device.index, current_stream(device))
    return _LENGTHS.get_or_build(key, lambda: torch.full((batch,), value, dtype=torch.int32, device=device))


class DenseDecodePlan:
    """A dense :func:`flashcore.attention` call run as KV-cache attention: K/V are a full contiguous cache
    (every sequence's length is Sk: :func:`lengths_tensor`'s, per call, so a plan first made under CUDA-graph capture
    or inside a compiled graph never hands later calls a tensor that only a replay fills), causal stays bottom-right.
    Replayed like :class:`~flashcore.plan.build.Plan`: ``plan(q, k, v, out=...)`` returns ``(out, lse or None)``."""
    __slots__ = ("problem", "selection", "decode", "seqlen_k", "batch", "bshd")

    def __init__(self, problem, decode: DecodePlan, seqlen_k: int, batch: int, bshd: bool):
        self.problem, self.decode, self.seqlen_k, self.batch, self.bshd = problem, decode, seqlen_k, batch, bshd
        self.selection = DecodeSelection(decode.config)

    @property
    def steps(self) -> tuple:
        return self.decode.steps

    @property
    def workspace(self) -> tuple:
        return self.decode.workspace

    def __call__(self, q, k, v, seqlens_q=None, seqlens_k=None, out=None, cu_seqlens_q=None, cu_seqlens_k=None):
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        view = (lambda t: t) if self.bshd else (lambda t: t.transpose(1, 2))  # noqa: E731  [B, S, H, D] views
        lens = lengths_tensor(self.seqlen_k, self.batch, q.device, secure=False)
        _, lse = self.decode(view(q), view(k), view(v), {"cache_seqlens": lens}, view(out))
        return out, lse


def dense_decode_plan(problem, q, k, v, out, *, causal: bool, scale: float, return_lse: bool, bshd: bool):
    """The decode plan of a dense call (q/k/v/out in the caller's layout)."""
    view = (lambda t: t) if bshd else (lambda t: t.transpose(1, 2))  # noqa: E731
    qd, kd, od = view(q), view(k), view(out)
    B, Sq, Hq, D = qd.shape
    Sk, Hkv = kd.shape[1], kd.shape[2]
    shape = DecodeShape(batch=B, seqlen_q=Sq, num_heads_q=Hq, num_heads_kv=Hkv, head_dim=D, page_size=Sk,
                        capacity=Sk, num_pages=B, paged=False, packed=False, appended=False, has_batch_idx=False,
                        has_leftpad=False, causal=causal, secure=False, fp8=False, return_lse=return_lse,
                        fp32=q.dtype == torch.float32, scale=scale)
    cfg = choose_config(shape, 0, q.device)
    return DenseDecodePlan(problem, DecodePlan(shape, cfg, qd, kd, view(v), None, None, od, None), Sk, B, bshd)
