"""Secure KV-cache decode: V's rows outside each sequence's secret range zeroed by a select built from loaded tensors
(``seen_by_load``: key positions from a public table, lengths read as tensors; the select stays in the MMA operand's
layout) against the select on a range and scalars (V's tile written back to shared memory and read again, a round trip
per tile), beside the fast path, at every sequence's full length (docs/perf-notes.md v47): the planner's secure form,
its configuration with the other select, and extra configurations of either (``CASES``' last field).

v48: the form ``secure:hoisted`` (the planner's secure configuration with the key loop hoisted,
``launch.triton_decode.hoisted``) and a fifth field of the extra configurations (True: hoisted); the checks also
compare the planner's secure form hoisted and not, bit for bit (docs/perf-notes.md v48). v49: a sixth field (True:
``seen_per_key``, each key's position read every tile); the checks also run the planner's secure form hoisted with
V's select from loaded tensors reading each key's position, bit for bit against the others.

Each case is first checked at two sequences and at most 4096 keys, with random lengths and NaN in every stale slot:
the fast path and both secure selects against the float64 reference (outputs poisoned with NaN first), the two secure
selects bit for bit. Then timed as the decode bench times (cold L2, ``bench.timing.Timer``), the forms interleaved over
``--rounds`` rounds, median per form.

    python -m flashcore.bench.experiments.secure_v_seen --out $OUT [--only 0,2] [--rounds 3]
"""
from __future__ import annotations

import dataclasses

import torch
import triton

from ...launch.triton_decode import hoisted as hoisted_flag, seen_by_load, seen_per_key
from . import add_ab_arguments, cold_l2_rounds, parser, picked, write_rows
from .kv_configs import _make, _planned

