"""Two consumer warpgroups or three, fast and secure, on this Triton's toolchain: the D=64 question of issue 24
(ptxas 13, which Triton 3.7-3.9 bring, spills the three-warpgroup form at 160 registers; ptxas 12.8 with Triton
3.6 does not: tests/conftest.REGISTER_MISSES). Each shape is timed with every config forced (``ops.dense_plan``
with ``config=``), fast and secure (true length = S_max), beside SDPA, rounds interleaved, each checked against
SDPA's output first. Writes ``wg-count-triton-<version>.json`` to --out and prints a table last.

    python -m flashcore.bench.experiments.wg_count --out $OUT [--shapes 16x16x2048x64,4x32x4096x64] [--rounds 3]
"""
import json
import os
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from ... import ops
from ...plan.tables import parse_config_name
from ..results import collect_environment
from ..suites import parse_shapes
from . import interleaved_rounds, parser

CONFIGS = ("gluon_ws_128x128s3", "gluon_ws_192x128s3")  # two consumer warpgroups, three
SHAPES = "16x16x2048x64,4x32x4096x64,1x32x16384x64"


def time_shape(B, H, S, D, causal, rounds):
    g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1e3) % 2**31)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
    fns, errs = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}, {}
    for secure in (False, True):
        for name in CONFIGS:
            tag = f"{'secure' if secure else 'fast'}:{name}"
            try:
                plan = ops.dense_plan(q, k, v, None, lens if secure else None, causal, D ** -0.5, False, secure,
                                      False, config=parse_config_name(name), validate=False)
                fn = (lambda p=plan, s=secure: p(q, k, v, None, lens if s else None)[0])
                errs[tag] = ((fn().float() - ref).norm() / ref.norm()).item()
                if errs[tag] < 2e-2:
                    fns[tag] = fn
            except Exception as e:  # noqa: BLE001 - a config that cannot run here is data
                errs[tag] = f"{type(e).__name__}: {str(e)[:160]}"
    rounds_us, us = interleaved_rounds(fns, rounds,
                                       lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3)
    return dict(shape=[B, H, S, D], causal=causal, us=us, rounds=rounds_us, errs=errs)


def main(argv=None):
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    rows = []
    for s in parse_shapes(a.shapes):
        rows.append(time_shape(s.B, s.Hq, s.Sq, s.D, s.causal, a.rounds))
        print(json.dumps(rows[-1]), flush=True)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"wg-count-triton-{triton.__version__}.json")
    with open(path, "w") as f:
        json.dump({"env": dict(collect_environment(), method="do_bench median (L2 flushed), median of rounds, us"),
                   "rows": rows}, f, indent=1)
    names = ["sdpa"] + [f"{m}:{c}" for m in ("fast", "secure") for c in CONFIGS]
    print(f"triton {triton.__version__}: us (do_bench median of {a.rounds} rounds); 2wg = 128x128s3, 3wg = 192x128s3")
    print(f"{'shape':>16} " + " ".join(f"{n.replace('gluon_ws_128x128s3', '2wg').replace('gluon_ws_192x128s3', '3wg'):>11}"
                                       for n in names))
    for r in rows:
        cells = [f"{r['us'][n]:11.1f}" if n in r["us"] else f"{'-':>11}" for n in names]
        print(f"{'x'.join(map(str, r['shape'])) + ('c' if r['causal'] else ''):>16} " + " ".join(cells))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
