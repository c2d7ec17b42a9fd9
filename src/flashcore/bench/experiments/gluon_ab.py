"""A/B of switches of the Gluon kernel (the fields of ``plan.knobs.GluonSwitches``, e.g. ``fast_sum_mma``;
perf-notes v13 used it for three switches since reverted) on the GPU: correctness against the float64 reference
with every switch on, then same-run timings of every combination beside SDPA, in two methods: the bench
harness's (CUDA events per call, queue pre-filled, cold L2 by rotating input sets or flushing;
flashcore.bench.timing) and ``triton.testing.do_bench`` (L2 flushed; what ``flashcore bench gpu-check`` reports).
Rounds alternate the variants. Writes ``ab-<attrs>.json`` to --out and prints a table last.

    python -m flashcore.bench.experiments.gluon_ab --attr fast_sum_mma --out $OUT [--rounds 3]
    python -m flashcore.bench.experiments.gluon_ab --attr stagger=0,1,2 --shapes 4x16x1024x64 \
        --families auto --out $OUT

Variant names: ``auto`` (the planner's config) or ``gluon`` (the 2-warpgroup Gluon config forced), or a config
given with ``--config`` by its sweep name (``gluon_ws_64x128s3``: plan.tables.config_name), then the initials of
each switch that is on (``fast_sum_mma`` -> ``fsm``; the whole names where two switches share initials) or of each
integer setting followed by its value (``stagger=2`` -> ``s2``), joined by ``.``, or ``-`` for none. With
``--config`` and no ``--attr`` the configs alone are compared:

    python -m flashcore.bench.experiments.gluon_ab --config gluon_ws_64x128s3 --shapes 1x16x1024x64 --out $OUT
"""
import itertools
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from ... import ops, reference
from ...kernels import SM90_FWD
from ...plan import knobs
from ...plan.tables import Config, parse_config_name
from .. import timing
from ..results import collect_environment
from ..suites import parse_shapes as parse_suite_shapes
from . import parser


GLUON64 = Config(128, 128, 4, 3, kernel="gluon_ws")
ATTRS = ["fast_sum_mma"]
CONFIGS = []  # extra config families (--config), by name
VARIANTS = {}  # name -> (config (None: the planner's choice), {switch: on}); built by set_variants


def parse_attr(text):
    """``name`` (a boolean switch: off, on) or ``name=v1,v2,...`` (an integer setting: these values) ->
    (name, values); the values must have the switch's type."""
    name, _, vals = text.partition("=")
    default = getattr(knobs.GluonSwitches(), name, None) if name in knobs.SWITCH_NAMES else None
    if isinstance(default, bool) and not vals:
        return name, (False, True)
    if isinstance(default, int) and not isinstance(default, bool) and vals:
        try:
            return name, tuple(int(v) for v in vals.split(","))
        except ValueError:
            pass
    raise ValueError(f"{text!r}: GluonSwitches has no boolean switch {name!r}, nor an integer one given as "
                     f"{name}=v1,v2,... (switches: {', '.join(knobs.SWITCH_NAMES)})")


def set_variants(attrs, configs=()):
    """``attrs``: (name, values) pairs (parse_attr), or names of boolean switches; every combination of values
    is a variant."""
    attrs = [(a, (False, True)) if isinstance(a, str) else a for a in attrs]
    ATTRS[:] = [a for a, _ in attrs]
    CONFIGS[:] = configs
    VARIANTS.clear()
    short = ["".join(w[0] for w in a.split("_")) for a in ATTRS]
    if len(set(short)) < len(ATTRS):  # initials that collide would merge two variants: spell the names out
        short = list(ATTRS)

    def tag(t, v):
        return (t if v else "") if isinstance(v, bool) else f"{t}{v}"

    families = [("auto", None), ("gluon", GLUON64)] + [(c, parse_config_name(c)) for c in configs]
    for base, cfg in families:
        for vals in itertools.product(*(v for _, v in attrs)):
            name = ".".join(x for x in (tag(t, v) for t, v in zip(short, vals)) if x) or "-"
            VARIANTS[f"{base}_{name}"] = (cfg, dict(zip(ATTRS, vals)))


def names(base):
    return [n for n in VARIANTS if n.startswith(base + "_")]


