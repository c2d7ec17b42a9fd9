"""What the planner builds (kernel, grid, every scalar and constexpr, warps, stages, compile options, pre-pass,
Gluon descriptor geometry) for a grid of 1,468 problems on sm_90, sm_80 and the interpreter (the architecture
forced, so no GPU is needed), with every environment knob and Gluon switch; one short digest per problem.
``tests/test_plans_pinned.py`` compares them with ``tests/data/plans.json``, pinned from the planner before the
layout move (9875aa0). A change meant to alter what runs re-pins deliberately: ``python tests/plan_digests.py --write``.

The pins are Triton 3.6's. Where a table depends on the toolchain (``plan.tables.SECURE_D64_TWO_WG``), another
Triton's differences are pinned in ``tests/data/plans-triton-<major.minor>.json`` (only the problems that plan
differently there), written by ``--write`` under that Triton.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PINNED = os.path.join(HERE, "data", "plans.json")
BASE_TRITON = "3.6"
ARCHS = {"sm90": (9, 0), "sm80": (8, 0), "interpreter": None}
SHAPES = [(1, 8, 8, 512, 512), (2, 16, 4, 1024, 1024), (1, 4, 4, 4096, 4096), (2, 8, 2, 1000, 1000),
          (1, 8, 8, 100, 3000), (1, 32, 8, 64, 8192), (4, 16, 16, 2048, 2048)]
ENV_KNOBS = [("FLASHCORE_HOPPER_KERNEL", "triton"), ("FLASHCORE_HOPPER_KERNEL", "gluon_ws"),
             ("FLASHCORE_SECURE_KERNEL", "triton"), ("FLASHCORE_SECURE_KERNEL", "gluon_ws"),
             ("FLASHCORE_SECURE_V_ZEROING", "in_loop"), ("FLASHCORE_SECURE_V_ZEROING", "prepass"),
             ("FLASHCORE_SECURE_V_PAD", "zeros")]
SWITCHES = [dict(trace=True), dict(early_loads=False, stagger=0), dict(causal_pairs=False), dict(fast_sum_mma=True),
            dict(stagger=2)]


# constexprs added after the pins at the value every earlier plan had (the Gluon kernel's V_PREPASS, perf-notes v46:
# only secure chunked prefill sets it): left out, so a plan that does not use them keeps its digest
_ADDED_OFF = {("V_PREPASS", False)}


def _step(s):
    if s is None:
        return None
    return dict(fn=s.fn.__name__, grid=list(s.grid),
                scalars=[x if isinstance(x, (int, float, bool)) or x is None else type(x).__name__ for x in s.scalars],
                n_ptrs=s.n_ptrs, constexprs={k: str(v) for k, v in s.constexprs.items() if (k, v) not in _ADDED_OFF},
                warps=s.num_warps,
                stages=s.num_stages, options=s.options)


def describe(plan) -> dict:
    main = plan.main
    d = {"cfg": None, "tma_kw": getattr(main, "tma_kw", None) is not None, "main": _step(getattr(main, "step", None))}
    if type(main).__name__ == "GluonLaunch":
        d["geom"] = [[g[0], g[1], g[2]] for g in main.geom]
        d["kws"] = main.key_weights_shape
        d["trace_slots"] = main.trace_slots
    pp = plan.prepass
    d["prepass"] = None if pp is None else dict(step=_step(pp.step), kv=list(pp.kv_shape), w=pp.key_weights_shape)
    return d


def _digest(d) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _env(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _problems(ops, knobs):
    """(name, plan) for every problem of the grid on the current (forced) architecture."""
    for (B, Hq, Hkv, Sq, Sk), dt, D, causal, sec, layout, lse in itertools.product(
            SHAPES, [torch.bfloat16, torch.float16, torch.float32], [8, 64, 96, 128, 256], [False, True],
            ["no", "self", "explicit"], ["bhsd", "bshd"], [False, True]):
        if (sec == "self" and Sq != Sk) or (dt == torch.float32 and D not in (64, 128)):
            continue
        if layout == "bshd" and (D not in (64, 128) or lse):
            continue
        shp = (lambda h, s: (B, h, s, D)) if layout == "bhsd" else (lambda h, s: (B, s, h, D))
        q, k, v = torch.empty(shp(Hq, Sq), dtype=dt), torch.empty(shp(Hkv, Sk), dtype=dt), torch.empty(shp(Hkv, Sk), dtype=dt)
        sk = torch.full((B,), Sk, dtype=torch.int32) if sec != "no" else None
        sq = torch.full((B,), Sq, dtype=torch.int32) if sec == "explicit" else None
        name = f"{B}x{Hq}/{Hkv}x{Sq}x{Sk}x{D}-{str(dt)[6:]}-c{int(causal)}-{sec}-{layout}-lse{int(lse)}"
        yield name, ops.dense_plan(q, k, v, sq, sk, causal, D ** -0.5, layout == "bshd", sec != "no", lse)
    for env, val in ENV_KNOBS:
        with _env(env, val):
            for (B, Hq, Hkv, Sq, Sk), D, causal, sec in itertools.product(SHAPES[:4], [64, 128], [False, True],
                                                                         ["no", "self"]):
                if sec == "self" and Sq != Sk:
                    continue
                q, k = torch.empty(B, Hq, Sq, D, dtype=torch.bfloat16), torch.empty(B, Hkv, Sk, D, dtype=torch.bfloat16)
                sk = torch.full((B,), Sk, dtype=torch.int32) if sec != "no" else None
                yield (f"env-{env}={val}-{B}x{Hq}/{Hkv}x{Sq}x{Sk}x{D}-c{int(causal)}-{sec}",
                       ops.dense_plan(q, k, k, None, sk, causal, D ** -0.5, False, sec != "no", True))
    for sw in SWITCHES:
        with knobs.override(**sw):
            for (B, Hq, Hkv, Sq, Sk), D, causal in itertools.product(SHAPES[:4], [64, 128], [False, True]):
                q, k = torch.empty(B, Hq, Sq, D, dtype=torch.bfloat16), torch.empty(B, Hkv, Sk, D, dtype=torch.bfloat16)
                yield (f"sw-{sorted(sw.items())}-{B}x{Hq}/{Hkv}x{Sq}x{Sk}x{D}-c{int(causal)}",
                       ops.dense_plan(q, k, k, None, None, causal, D ** -0.5, False, False, True))
    for D, causal, lse, dt in itertools.product([64, 128, 72], [False, True], [False, True],
                                                [torch.bfloat16, torch.float32]):
        cu = torch.tensor([0, 100, 1100, 1300], dtype=torch.int32)
        q, k = torch.empty(1300, 8, D, dtype=dt), torch.empty(1300, 2, D, dtype=dt)
        yield (f"varlen-{D}-c{int(causal)}-lse{int(lse)}-{str(dt)[6:]}",
               ops.varlen_plan(q, k, k, cu, cu, 1000, 1000, causal, D ** -0.5, lse))


def digests() -> dict:
    """{arch: {problem: digest}}; forces each architecture by patching the Problem's device_arch."""
    import flashcore.problem as problem
    from flashcore import ops
    from flashcore.plan import knobs

    saved = problem.device_arch
    out = {}
    try:
        for arch_name, arch in ARCHS.items():
            problem.device_arch = lambda device, arch=arch: arch
            out[arch_name] = {name: _digest(describe(plan)) for name, plan in _problems(ops, knobs)}
    finally:
        problem.device_arch = saved
    return out