# (B, Hq, Hkv, D, capacity, Sq, page: 0 contiguous, fp8, extra configurations as (select: "load" or "scalars",
# block_n, num_warps, num_stages) beside the planner's own, its split count kept)
CASES = (
    (64, 32, 8, 128, 16384, 1, 0, True, (("load", 64, 4, 4), ("load", 64, 4, 3))),
    (64, 32, 8, 128, 16384, 1, 16, True, (("load", 128, 4, 3),)),
    (64, 32, 8, 128, 8192, 1, 0, False, (("scalars", 128, 8, 3), ("load", 128, 4, 3))),
    (64, 32, 8, 128, 16384, 1, 0, False, (("scalars", 128, 8, 3),)),
    (64, 32, 8, 128, 8192, 1, 16, False, (("scalars", 16, 2, 4), ("load", 32, 4, 3), ("load", 32, 2, 4))),
    (64, 32, 8, 128, 8192, 1, 32, False, (("scalars", 64, 4, 3),)),
    (64, 32, 8, 128, 8192, 1, 64, False, (("scalars", 64, 8, 3),)),
    (64, 32, 8, 128, 8192, 1, 128, False, (("scalars", 64, 8, 3), ("load", 128, 4, 4))),
    (64, 32, 8, 128, 8192, 1, 256, False, (("scalars", 64, 8, 3),)),
    (1, 32, 8, 128, 65536, 1, 0, False, (("load", 128, 8, 3),)),
    (1, 32, 8, 128, 4096, 1, 0, False, ()),
    # v48: the secure loop's addressing hoisted (a fifth field True: hoisted=True), beside the v47 forms above
    (64, 32, 8, 128, 16384, 1, 0, True, (("load", 128, 4, 3, True), ("load", 64, 4, 4, True), ("load", 64, 4, 3, True),
                                         ("load", 128, 8, 3, True))),
    (64, 32, 8, 128, 8192, 1, 0, False, (("load", 64, 4, 4, True), ("load", 128, 4, 3, True))),
    (64, 32, 8, 128, 16384, 1, 0, False, (("load", 64, 4, 4, True),)),
    (64, 32, 8, 128, 8192, 1, 64, False, (("load", 64, 4, 4, True),)),
    (64, 32, 8, 128, 8192, 1, 128, False, (("load", 64, 4, 4, True), ("load", 128, 4, 4, True))),
    (64, 32, 8, 128, 8192, 1, 256, False, (("load", 64, 4, 4, True),)),
    (1, 32, 8, 128, 65536, 1, 0, False, (("scalars", 128, 8, 3, True),)),
    (1, 32, 8, 128, 65536, 1, 0, True, (("scalars", 128, 4, 3, True),)),
    # v48, second run: the planner's secure form hoisted (the form secure:hoisted) and more tiles
    (64, 32, 8, 128, 16384, 1, 0, True, (("load", 64, 4, 4, True), ("load", 64, 4, 5, True), ("load", 64, 8, 4, True))),
    (64, 32, 8, 128, 8192, 1, 0, False, (("load", 128, 4, 3, True),)),
    (64, 32, 8, 128, 8192, 1, 128, False, ()),
    (1, 32, 8, 128, 65536, 1, 0, True, (("load", 128, 4, 3, True), ("scalars", 64, 4, 4, True),
                                        ("scalars", 128, 8, 3, True))),
    (1, 32, 8, 128, 65536, 1, 128, False, ()),
    (1, 32, 8, 128, 4096, 1, 0, True, ()),
    (1, 32, 8, 128, 65536, 1, 0, False, ()),
    # v48, third run: V's select from loaded tensors with splits, hoisted; 128-key tiles for 16-bit caches
    (1, 32, 8, 128, 65536, 1, 0, False, (("load", 128, 8, 3, True), ("load", 128, 4, 3, True))),
    (1, 32, 8, 128, 65536, 1, 0, True, (("load", 128, 4, 3, True), ("load", 128, 4, 4, True), ("load", 64, 4, 4, True))),
    (1, 32, 8, 128, 4096, 1, 0, False, (("load", 128, 8, 3, True), ("load", 128, 4, 3, True))),
    (1, 32, 8, 128, 4096, 1, 0, True, (("load", 128, 4, 3, True),)),
    (1, 32, 8, 128, 65536, 1, 128, False, (("load", 128, 8, 3, True), ("load", 128, 4, 3, True))),
    (64, 32, 8, 128, 16384, 1, 0, False, (("load", 128, 4, 3, True), ("load", 64, 4, 4, True))),
    (64, 32, 8, 128, 8192, 1, 128, False, (("load", 128, 4, 3, True), ("load", 64, 4, 4, True))),
    (64, 32, 8, 128, 8192, 1, 256, False, (("load", 128, 4, 3, True), ("load", 64, 4, 4, True))),
    (64, 32, 8, 128, 16384, 1, 0, True, (("load", 64, 4, 4, True), ("load", 128, 4, 3, True))),
    # v48, fourth run (the planner's v48 forms): each beside itself not hoisted
    (64, 32, 8, 128, 8192, 1, 32, False, (("load", 32, 4, 4, False),)),
    (64, 32, 8, 128, 8192, 1, 64, False, (("load", 64, 4, 4, False),)),
    (64, 32, 8, 128, 8192, 1, 0, False, (("load", 128, 4, 3, False), ("load", 64, 4, 4, False))),
    (1, 32, 8, 128, 65536, 1, 0, True, (("load", 128, 4, 4, False), ("scalars", 128, 4, 3, False))),
    # v49 (indices 39-44): with splits, V's select reading each key's position every tile (a sixth field True:
    # seen_per_key) beside the v48 select (the tile's start read per tile) and the select on scalars, hoisted
    (1, 32, 8, 128, 65536, 1, 0, True, (("load", 128, 4, 4, True, True), ("load", 128, 4, 4, True),
                                        ("scalars", 128, 4, 3, True))),
    (1, 32, 8, 128, 65536, 1, 0, False, (("load", 128, 8, 3, True, True), ("load", 128, 4, 3, True, True),
                                         ("load", 128, 4, 3, True))),
    (1, 32, 8, 128, 4096, 1, 0, True, (("load", 128, 4, 4, True, True), ("load", 128, 4, 4, True))),
    (1, 32, 8, 128, 4096, 1, 0, False, (("load", 128, 8, 3, True, True), ("load", 128, 4, 3, True, True),
                                        ("load", 128, 4, 3, True))),
    (1, 32, 8, 128, 65536, 1, 128, True, (("load", 128, 4, 3, True, True), ("load", 128, 4, 4, True, True))),
    (1, 32, 8, 128, 65536, 1, 0, True, (("load", 128, 4, 3, True, True), ("load", 128, 4, 4, True, True),
                                        ("load", 128, 8, 3, True, True))),
    # 45-46 (session 35): the page-16 gathers with splits (B1), whose tiles span pages (no hoisted loop): tile sizes,
    # warps and stages beside the planner's (FP8: 128-key tiles, 4 warps, 3 stages; bf16: 128, 4, 2)
    (1, 32, 8, 128, 65536, 1, 16, True, (("scalars", 64, 4, 3), ("scalars", 64, 4, 4), ("scalars", 128, 4, 4),
                                         ("scalars", 128, 8, 3), ("scalars", 32, 4, 4))),
    (1, 32, 8, 128, 65536, 1, 16, False, (("scalars", 128, 4, 3), ("scalars", 128, 4, 4), ("scalars", 64, 4, 3),
                                          ("scalars", 128, 8, 4))),
    # 47-50: the planner's 64-key tiles for secure 16-bit gathers with splits (from case 46) beside the form before
    # (128-key tiles, 4 warps, 2 stages): page 16 and 32 at 64k, page 16 at 4k; page 64 (a gather at 128 keys, one
    # page per tile at 64: the hoisted loop with each key's position read)
    (1, 32, 8, 128, 65536, 1, 16, False, (("scalars", 128, 4, 2),)),
    (1, 32, 8, 128, 65536, 1, 32, False, (("scalars", 128, 4, 2),)),
    (1, 32, 8, 128, 4096, 1, 16, False, (("scalars", 128, 4, 2),)),
    (1, 32, 8, 128, 65536, 1, 64, False, (("load", 64, 4, 3, True, True), ("scalars", 64, 4, 3))),
)
# the planner's fast and secure forms; its secure config with the other select; with the addressing hoisted (v48)
FORMS = ("fast", "secure", "secure:other", "secure:hoisted")


