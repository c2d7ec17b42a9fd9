"""Launch builder of the sm_90 warp-specialised Gluon forward kernel (``kernels/sm90/fwd.py``).

Descriptors are rebuilt from the call's pointers (they hold the base pointer); everything else is planned
once per plan key. The kernel's switches (``flashcore.plan.knobs.GluonSwitches``) are read when the launch
is planned, and are part of the plan key."""
from __future__ import annotations

import torch
from triton.experimental.gluon import language as gl

from .._checks import SECURE_PAGE_SIZES
from ..kernels.secure.prepass import W_ROWS
from ..kernels.sm90.fwd import attn_fwd_hopper_kernel
from ..kernels.sm90.trace import TRACE_SLOTS
from ..kernels.triton.fwd import LOG2E
from ..plan.knobs import GluonSwitches, gluon_switches
from .secure_prepass import key_weights_shape
from ..plan.tables import gluon_config_error, secure_prepass_pdl, v_stages
from ..runtime import KernelStep, cdiv, current_stream, keeps_buffers, launch_hooks_active, sm_count
from ..runtime.tma import EncodedDescriptors, make_descriptors, unwrap_tensordesc_launcher

# Register budgets per partition (setmaxnreg): the loader needs almost nothing, the consumers get
# the rest. 12 warps x MAXNREG must fit the 64K-register file.
LOADER_REGS = 24
# A paged cache's loader (page indices per key tile, one copy per page) spills at 24; 32 fits beside three consumer
# warpgroups (3 x 128 x 160 + 128 x 32 = 65536; beside two it gets 48: LOADER_REGS_PAGED_2WG below), not beside one
# (two programs per SM), which the prefill route never plans
LOADER_REGS_PAGED = 32
# Secure mode with key lengths: the loader is a warpgroup that also clears V's rows past the key length in every tile
# (16-row chunks: 8 registers of data per thread); the same budget as a paged loader's
LOADER_REGS_SECURE_KEY_LENS = 32
# A paged cache's loader beside two consumer warpgroups (each tile's page indices and the next tile's; in secure mode
# also the clearing's 8 data registers): 48, the consumers 232 (2 x 128 x 232 + 128 x 48 = 65536). The loader spills
# less (sm_90a SASS, D 128 causal page 16: secure 15 STL / 25 LDL against 27 / 39 at 32, fast 13 / 21 against 23 / 31),
# and chunked prefill runs faster (H200, CUDA-graph replays, two interleaved rounds each, 4x32/8 heads, Sq 512 against
# 8k, D 128 causal; perf-notes v32): secure page 16 707 against 719-723 us, page 64 606-610 against 632-636; fast page
# 16 477.5-478.0 against 484.8-484.9 (contiguous, not affected: 441-446 either way). Three consumer warpgroups leave no
# room: they keep 160 and 32
LOADER_REGS_PAGED_2WG = 48
CONSUMER_REGS_PAGED_2WG = 232
# Secure mode's V padding written by the loader warpgroup (``sanitise``; kernels/sm90/secure_pad.py): the column
# pattern stays in registers through an item, beside a group of 16 words per thread; per consumer-warpgroup count
# (1: the consumer takes 256 - 64 = 192; 2: the consumers get 232, as beside a paged loader)
LOADER_REGS_SANITISE = {1: 64, 2: 48, 3: 32}
CONSUMER_REGS = 240
MAXNREG = 168
# Three consumer warpgroups (16 warps with the padded loader group): 3 x 128 x 160 + 128 x 24 fits.
CONSUMER_REGS_3WG = 160
MAXNREG_3WG = 128
# One consumer warpgroup (8 warps with the padded loader group) at 128 registers: two programs fit an
# SM's 64K registers; the loader gives 104 of its 128 back, which the consumer takes (128 + 104 = 232).
CONSUMER_REGS_1WG = 232
MAXNREG_1WG = 128
# consumer warpgroups -> (worker consumer registers, launch register cap); programs resident per SM
REGISTERS = {1: (CONSUMER_REGS_1WG, MAXNREG_1WG), 2: (CONSUMER_REGS, MAXNREG), 3: (CONSUMER_REGS_3WG, MAXNREG_3WG)}
PROGRAMS_PER_SM = {1: 2, 2: 1, 3: 1}
DESC_ARGS = 5  # the kernel's descriptor arguments: q, k, v, o and the key weights (None where unused)
PER_CALL_ARGS = DESC_ARGS + 4  # and the pointers: lse, the lengths, the page table, the key lengths (None where unused)
ENCODED_SETS = 16  # encoded descriptor sets kept per plan