def overlay_path(minor: str) -> str:
    return os.path.join(HERE, "data", f"plans-triton-{minor}.json")


def pinned() -> dict:
    """The pins for the installed Triton: Triton 3.6's, with this version's overlay (if any) on top."""
    from flashcore.plan.tables import triton_minor

    with open(PINNED) as f:
        pins = json.load(f)
    minor = triton_minor()
    if minor != BASE_TRITON and os.path.exists(overlay_path(minor)):
        with open(overlay_path(minor)) as f:
            for arch, plans in json.load(f).items():
                pins[arch].update(plans)
    return pins


def main(argv=None) -> int:
    from flashcore.plan.tables import triton_minor

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="re-pin: write the digests to tests/data/plans.json (under "
                   "Triton 3.6) or this Triton's differences to tests/data/plans-triton-<major.minor>.json")
    a = p.parse_args(argv)
    d = digests()
    if a.write:
        minor = triton_minor()
        if minor == BASE_TRITON:
            path, doc = PINNED, d
        else:
            with open(PINNED) as f:
                base = json.load(f)
            path = overlay_path(minor)
            doc = {arch: {n: v for n, v in plans.items() if base.get(arch, {}).get(n) != v} for arch, plans in d.items()}
        with open(path, "w") as f:
            json.dump(doc, f, indent=0, sort_keys=True)
            f.write("\n")
        print("wrote", path)
    print(sum(len(v) for v in d.values()), "plans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
