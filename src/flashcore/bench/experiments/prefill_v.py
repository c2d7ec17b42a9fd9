"""Secure chunked prefill (``attention_with_kvcache`` with many queries per sequence, on the Gluon kernel): V's rows
past each secret key length cleaned by the V pre-pass (``secure_prefill_v="prepass"``; of a paged cache, through the
page table into a contiguous copy) against cleared by the loader warpgroup in every tile (``"loader"``), beside the fast
path, at every sequence's full length (docs/perf-notes.md v46).

Each form is first checked against the float64 reference (output poisoned with NaN, stale slots past a shorter length
holding NaN/Inf), the two secure forms bit for bit against each other; then timed as the decode bench times (cold L2,
the queue pre-filled: ``bench.timing.Timer``), the forms interleaved over ``--rounds`` rounds, median per form.
"""
from __future__ import annotations

import torch

from . import add_ab_arguments, cold_l2_rounds, parser, picked, print_us_table, write_rows

# (B, Hq, Hkv, Sq, capacity, D, causal, page size: 0 contiguous); the first two are the decode bench's rows
SHAPES = (
    (4, 32, 8, 512, 8192, 128, True, 0),
    (4, 32, 8, 512, 8192, 128, True, 16),
    (4, 32, 8, 512, 8192, 128, False, 0),
    (1, 32, 8, 512, 8192, 128, True, 0),
    (4, 32, 8, 512, 2048, 128, True, 0),
    (8, 32, 8, 1024, 16384, 128, True, 0),
    (4, 16, 16, 512, 8192, 64, True, 0),
    (4, 32, 8, 512, 8192, 128, True, 64),
    (1, 32, 8, 512, 8192, 128, True, 16),
)
FORMS = ("fast", "secure:loader", "secure:prepass")


def _call(form, q, kc, vc, lens, causal, table, out):
    import flashcore
    from flashcore.plan.knobs import override

    secure = form != "fast"
    mode = form.split(":")[1] if secure else "auto"
    with override(secure_prefill_v=mode):
        return flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=causal, secure=secure, out=out,
                                                page_table=table, return_lse=True)


def _inputs(B, Hq, Hkv, Sq, cap, D, page, g):
    """q, the caches (paged: ``[pages, page, Hkv, D]`` in a shuffled order, a few pages spare) and the page table."""
    q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    if not page:
        kc = torch.randn(B, cap, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        vc = torch.randn(B, cap, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        return q, kc, vc, None
    width = cap // page
    pages = B * width + 3
    kc = torch.randn(pages, page, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    vc = torch.randn(pages, page, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    table = torch.randperm(pages, device="cuda", generator=g)[:B * width].view(B, width).int().contiguous()
    return q, kc, vc, table


def _poison_tail(cache, table, b, L, value):
    """Every slot of sequence ``b`` at or past ``L``."""
    if table is None:
        cache[b, L:] = value
        return
    page = cache.shape[1]
    for col in range(L // page, table.shape[1]):
        start = max(L - col * page, 0)
        cache[int(table[b, col]), start:] = value


def check(shape, seed: int) -> dict:
    """Each form against the float64 reference at random lengths (stale slots NaN/Inf), the secure ones bit for bit;
    at two sequences and at most 4096 keys (the same kernel forms; the reference's scores fit)."""
    from flashcore import reference as R

    _, Hq, Hkv, Sq, cap, D, causal, page = shape
    B, cap = 2, min(cap, 4096)
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, kc, vc, table = _inputs(B, Hq, Hkv, Sq, cap, D, page, g)
    lens = torch.randint(Sq, cap + 1, (B,), device="cuda", generator=g).int()
    lens[-1] = cap
    for b in range(B):
        _poison_tail(kc, table, b, int(lens[b]), float("nan"))
        _poison_tail(vc, table, b, int(lens[b]), float("inf"))
    ref = None
    errs, outs = {}, {}
    for form in FORMS:
        out = torch.full_like(q, float("nan"))
        o, lse = _call(form, q, kc, vc, lens, causal, table, out)
        torch.cuda.synchronize()
        if ref is None:
            ref = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=causal, page_table=table)
        errs[form] = float((o.double() - ref.double()).norm() / ref.double().norm())
        outs[form] = (o.clone(), lse.clone())
    same = all(torch.equal(a, b) for a, b in zip(outs["secure:loader"], outs["secure:prepass"]))
    return dict(rel_err=errs, secure_bit_identical=same)


def main(argv=None):
    ap = parser(__name__, __doc__)
    add_ab_arguments(ap, rep_ms=100.0, seed=2026, listed="SHAPES")
    args = ap.parse_args(argv)
    rows = []
    for i in picked(args.only, len(SHAPES)):
        shape = SHAPES[i]
        B, Hq, Hkv, Sq, cap, D, causal, page = shape
        ok = check(shape, args.seed + i)
        g = torch.Generator(device="cuda").manual_seed(args.seed + 100 + i)
        q, kc, vc, table = _inputs(B, Hq, Hkv, Sq, cap, D, page, g)
        lens = torch.full((B,), cap, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        fns = {f: (lambda f=f: _call(f, q, kc, vc, lens, causal, table, out)) for f in FORMS}
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        per_round, med = cold_l2_rounds(fns, args.rounds, args.rep_ms)
        rows.append(dict(shape=list(shape), us=med, rounds=per_round, check=ok,
                         over_fast={f: med["fast"] / med[f] for f in FORMS},
                         flops=4.0 * B * Hq * Sq * cap * D / (2 if causal else 1)))
        print(f"{shape}: {ok}", flush=True)
    path = write_rows(args.out, "prefill-v.json", "Timer (cold L2), interleaved rounds, median", rows)

    def label(r):
        B, Hq, Hkv, Sq, cap, D, causal, page = r["shape"]
        return f"{B}x{Hq}/{Hkv}x{Sq}/{cap}x{D}{'c' if causal else ''}{f'p{page}' if page else ''}"

    print_us_table("secure chunked prefill: us (fast / form)", rows, list(FORMS), label, "over_fast", 18)
    print(path)


if __name__ == "__main__":
    main()