def follows_prepass_pdl(secure: bool, key_lens: bool, sanitise: bool, work: int,
                        switches: GluonSwitches | None = None) -> bool:
    """Whether the secure Gluon kernel launches as a programmatic dependent of the pre-pass just before it (K/V with
    key weights, non-causal; V, causal; the row fill of V, secure="strict" causal): the K/V pre-passes let it launch
    as they start (their PDL_TRIGGER; the row fill as it completes), so the kernel's launch, set-up and first Q copy
    overlap the pre-pass, and its loader waits for the pre-pass's grid before the first K/V copy. Where the
    ``secure_pdl`` switch says ("auto": ``plan.tables.secure_prepass_pdl`` by ``work`` = B*Hq*Sq*Sk); never where no
    pre-pass comes first (the in-kernel padding, key lengths)."""
    mode = (switches if switches is not None else gluon_switches()).secure_pdl
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"the secure_pdl switch takes 'auto', 'on' or 'off', got {mode!r}")
    if not secure or key_lens or sanitise:
        return False
    return mode == "on" or (mode == "auto" and secure_prepass_pdl(work))


class GluonLaunch:
    """A planned launch of :func:`attn_fwd_hopper_kernel`; ``run`` takes (q, k, v, o, lse, ...)
    in [B, H, S, D] views with the planned shapes/strides and builds the TMA descriptors of q, k, v and o (and of
    the key weights, ``[B, 8, w_len]``, where the plan has them: the secure pre-pass's, non-causal).

    Host cost: the descriptors depend on the plan (fixed) and the four data pointers, so once the
    kernel is compiled the encoded descriptors are kept per pointer set (``ENCODED_SETS`` of them, the
    oldest dropped first) and the launch goes straight to Triton's compiled launcher. A pointer set
    seen before costs a dict lookup instead of four descriptor encodings."""
    __slots__ = ("step", "geom", "fast", "encoded", "key_weights_shape", "ones", "trace_slots", "switches")

    def __init__(self, q, k, v, o, lse, *, scale: float, causal: bool, seqlen_q: int, seqlen_k: int,
                 batch: int, num_heads_q: int, num_heads_kv: int, lse_strides, cfg, secure: bool = False,
                 sum_mma: bool | None = None, switches: GluonSwitches | None = None, key_lens: bool = False,
                 page_size: int = 0, table_stride: int = 0, sanitise: bool = False, secret_diag: bool = False,
                 pdl_wait: bool = False, v_prepass: bool = False):
        """``secret_diag``: secure causal attention whose diagonal is secret (explicit query lengths, or Sq != Sk):
        every key tile visited, each masked by select with both secret lengths (the kernel's SECRET_DIAG; its
        schedule and trip counts the non-causal ones). ``pdl_wait``: launched as a programmatic dependent of the
        secure pre-pass before it (``launch_pdl``; :func:`follows_prepass_pdl`), the kernel's PDL_WAIT. ``v_prepass``
        (secure, ``key_lens``): ``v`` is the V pre-pass's contiguous copy of the cache ``[B, Hkv, capacity, D]`` (also
        where ``k`` is a paged cache), its rows past each key length already clean, so the loader is a warp that only
        copies (the kernel's V_PREPASS; ``plan.prefill``)."""
        sw = self.switches = switches if switches is not None else gluon_switches()
        D = q.shape[-1]
        err = gluon_config_error(cfg, D)
        if err is not None:
            raise ValueError(err)
        v_depth = v_stages(cfg.num_stages, cfg.block_m, cfg.block_n, D)
        num_wg = cfg.block_m // 64
        # secure mode's V padding written in the kernel (no pre-pass), and the secret diagonal: dense secure causal
        # forms only
        for name, what, on in (("sanitise", "secure mode's V padding written in the kernel", sanitise),
                               ("secret_diag", "causal with a secret diagonal", secret_diag)):
            if on and (not secure or not causal or key_lens or page_size):
                raise ValueError(f"{name} ({what}) takes secure=True, causal=True and a dense problem (no key_lens, "
                                 f"no page_size) only (got secure={secure}, causal={causal}, key_lens={key_lens}, "
                                 f"page_size={page_size})")
        if v_prepass and (not secure or not key_lens):
            raise ValueError(f"v_prepass (V cleaned by the V pre-pass) takes secure=True and key_lens=True only (got "
                             f"secure={secure}, key_lens={key_lens})")
        # the schedule's causality: a secret diagonal visits every key tile, as non-causal attention does
        sched_causal = bool(causal) and not secret_diag

        gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
        bm, bn = 64, cfg.block_n
        lay_m = gl.NVMMASharedLayout.get_default_for([1, 1, bm, D], gdt)
        lay_n = gl.NVMMASharedLayout.get_default_for([1, 1, bn, D], gdt)
        # a paged cache (k, v: [num_pages, Hkv, page_size, D] views): a box of one page, or of one tile of a larger
        # page, in the tile's layout (the kernel copies each page into its rows of a whole-tile slot)
        if page_size and (not key_lens or page_size % 8 or page_size & (page_size - 1) or num_wg < 2):
            raise ValueError(f"a paged cache runs the Gluon kernel with per-sequence key lengths (key_lens), two or "
                             f"three consumer warpgroups and a power-of-two page size of at least 8 only (got "
                             f"page_size={page_size}, {num_wg} consumer warpgroups)")
        # (secure paged: the page sizes secure mode takes, each a binary of its own that the static gate lists; page 8,
        # which the fast form takes, is not one: its loader's 16 copies per key tile keep TMA operands in uniform
        # registers behind guards held in predicate words, which the gate cannot follow: 5-9 findings per form, 2026-11-27)
        if key_lens and secure and (num_wg < 2 or (page_size and page_size not in SECURE_PAGE_SIZES)):
            sizes = ", ".join(map(str, SECURE_PAGE_SIZES))
            raise ValueError(f"secure mode with per-sequence key lengths (key_lens) runs two or three consumer "
                             f"warpgroups and a contiguous cache or a page size of {sizes} only (got "
                             f"page_size={page_size}, {num_wg} consumer warpgroups)")
        kv_rows = min(page_size, bn) if page_size else bn
        v_rows = bn if v_prepass else kv_rows  # (v_prepass: V is the pre-pass's contiguous copy, paged cache or not)
        self.geom = tuple((list(t.shape), list(t.stride()), [1, 1, rows, D], lay)
                          for t, rows, lay in ((q, bm, lay_m), (k, kv_rows, lay_n), (v, v_rows, lay_n),
                                               (o, bm, lay_m)))
        # the row sums by MMA against key weights: the secure pre-pass's (non-causal: no key mask), or
        # where asked for on the fast path, all ones (masked probabilities are zero there)
        if sum_mma is None:
            sum_mma = (secure and not causal and not key_lens) or (not secure and sw.fast_sum_mma)
        sum_mma = bool(sum_mma) and not page_size  # (the row sums by MMA read key weights per tile, not per page)
        self.key_weights_shape, self.ones = None, None
        if sum_mma:
            ws = key_weights_shape(batch, seqlen_k)
            lay_w = gl.NVMMASharedLayout.get_default_for([1, W_ROWS, bn], gdt)
            self.geom += ((list(ws), [ws[1] * ws[2], ws[2], 1], [1, W_ROWS, bn], lay_w), )
            self.key_weights_shape = ws
        num_m_tiles = cdiv(seqlen_q, cfg.block_m)
        num_tiles = num_m_tiles * batch * num_heads_q
        # Persistent: one program per SM (one fits per SM) loops over scheduling units. Non-causal, a
        # unit is one work item (all cost the same). Causal items range from 1 to n key tiles, and a
        # static round-robin over them left SMs idle (4x32x4096x128: 1067 vs 1004 us non-persistent),
        # so a causal unit pairs a heavy row tile with its light mirror (causal_pairs); without
        # pairing each causal item is its own program and the hardware balances them.
        # (one row tile per head has nothing to pair with; Triton also specialises num_m_tiles == 1 to a
        # constant, which folds the pairing arithmetic into a branch its lowering rejects)
        paired = sched_causal and sw.causal_pairs and num_m_tiles > 1
        units = batch * num_heads_q * -(-num_m_tiles // 2) if paired else num_tiles
        grid = (num_tiles if sched_causal and not paired else min(units, PROGRAMS_PER_SM[num_wg] * sm_count(q.device)),
                1)
        dummy = lse if lse is not None else q  # the lengths pointer is read only in secure mode
        w = torch.empty(self.key_weights_shape, dtype=q.dtype) if self.key_weights_shape else None
        # the page table is a per-call pointer (None when not paged: a constexpr, as table_stride then)
        table = torch.empty(1, dtype=torch.int32) if page_size else None
        key_lengths = dummy if sanitise or secret_diag else None
        args = [*self.descriptors(q, k, v, o, w), dummy, dummy, table, key_lengths, scale * LOG2E, seqlen_q, seqlen_k,
                num_heads_q, num_heads_q // num_heads_kv, *lse_strides, num_m_tiles, units,
                table_stride if page_size else None]
        constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, K_STAGES=cfg.num_stages,
                          V_STAGES=v_depth, CAUSAL=sched_causal,
                          RETURN_LSE=lse is not None, NUM_WG=num_wg, PAIRED=paired)
        consumer_regs, maxnreg = REGISTERS[num_wg]
        loader_regs = LOADER_REGS_PAGED if page_size else LOADER_REGS
        if key_lens and secure and not v_prepass:
            loader_regs = LOADER_REGS_SECURE_KEY_LENS
        if page_size and num_wg == 2:
            consumer_regs, loader_regs = CONSUMER_REGS_PAGED_2WG, LOADER_REGS_PAGED_2WG
        if sanitise:
            loader_regs = LOADER_REGS_SANITISE[num_wg]
            if num_wg == 2:
                consumer_regs = CONSUMER_REGS_PAGED_2WG
        constexprs.update(SECURE=bool(secure), SUM_MMA=sum_mma, CONSUMER_WG_REGS=consumer_regs,
                          LOADER_WG_REGS=loader_regs,
                          TRACE=bool(sw.trace) and not secure and not key_lens,
                          EARLY_LOADS=bool(sw.early_loads) and not secure,
                          STAGGER=0 if secure or D != 64 else int(sw.stagger), KEY_LENS=bool(key_lens),
                          PAGE_SIZE=int(page_size), SANITISE=bool(sanitise), SECRET_DIAG=bool(secret_diag))
        options = dict(maxnreg=maxnreg)
        if pdl_wait:
            if not secure or key_lens or sanitise:
                raise ValueError("pdl_wait (launched as the dependent of a secure pre-pass) takes secure=True without "
                                 f"key_lens or sanitise (got secure={secure}, key_lens={key_lens}, sanitise={sanitise})")
            options["launch_pdl"] = True
        constexprs["PDL_WAIT"] = bool(pdl_wait)
        constexprs["V_PREPASS"] = bool(v_prepass)
        self.step = KernelStep(attn_fwd_hopper_kernel, grid, args, PER_CALL_ARGS, constexprs, cfg.num_warps, 1,
                               options=options)
        self.trace_slots = grid[0] * num_wg * TRACE_SLOTS if constexprs["TRACE"] else 0
        self.fast = None  # a runtime.tma.RawLauncher once compiled; False: not available
        self.encoded = EncodedDescriptors(ENCODED_SETS)

    def descriptors(self, q, k, v, o, w=None):
        """The kernel's five descriptor arguments for these tensors (``w_desc`` None where the plan has no
        key weights)."""
        return make_descriptors((q, k, v, o, w), self.geom, DESC_ARGS)

    def run(self, ptrs, device, key_weights=None, page_table=None) -> None:
        """``ptrs``: q, k, v, o, lse, seqlens_q (with ``key_lens``: the int32 key lengths), seqlens_k, ... (unused
        ones: any tensor; seqlens_k is read with ``sanitise`` or ``secret_diag`` only); ``key_weights``: the
        pre-pass's, where the plan has them (secure, non-causal); ``page_table``: the int32 page table of a
        paged plan (its rows ``table_stride`` apart, as planned)."""
        q, k, v, o, lse, sq = ptrs[:6]
        sk = ptrs[6] if self.step.constexprs["SANITISE"] or self.step.constexprs["SECRET_DIAG"] else None
        pt = page_table if self.step.constexprs["PAGE_SIZE"] else None
        if self.step.constexprs["PAGE_SIZE"] and page_table is None:
            raise ValueError("a paged Gluon launch needs its page table (page_table=)")
        if self.trace_slots:
            self._check_trace(q, sq)
        w = key_weights
        if w is None and self.key_weights_shape is not None:
            if self.step.constexprs["SECURE"]:
                raise ValueError("the secure Gluon launch needs the pre-pass's key weights (key_weights=)")
            w = self.ones
            if w is None or w.device != q.device:
                w = torch.ones(self.key_weights_shape, dtype=q.dtype, device=q.device)
                if keeps_buffers(q.device):  # not under capture, tracing or a compiled graph's op (its pool)
                    self.ones = w
        fast, step = self.fast, self.step
        # Triton's own path: until compiled, where its launcher has another shape, and whenever a
        # profiler's hooks want their launch metadata
        if not fast or launch_hooks_active():
            step.run((*self.descriptors(q, k, v, o, w), lse, sq, pt, sk), device)
            if fast is None and step.compiled is not None:
                self.fast = unwrap_tensordesc_launcher(step.compiled, DESC_ARGS) or False
            return
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), w.data_ptr() if w is not None else 0)
        enc = self.encoded.get(key, lambda: fast.encode(self.descriptors(q, k, v, o, w), DESC_ARGS))
        fast(step.grid, current_stream(device), step.compiled, (*enc, lse, sq, pt, sk, *step.scalars, *step.tail))

    def _check_trace(self, q, trace) -> None:
        """A traced launch writes TRACE_SLOTS int64 per consumer warpgroup through the lengths argument: refuse
        anything else there (a dummy tensor would be overwritten)."""
        if not (isinstance(trace, torch.Tensor) and trace.dtype == torch.int64 and trace.is_contiguous()
                and trace.numel() >= self.trace_slots and trace.device == q.device):
            raise ValueError(f"a traced Gluon launch takes its trace buffer (int64, contiguous, >= {self.trace_slots} "
                             f"elements, on {q.device}) in place of the lengths argument; see "
                             f"`flashcore bench timeline`")