def _call_of(form, q, kc, vc, kw, cfg=None):
    """(plan, call) of ``form`` (``FORMS``; ``cfg``: a whole secure configuration, for the extra ones)."""
    if form == "secure:other":
        plan, _ = _planned(q, kc, vc, kw, None, secure=True)
        cfg = dataclasses.replace(plan.config, seen_by_load=not seen_by_load(plan.shape, plan.config))
    elif form == "secure:hoisted":
        plan, _ = _planned(q, kc, vc, kw, None, secure=True)
        cfg = dataclasses.replace(plan.config, hoisted=True)
    return _planned(q, kc, vc, kw, cfg, secure=form != "fast")


def _name(plan) -> str:
    return "load" if seen_by_load(plan.shape, plan.config) else "scalars"


def check(case, seed: int) -> dict:
    """The fast path and both secure selects against the float64 reference at random lengths (stale slots NaN), two
    sequences, at most 4096 keys; the two secure selects bit for bit."""
    from flashcore.reference import attention_with_kvcache as reference

    _, Hq, Hkv, D, cap, Sq, page, fp8, _ = case
    B, cap = 2, min(cap, 4096)
    g = torch.Generator(device="cuda").manual_seed(seed)
    lens = torch.randint(1, cap, (B,), generator=g, device="cuda", dtype=torch.int32)
    lens[-1] = cap
    q, kc, vc, kw = _make(B, Hq, Hkv, D, cap, Sq, page, fp8, g, "cuda", lens=lens)
    for b in range(B):  # stale slots: NaN in K and V past the length
        L = int(lens[b])
        for cache in (kc, vc):
            view = cache.view(torch.uint8) if fp8 else cache
            nan = 0x7F if fp8 else float("nan")
            if page:
                for col in range(L // page, cap // page):
                    view[int(kw["page_table"][b, col]), max(L - col * page, 0):] = nan
            else:
                view[b, L:] = nan
    ref = reference(q.double(), kc if fp8 else kc.double(), vc if fp8 else vc.double(), **kw).to(torch.float64)
    errs, outs = {}, {}
    t = {n: kw.get(n) for n in ("page_table", "k_descale", "v_descale")}

    def run(plan, name):  # output poisoned first; error against float64; kept for the bitwise comparison
        o, _ = plan(q, kc, vc, dict(t, cache_seqlens=kw["cache_seqlens"]), torch.full_like(q, float("nan")))
        torch.cuda.synchronize()
        errs[name] = float((o.double() - ref).norm() / ref.norm())
        outs[name] = o.clone()

    for form in FORMS[:3]:
        plan, _ = _call_of(form, q, kc, vc, kw)
        run(plan, form if form == "fast" else _name(plan))
    for hoisted in (False, True):  # the planner's secure form with and without hoisted addressing (v48)
        plan, _ = _call_of("secure", q, kc, vc, kw)
        plan, _ = _planned(q, kc, vc, kw, dataclasses.replace(plan.config, hoisted=hoisted), secure=True)
        run(plan, f"{_name(plan)}:hoisted={hoisted_flag(plan.shape, plan.config)}")
    plan, _ = _call_of("secure", q, kc, vc, kw)  # v49: hoisted, V's select reading each key's position every tile
    plan, _ = _planned(q, kc, vc, kw, dataclasses.replace(plan.config, hoisted=True, seen_by_load=True,
                                                          seen_per_key=True), secure=True)
    run(plan, f"{_name(plan)}:keys={seen_per_key(plan.shape, plan.config)}")
    return dict(rel_err=errs, secure_bit_identical=bool(all(torch.equal(o, outs["scalars"])
                                                            for n, o in outs.items() if n != "fast")),
                finite=bool(all(torch.isfinite(o).all() for o in outs.values())))


def main(argv=None):
    ap = parser(__name__, __doc__)
    add_ab_arguments(ap, rep_ms=60.0, seed=2047, listed="CASES")
    args = ap.parse_args(argv)
    rows = []
    for i in picked(args.only, len(CASES)):
        case = CASES[i]
        B, Hq, Hkv, D, cap, Sq, page, fp8, extra = case
        ok = check(case, args.seed + i)
        g = torch.Generator(device="cuda").manual_seed(args.seed + 100 + i)
        q, kc, vc, kw = _make(B, Hq, Hkv, D, cap, Sq, page, fp8, g, "cuda")
        fns, cfgs = {}, {}
        for form in FORMS:
            plan, fn = _call_of(form, q, kc, vc, kw)
            name = form if form == "fast" else f"{form}:{_name(plan)}"
            if form == "secure:hoisted":
                name = f"{form}:{hoisted_flag(plan.shape, plan.config)}"
            fns[name], cfgs[name] = fn, repr(plan.config)
            if form == "secure":
                planner = plan.config
        for select, bn, w, st, *h in extra:
            per_key = len(h) > 1 and h[1]
            cfg = dataclasses.replace(planner, block_n=bn, num_warps=w, num_stages=st, seen_by_load=select == "load",
                                      hoisted=bool(h and h[0]), seen_per_key=per_key)
            name = f"{select}:{bn}w{w}s{st}{':hoisted' if h and h[0] else ''}{':keys' if per_key else ''}"
            plan, fns[name] = _call_of("secure", q, kc, vc, kw, cfg)
            cfgs[name] = repr(plan.config)
        for name, fn in list(fns.items()):
            try:
                fn()
            except triton.runtime.errors.OutOfResources as e:  # an extra configuration past the SM's shared memory
                print(f"{case[:8]} {name}: not run ({e})", flush=True)
                del fns[name]
                cfgs[name] = f"not run: {e}"
        torch.cuda.synchronize()
        per_round, med = cold_l2_rounds(fns, args.rounds, args.rep_ms)
        rows.append(dict(case=[B, Hq, Hkv, D, cap, Sq, page, fp8], us=med, rounds=per_round, configs=cfgs, check=ok,
                         over_fast={f: med["fast"] / med[f] for f in fns}))
        print(f"{case[:8]}: {ok}", flush=True)
    path = write_rows(args.out, "secure-v-seen.json", "Timer (cold L2), interleaved rounds, median", rows)

    def label(r):
        B, Hq, Hkv, D, cap, Sq, page, fp8 = r["case"]
        return f"B{B} {cap // 1024}k {'p%d' % page if page else 'contig'} {'fp8' if fp8 else 'bf16'}"

    print("secure decode: us (fast / form); the planner's secure form first, then its configuration with the other "
          "select, then the extra configurations")
    for r in rows:
        cells = "  ".join(f"{n} {r['us'][n]:.1f} ({r['over_fast'][n]:.3f})" for n in r["us"])
        print(f"{label(r):>18}  {cells}")
    print(path)


if __name__ == "__main__":
    main()
