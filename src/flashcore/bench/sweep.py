"""``flashcore bench sweep``: candidate tile configs on a bench suite (default ``all``) on the GPU, beside SDPA in the
same run, fast and secure (true length = S_max) paths. Writes ``sweep.json`` to ``--out`` and prints a line per
shape. Used to choose the tables in ``flashcore.plan.tables`` (docs/perf-notes.md has the history).

Each candidate is planned once (``ops.dense_plan`` with the config) and replayed, so its host cost is the replay's
(a few µs), hidden behind do_bench's L2 flush. Seed-suite shapes are also timed inside a CUDA graph
(``do_bench_cudagraph``: kernel time with warm L2, no host at all). The sweep runs self-attention shapes
(Hkv = Hq, Sk = Sq, dense) with D in ``FAST``; other shapes of a suite file are reported and skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench, do_bench_cudagraph

from .. import ops
from ..plan.tables import Config, config_name
from .results import collect_environment
from .runner import tool_shapes
from .suites import SEED

C = lambda m, n, w, s, pre=True, **kw: Config(m, n, w, s, v_prepass=pre, **kw)  # noqa: E731

FAST = {
    64: [C(128, 64, 8, 3), C(64, 64, 4, 3), C(64, 128, 4, 3), C(128, 128, 8, 3), C(256, 64, 16, 3), C(256, 128, 16, 2)],
    128: [C(128, 64, 8, 3), C(128, 128, 8, 3), C(256, 32, 16, 3), C(256, 64, 16, 2)],
}
SECURE = {  # v_prepass=False: the select-in-the-loop kernel of the previous sessions, for contrast
    64: [C(128, 64, 8, 3), C(64, 64, 4, 3), C(64, 64, 4, 3, False)],
    128: [C(128, 64, 8, 3), C(128, 128, 8, 3), C(256, 32, 16, 3), C(128, 128, 8, 3, False)],
}

# --d64: the head-dim-64 question of perf-notes v7 (issue 2's seed bar). Register caps that let two
# 256-thread programs share an SM, TMA loads, and the Gluon kernel at D=64, beside the current table.
D64 = [C(128, 64, 8, 3), C(64, 128, 4, 3), C(64, 64, 4, 3), C(128, 64, 8, 3, tma=True),
       C(128, 128, 8, 2, maxnreg=128), C(128, 128, 8, 2, tma=True, maxnreg=128),
       C(64, 128, 4, 2, maxnreg=168), C(64, 128, 4, 2, tma=True, maxnreg=168),
       Config(128, 128, 4, 3, kernel="gluon_ws"), Config(128, 128, 4, 2, kernel="gluon_ws"),
       # 64-key tiles for the Gluon kernel (perf-notes v12.2): shorter steps, deeper rings
       Config(128, 64, 4, 4, kernel="gluon_ws"), Config(128, 64, 4, 6, kernel="gluon_ws"),
       Config(192, 64, 4, 4, kernel="gluon_ws")]


name = config_name


def register(tools) -> None:
    p = tools.add_parser("sweep", help="candidate tile configs beside SDPA on a suite (fast and secure); sweep.json",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="all", metavar="SUITE",
                   help="seed | large | all | path of a JSON suite file (default: all)")
    p.add_argument("--out", default=os.environ.get("OUT", "."), metavar="DIR", help="where sweep.json goes ($OUT or .)")
    p.add_argument("--quick", action="store_true", help="sequence lengths up to 4096 only")
    p.add_argument("--d64", action="store_true", help="head dim 64 only, with the D64 candidates (fast path)")
    p.add_argument("--current", action="store_true",
                   help="with --d64: also the D=128 shapes, planner's choice (fast and secure) beside the Triton 128x64")
    p.add_argument("--gluon-only", action="store_true",
                   help="with --d64: only the planner's choice and the Gluon candidates")
    p.set_defaults(func=run)


def skip_reason(shape, quick: bool = False, d64: bool = False, current: bool = False):
    """Why the sweep does not run ``shape`` (None: it does)."""
    if shape.is_varlen or shape.gqa or shape.Sk != shape.Sq:
        return "the sweep runs dense self-attention shapes only (Hkv = Hq, Sk = Sq)"
    if shape.D not in FAST:
        return f"no candidates at head dim {shape.D} (FAST has {sorted(FAST)})"
    if quick and shape.Sq > 4096:
        return "--quick: sequence lengths up to 4096 only"
    if d64 and shape.D != 64 and not current:
        return "--d64: head dim 64 only (--current adds the others)"
    return None


def candidates(shape, d64: bool = False, current: bool = False, gluon_only: bool = False) -> tuple:
    """((secure, [config or None (the planner's choice)]), ...) to time on ``shape``."""
    if d64 and shape.D == 64:
        return ((False, [None] + [c for c in D64 if c.kernel == "gluon_ws"] if gluon_only else D64),)
    if d64:
        return ((False, [None, C(128, 64, 8, 3)]), (True, [None]))
    return ((False, FAST[shape.D]), (True, SECURE[shape.D] if shape not in SEED else []))


def run(a) -> int:
    shapes = tool_shapes("sweep", a.suite)
    if shapes is None:
        return 2
    rows = []
    t_start = time.time()
    for shape in shapes:
        why = skip_reason(shape, a.quick, a.d64, a.current)
        if why is not None:
            if not why.startswith("--"):  # the flags' own skips are expected; a suite file's shapes are news
                print(f"{shape.label}: skipped: {why}", flush=True)
            continue
        rows.append(sweep_shape(shape, candidates(shape, a.d64, a.current, a.gluon_only)))
        print(shape_line(rows[-1]), f"[{time.time() - t_start:.0f}s]", flush=True)
    env = dict(collect_environment(), method="do_bench median (L2 flushed), us; seed shapes also "
               "do_bench_cudagraph (graph_us)")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "sweep.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    for r in rows:
        print(json.dumps(r))
    return 0


def sweep_shape(shape, todo) -> dict:
    B, H, S, D, causal = shape.B, shape.Hq, shape.Sq, shape.D, shape.causal
    seed = shape in SEED
    g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1e3) % 2**31)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
    res = {"shape": [B, H, S, D, causal], "seed": seed, "fast": {}, "secure": {}}
    sd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    res["sdpa_default"] = do_bench(sd, return_mode="median") * 1e3
    if seed:
        res["sdpa_default_graph"] = do_bench_cudagraph(sd, return_mode="median") * 1e3
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    for secure, cands in todo:
        for cfg in cands:
            cell = res["secure" if secure else "fast"]
            try:
                plan = ops.dense_plan(q, k, v, None, lens if secure else None, causal, D ** -0.5, False, secure,
                                      False, config=cfg, validate=False)
                fn = lambda: plan(q, k, v, None, lens if secure else None)[0]  # noqa: E731
                out = fn().float()
                err = ((out - ref).norm() / ref.norm()).item()
                if not err < 2e-2:
                    cell[name(cfg)] = f"WRONG {err:.3g}"
                    continue
                r = {"us": do_bench(fn, return_mode="median") * 1e3}
                if seed:
                    r["graph_us"] = do_bench_cudagraph(fn, return_mode="median") * 1e3
                cell[name(cfg)] = r
            except Exception as e:  # noqa: BLE001 - a config that does not fit is data, not a crash
                cell[name(cfg)] = f"FAIL {type(e).__name__}: {str(e)[:100]}"
    return res


def shape_line(res: dict) -> str:
    """One shape's summary: SDPA, the best fast candidate (and its ratio), the best in a CUDA graph (seed
    shapes), the best secure candidate as a fraction of the best fast one."""
    B, H, S, D, causal = res["shape"]
    line = f"{B}x{H}x{S}x{D}{'c' if causal else ' '} sdpa {res['sdpa_default']:8.1f}"
    ok = {k_: v_ for k_, v_ in res["fast"].items() if isinstance(v_, dict)}
    if not ok:
        return line + " | no fast candidate ran: " + "; ".join(f"{k_} {v_}" for k_, v_ in res["fast"].items())
    best = min(ok, key=lambda k_: ok[k_]["us"])
    line += f" | best fast {best:>14} {ok[best]['us']:8.1f} ({res['sdpa_default'] / ok[best]['us']:.3f}x)"
    if res["seed"]:
        gb = min(ok, key=lambda k_: ok[k_]["graph_us"])
        line += f" | graph sdpa {res['sdpa_default_graph']:.1f} best {gb} {ok[gb]['graph_us']:.1f}"
    sec = {k_: v_ for k_, v_ in res["secure"].items() if isinstance(v_, dict)}
    if sec:
        sb = min(sec, key=lambda k_: sec[k_]["us"])
        line += f" | best secure {sb} {sec[sb]['us']:.1f} ({ok[best]['us'] / sec[sb]['us']:.3f} of fast)"
    return line