SHAPES = [  # (B, H, S, D), and the variant families timed there ("auto", "gluon")
    ((1, 8, 512, 64), ["auto", "gluon"]),
    ((1, 16, 1024, 64), ["auto", "gluon"]),
    ((2, 16, 1024, 64), ["auto"]),
    ((4, 16, 1024, 64), ["auto"]),
    ((16, 16, 2048, 64), ["auto"]),
    ((4, 32, 4096, 64), ["auto"]),
    ((1, 16, 1024, 128), ["auto"]),
    ((4, 16, 1024, 128), ["auto"]),
    ((4, 32, 4096, 128), ["auto"]),
    ((1, 32, 16384, 128), ["auto"]),
]
CAUSAL_SHAPES = [(4, 32, 4096, 128), (1, 32, 16384, 128), (4, 16, 1024, 64), (16, 16, 2048, 64)]
# correctness: (B, Hq, Hkv, Sq, Sk, D, dtype, return_lse, variant)
CHECKS = [
    (4, 4, 4, 1000, 1000, 64, torch.bfloat16, True, "gluon"),
    (4, 4, 4, 1000, 1000, 64, torch.float16, True, "gluon"),
    (2, 8, 2, 777, 1000, 64, torch.bfloat16, True, "gluon"),
    (2, 4, 4, 300, 129, 64, torch.bfloat16, True, "gluon"),
    (2, 8, 4, 1024, 1024, 128, torch.bfloat16, True, "auto"),
    (1, 40, 8, 2048, 2048, 64, torch.bfloat16, True, "auto"),  # three warpgroups, several items per program
    (3, 7, 7, 1000, 100, 128, torch.float16, False, "auto"),  # one key tile
    (1, 8, 8, 1, 1, 64, torch.bfloat16, True, "gluon"),  # one row, one key
]  # (each runs the variant with every switch on)


def resolve(name):
    """A variant's name; a family's name (``auto``, ``gluon``, a --config) means its last variant: every switch
    on, every integer setting at its last value."""
    if name in ("auto", "gluon", *CONFIGS):
        return names(name)[-1]
    return name


def make_call(q, k, v, D, lse, name, out=None, causal=False):
    """The variant's plan for these tensors (the switches are read when the launch is planned)."""
    cfg, ons = VARIANTS[resolve(name)]
    with knobs.override(**ons):
        return ops.dense_plan(q, k, v, None, None, causal, D ** -0.5, False, False, lse, out=out, config=cfg,
                              validate=False)


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(B, Hq, Hkv, Sq, Sk, D, dtype, lse, vname, causal=False):
    g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1e6) % 2**31)
    q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    call = make_call(q, k, v, D, lse, vname, out, causal)
    kernel = call.selection.explain()
    if call.selection.kernel == SM90_FWD.name:
        kernel += f" {call.main.step.constexprs}"
    o, l = call(q, k, v, None, None, out)
    torch.cuda.synchronize()
    ro, rl = reference.attention(q.cpu(), k.cpu(), v.cpu(), causal=causal, return_lse=True)
    res = dict(shape=[B, Hq, Hkv, Sq, Sk, D], causal=causal, dtype=str(dtype), variant=vname, kernel=kernel,
               err=rel_err(o.cpu(), ro), nan=bool(torch.isnan(o).any()))
    if lse:
        lc = l.cpu().double()
        same = lc == rl.double()  # rows that see no key: -inf in both (-inf - -inf would be NaN)
        res["lse_err"] = torch.where(same, 0.0, lc - rl.double()).abs().max().item()
    res["ok"] = res["err"] < 1e-2 and not res["nan"] and res.get("lse_err", 0) < 1e-3
    return res


