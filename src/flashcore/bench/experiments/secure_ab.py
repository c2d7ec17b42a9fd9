"""Secure mode against the fast path, per forced configuration: which secure form is fastest on small shapes
(issue 25 §3: secure ≥ 0.9x fast at true length = S_max). Each shape runs the fast path as planned, secure mode
as planned, and secure mode with every ``--configs`` entry forced (``ops.dense_plan`` with ``config=``; names as
``plan.tables.config_name`` writes them). Every variant is checked against a float64 reference first (relative
error < 2e-2 on the bench's slices, ``bench.check.reference_pieces``: first and last batch and head, first and last
row windows; outputs poisoned with NaN before the check) and dropped from timing if it fails or cannot run.

Timing is the bench's (``bench.timing.Timer``): per-call CUDA events with a cold L2 (rotated input sets where one
set fits in L2, else the flush), the queue pre-filled so host time never shows; ``--rounds`` rounds, every
variant once per round in turn, and the median of the rounds' medians. Secure calls pass true lengths = S_max.
Writes ``secure-ab.json`` to --out and prints a table last (µs, and secure / fast as a throughput ratio).

    python -m flashcore.bench.experiments.secure_ab --out $OUT [--shapes 1x8x512x64,...] \
        [--configs auto,gluon_ws_64x128s2,...] [--rounds 3] [--padding]

``--explicit-q`` (perf-notes v36): secure calls pass the query lengths too (``seqlens_q``, = S_max), so a causal
call's diagonal is secret (every key tile visited; the fast path as planned, causal on its public diagonal).

``--pdl`` (perf-notes v44): every secure variant twice more, the Gluon kernel launched as the programmatic dependent of
its pre-pass (``:pdl``, the Gluon switch ``secure_pdl="on"``) and after the pre-pass completes (``:nopdl``, "off").

``--padding`` (perf-notes v34): every secure variant also with its padding forced into the kernel (``:ink``, the
Gluon switch ``secure_in_kernel_padding="on"``: causal forms only, non-causal ones keep the pre-pass) and forced to
the pre-pass (``:pre``).
"""
import json
import time

import torch

from ... import ops
from ...plan.knobs import override
from ...plan.tables import parse_config_name
from ..backends import Inputs
from ..check import reference_pieces, relative_error
from ..suites import parse_shapes
from ..timing import DEFAULT_L2_BYTES, Timer, rotation_sets, use_rotation
from . import interleaved_rounds, parser, print_us_table, write_rows

SHAPES = "1x8x512x64,1x16x1024x64,4x16x1024x64,16x16x2048x64,1x16x1024x64c,4x16x1024x64c"
# the planner's choice, the one-warpgroup Gluon layout, two consumer warpgroups, and the secure Triton kernel
CONFIGS = "auto,gluon_ws_64x128s2,gluon_ws_128x128s3,128x64w8s3"
TOLERANCE = 2e-2


def _variants(configs, strict=False, padding=False, pdl=False):
    """name -> (forced configuration or None for the planner's, secure: False, True or "strict", the
    ``secure_in_kernel_padding`` switch, the ``secure_pdl`` switch). ``padding``: each secure variant twice more, its
    padding forced into the kernel (":ink") and forced to the pre-pass (":pre"). ``pdl``: each secure variant twice
    more, ``secure_pdl`` forced on (":pdl") and off (":nopdl")."""
    out = {"fast": (None, False, "auto", "auto"), "secure:auto": (None, True, "auto", "auto")}
    if strict:
        out["secure:strict"] = (None, "strict", "auto", "auto")
    for name in configs:
        if name != "auto":
            out[f"secure:{name}"] = (parse_config_name(name), True, "auto", "auto")
    if padding:
        for tag, (cfg, secure, _, _) in list(out.items()):
            if secure:
                out[f"{tag}:pre"] = (cfg, secure, "off", "auto")
                out[f"{tag}:ink"] = (cfg, secure, "on", "auto")
    if pdl:
        for tag, (cfg, secure, pad_mode, _) in list(out.items()):
            if secure:
                out[f"{tag}:pdl"] = (cfg, secure, pad_mode, "on")
                out[f"{tag}:nopdl"] = (cfg, secure, pad_mode, "off")
    return out


