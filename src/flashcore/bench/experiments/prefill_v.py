"""Secure chunked prefill (``attention_with_kvcache`` with many queries per sequence, on the Gluon kernel): V's rows
past each secret key length cleaned by the V pre-pass (``secure_prefill_v="prepass"``) against cleared by the loader
warpgroup in every tile (``"loader"``), beside the fast path, at every sequence's full length (docs/perf-notes.md v46).

Each form is first checked against the float64 reference (output poisoned with NaN, stale slots past a shorter length
holding NaN/Inf), the two secure forms bit for bit against each other; then timed as the decode bench times (cold L2,
the queue pre-filled: ``bench.timing.Timer``), the forms interleaved over ``--rounds`` rounds, median per form.
"""
from __future__ import annotations

import statistics

import torch

from . import interleaved_rounds, parser, print_us_table, write_rows

# (B, Hq, Hkv, Sq, capacity, D, causal); the first is the decode bench's chunked-prefill row
SHAPES = (
    (4, 32, 8, 512, 8192, 128, True),
    (4, 32, 8, 512, 8192, 128, False),
    (1, 32, 8, 512, 8192, 128, True),
    (4, 32, 8, 512, 2048, 128, True),
    (8, 32, 8, 1024, 16384, 128, True),
    (4, 16, 16, 512, 8192, 64, True),
)
FORMS = ("fast", "secure:loader", "secure:prepass")


def _call(form, q, kc, vc, lens, causal, out):
    import flashcore
    from flashcore.plan.knobs import override

    secure = form != "fast"
    mode = form.split(":")[1] if secure else "auto"
    with override(secure_prefill_v=mode):
        return flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=causal, secure=secure, out=out,
                                                return_lse=True)


def check(shape, seed: int) -> dict:
    """Each form against the float64 reference at random lengths (stale slots NaN/Inf), the secure ones bit for bit;
    at two sequences and at most 4096 keys (the same kernel forms; the reference's scores fit)."""
    from flashcore import reference as R

    _, Hq, Hkv, Sq, cap, D, causal = shape
    B, cap = 2, min(cap, 4096)
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    kc = torch.randn(B, cap, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    vc = torch.randn(B, cap, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    lens = torch.randint(Sq, cap + 1, (B,), device="cuda", generator=g).int()
    lens[-1] = cap
    for b in range(B):
        L = int(lens[b])
        kc[b, L:] = float("nan")
        vc[b, L:] = float("inf")
    ref = None
    errs, outs = {}, {}
    for form in FORMS:
        out = torch.full_like(q, float("nan"))
        o, lse = _call(form, q, kc, vc, lens, causal, out)
        torch.cuda.synchronize()
        if ref is None:
            ref = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=causal)
        errs[form] = float((o.double() - ref.double()).norm() / ref.double().norm())
        outs[form] = (o.clone(), lse.clone())
    same = all(torch.equal(a, b) for a, b in zip(outs["secure:loader"], outs["secure:prepass"]))
    return dict(rel_err=errs, secure_bit_identical=same)


def main(argv=None):
    ap = parser(__name__, __doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args(argv)
    from flashcore.bench.timing import Timer

    timer = Timer()
    rows = []
    for i, shape in enumerate(SHAPES):
        B, Hq, Hkv, Sq, cap, D, causal = shape
        ok = check(shape, args.seed + i)
        g = torch.Generator(device="cuda").manual_seed(args.seed + 100 + i)
        q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        kc = torch.randn(B, cap, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        vc = torch.randn(B, cap, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        lens = torch.full((B,), cap, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        fns = {f: (lambda f=f: _call(f, q, kc, vc, lens, causal, out)) for f in FORMS}
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        per_round, med = interleaved_rounds(
            fns, args.rounds, lambda fn: 1e3 * statistics.median(timer.measure([fn], flush=True, rep_ms=args.rep_ms)))
        rows.append(dict(shape=list(shape), us=med, rounds=per_round, check=ok,
                         over_fast={f: med["fast"] / med[f] for f in FORMS},
                         flops=4.0 * B * Hq * Sq * cap * D / (2 if causal else 1)))
        print(f"{shape}: {ok}", flush=True)
    path = write_rows(args.out, "prefill-v.json", "Timer (cold L2), interleaved rounds, median", rows)
    print_us_table("secure chunked prefill: us (fast / form)", rows, list(FORMS),
                   lambda r: "x".join(map(str, r["shape"][:6])) + ("c" if r["shape"][6] else ""), "over_fast", 18)
    print(path)


if __name__ == "__main__":
    main()