def time_shape(timer, B, H, S, D, families, rounds, causal=False):
    io = 4 * B * H * S * D * 2
    rotate = timing.use_rotation(io, timing.DEFAULT_L2_BYTES)
    n_sets = timing.rotation_sets(io, timing.DEFAULT_L2_BYTES) if rotate else 1
    g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1e3) % 2**31)
    sets = [tuple(torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            for _ in range(n_sets)]
    fns = {"sdpa": [(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                    for q, k, v in sets]}
    ref = F.scaled_dot_product_attention(*sets[0], is_causal=causal).float()
    errs = {}
    for n in [n for f in families for n in names(f)]:
        try:
            calls = [make_call(q, k, v, D, False, n, causal=causal) for q, k, v in sets]
            fs = [(lambda c=c, q=q, k=k, v=v: c(q, k, v, None, None)[0]) for c, (q, k, v) in zip(calls, sets)]
            errs[n] = rel_err(fs[0]().float(), ref)
            if errs[n] < 2e-2:
                fns[n] = fs
        except Exception as e:  # noqa: BLE001 - a variant that cannot run here is data
            errs[n] = f"{type(e).__name__}: {str(e)[:120]}"
    samples = {n: [] for n in fns}
    db = {n: [] for n in fns}
    for _ in range(rounds):
        for n, fs in fns.items():
            samples[n].append(statistics.median(timer.measure(fs, flush=not rotate, rep_ms=60)) * 1e3)
            db[n].append(do_bench(fs[0], warmup=25, rep=100, return_mode="median") * 1e3)
    res = {n: min(v) for n, v in samples.items()}
    return dict(shape=[B, H, S, D], causal=causal, method="rotate" if rotate else "l2-flush", us=res,
                do_bench_us={n: statistics.median(v) for n, v in db.items()}, rounds=samples, do_bench_rounds=db,
                errs=errs)


def parse_shapes(text):
    """``1x16x1024x64,4x16x1024x64c`` -> [((1, 16, 1024, 64), False), ((4, 16, 1024, 64), True)] (c: causal)."""
    return [((s.B, s.Hq, s.Sq, s.D), s.causal) for s in parse_suite_shapes(text)]


def main(argv=None):
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--attr", action="append", default=[],
                    help="a GluonSwitches switch to compare on and off, or name=v1,v2 for an integer setting")
    ap.add_argument("--config", action="append", default=[],
                    help="a config (sweep name, e.g. gluon_ws_64x128s3) timed as its own family on every shape")
    ap.add_argument("--shapes", default="", help="these shapes instead of the built-in lists, each timed with every "
                    "family, e.g. 1x16x1024x64,4x32x4096x128c (c: causal)")
    ap.add_argument("--families", default="auto,gluon", help="with --shapes: the built-in families to time besides "
                    "the --config ones (auto: the planner's config; gluon: the 2-warpgroup Gluon config forced)")
    a = ap.parse_args(argv)
    try:
        attrs = [parse_attr(t) for t in (a.attr or ([] if a.config else ATTRS))]
    except ValueError as e:
        raise SystemExit(f"--attr: {e}")
    try:
        set_variants(attrs, a.config)
    except ValueError as e:
        raise SystemExit(f"--config: {e}")
    t0 = time.time()
    checks = []
    causal_checks = [(2, 4, 4, 1000, 1000, 128, torch.bfloat16, True, "auto", True),
                     (1, 8, 2, 700, 1100, 128, torch.float16, True, "auto", True)]
    # each --config family also runs the checks of the forced Gluon config (D=64, the 1-warpgroup layout's),
    # and causal ones: Sq = Sk, Sq < Sk and Sq > Sk (bottom-right diagonal; rows that see no key)
    extra = [c[:-1] + (f,) for f in CONFIGS for c in CHECKS if c[-1] == "gluon"]
    extra += [c + (f, True) for f in CONFIGS for c in ((2, 4, 4, 1000, 1000, 64, torch.bfloat16, True),
                                                      (1, 8, 2, 700, 1100, 64, torch.float16, True),
                                                      (2, 4, 1, 1100, 700, 64, torch.bfloat16, True))]
    for c in ([] if a.skip_checks else CHECKS + causal_checks + extra):
        try:
            checks.append(check(*c))
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            checks.append(dict(case=repr(c), ok=False, error=f"{type(e).__name__}: {str(e)[:300]}"))
    for c in checks:
        print(("ok  " if c["ok"] else "BAD ") + json.dumps(c), flush=True)
    timer = timing.Timer()
    rows = []
    todo = [(s, n + CONFIGS, False) for s, n in SHAPES] + [(s, ["auto"] + CONFIGS, True) for s in CAUSAL_SHAPES]
    if a.shapes:
        fams = [f for f in a.families.split(",") if f]
        if any(f not in ("auto", "gluon") for f in fams):
            raise SystemExit(f"--families: auto and/or gluon, got {a.families!r}")
        todo = [(shape, fams + CONFIGS, causal) for shape, causal in parse_shapes(a.shapes)]
    for (B, H, S, D), names, causal in todo:
        r = time_shape(timer, B, H, S, D, names, a.rounds, causal)
        rows.append(r)
        print(json.dumps(r), f"[{time.time() - t0:.0f}s]", flush=True)
    env = dict(collect_environment(), method="flashcore.bench.timing.Timer median per round, min over rounds, us")
    with open(os.path.join(a.out, f"ab-{'-'.join(ATTRS + CONFIGS) or 'auto'}.json"), "w") as f:
        json.dump({"env": env, "checks": checks, "rows": rows}, f, indent=1)
    for key, label in (("us", "harness (min of rounds)"), ("do_bench_us", "do_bench (median of rounds)")):
        print(f"\n{label}\n{'shape':>18} {'sdpa':>8} " + " ".join(f"{n:>8}" for n in VARIANTS))
        for r in rows:
            us = r[key]
            cells = [f"{us['sdpa'] / us[n]:8.3f}" if n in us else f"{'-':>8}" for n in VARIANTS]
            name = "x".join(map(str, r["shape"])) + ("c" if r["causal"] else "")
            print(f"{name:>18} {us['sdpa']:8.1f} " + " ".join(cells))
    print(f"(cells: SDPA time / variant time; > 1 is faster than SDPA; switches: {ATTRS})")
    print("checks:", sum(c["ok"] for c in checks), "/", len(checks), "ok")


if __name__ == "__main__":
    main()