def time_shape(shape, configs, rounds, timer, profile=False, strict=False, padding=False, explicit_q=False,
               pdl=False):
    B, H, S, D, causal = shape.B, shape.Hq, shape.Sq, shape.D, shape.causal
    g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1e3) % 2**31)
    io_bytes = 4 * B * H * S * D * 2
    n_sets = rotation_sets(io_bytes, DEFAULT_L2_BYTES) if use_rotation(io_bytes, DEFAULT_L2_BYTES) else 1
    sets = [tuple(torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            for _ in range(n_sets)]
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    lens_q = lens.clone()  # (explicit_q: a tensor of its own; the same tensor as seqlens_k is self-attention)
    q0, k0, v0 = sets[0]
    # the bench's float64 check on slices (first and last batch, head and row windows): any size fits
    pieces = reference_pieces(Inputs(shape, q0, k0, v0, D ** -0.5))
    fns, errs, kernels = {}, {}, {}
    for tag, (cfg, secure, pad_mode, pdl_mode) in _variants(configs, strict, padding, pdl).items():
        try:
            with override(secure_in_kernel_padding=pad_mode, secure_pdl=pdl_mode):
                sk = lens if secure else None
                sq = lens_q if secure and explicit_q else None
                plans = [ops.dense_plan(q, k, v, sq, sk, causal, D ** -0.5, False, secure, False, config=cfg,
                                        validate=False) for q, k, v in sets]
            kernels[tag] = plans[0].selection.explain()
            if getattr(plans[0].main, "step", None) is not None and plans[0].main.step.constexprs.get("SECRET_DIAG"):
                kernels[tag] += " [SECRET_DIAG]"  # (the secret-diagonal form: every key tile)
            out0 = torch.full_like(q0, float("nan"))
            plans[0](q0, k0, v0, sq, sk, out0)
            errs[tag] = relative_error(out0, pieces)
            if errs[tag] < TOLERANCE:
                fns[tag] = [(lambda p=p, q=q, k=k, v=v, sq=sq, sk=sk: p(q, k, v, sq, sk))
                            for p, (q, k, v) in zip(plans, sets)]
        except Exception as e:  # noqa: BLE001 - a config that cannot run here is data
            errs[tag] = f"{type(e).__name__}: {str(e)[:200]}"
    rounds_us, us = interleaved_rounds(fns, rounds, lambda fn: timer.stats(fn, flush=n_sets == 1)["median_us"])
    kernel_us = {n: kernel_times(fn[0]) for n, fn in fns.items()} if profile else {}
    ratio = {n: us["fast"] / u for n, u in us.items() if "fast" in us}
    return dict(shape=[B, H, S, D], causal=causal, explicit_q=explicit_q, input_sets=n_sets, us=us,
                secure_over_fast=ratio, rounds=rounds_us, rel_err=errs, kernels=kernels, kernel_us=kernel_us)


def kernel_times(fn, calls: int = 20) -> dict:
    """Mean GPU time per call of each kernel ``fn`` launches (torch.profiler's CUDA activity; warm L2): where a
    secure call's extra time goes (its pre-pass against the main kernel)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.device_time > 0:
            out[e.name] = out.get(e.name, 0.0) + e.device_time / calls
    return out


def main(argv=None):
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="also each variant's GPU time per kernel (kernel_us)")
    ap.add_argument("--strict", action="store_true", help="also secure=\"strict\" as the planner runs it")
    ap.add_argument("--padding", action="store_true",
                    help="also each secure variant with its padding forced into the kernel (:ink) and to the pre-pass "
                         "(:pre)")
    ap.add_argument("--pdl", action="store_true",
                    help="also each secure variant with the Gluon kernel launched as its pre-pass's programmatic "
                         "dependent (:pdl) and after the pre-pass completes (:nopdl)")
    ap.add_argument("--explicit-q", action="store_true",
                    help="secure calls pass seqlens_q too: causal shapes then have a secret diagonal")
    a = ap.parse_args(argv)
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    timer = Timer()
    rows = []
    for s in parse_shapes(a.shapes):
        rows.append(time_shape(s, configs, a.rounds, timer, a.profile, a.strict, a.padding, a.explicit_q, a.pdl))
        print(json.dumps(rows[-1]), flush=True)
    path = write_rows(a.out, "secure-ab.json", "bench.timing.Timer medians (cold L2), median of "
                      f"{a.rounds} rounds, us; secure at true length = S_max", rows)
    print_us_table("us (secure / fast throughput); '-': failed or cannot run (see rel_err in the JSON)", rows,
                   list(_variants(configs, a.strict, a.padding, a.pdl)),
                   lambda r: "x".join(map(str, r["shape"])) + ("c" if r["causal"] else ""), "secure_over_fast", 24,
                   heading=lambda n: n.replace("secure:", "s:"))
    for r in rows:
        for n, ks in r["kernel_us"].items():
            print(f"{'x'.join(map(str, r['shape'])) + ('c' if r['causal'] else '')} {n}: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in sorted(ks.items(), key=lambda kv: -kv[1])))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
