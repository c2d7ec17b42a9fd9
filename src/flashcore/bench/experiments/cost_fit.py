"""Fixed and per-unit costs of a kernel against SDPA's, from shape series (perf-notes v16): the time of a
persistent kernel over shapes that differ in one count only (key tiles per item, items per program) is a line,
and its intercept and slope say whether a gap is per step, per item or once per launch.

    python -m flashcore.bench.experiments.cost_fit [--config gluon_ws_128x128s3] [--rounds 3] --out $OUT
"""
import json
import os
import statistics

import numpy as np
import torch
import torch.nn.functional as F

from ... import ops
from ...plan.tables import parse_config_name
from .. import timing
from . import parser

D = 64
# (series, x, B, H, Sq, Sk): x is the count that varies; 132 SMs, 128-row items
SERIES = ([("keys", sk // 128, 1, 66, 1024, sk) for sk in (256, 512, 1024, 2048, 3072)]
          + [("items", n, 1, 33 * n // 2, 1024, 1024) for n in (2, 4, 6, 8)]
          + [("seed", 0, 4, 16, 1024, 1024)])


def main(argv=None):
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--config", default="auto", help="a config's sweep name, or auto (the planner's choice)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    try:
        cfg = None if a.config == "auto" else parse_config_name(a.config)
    except ValueError as e:
        raise SystemExit(f"--config: {e}") from None
    if a.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {a.rounds}")
    if not torch.cuda.is_available():
        raise SystemExit("cost_fit needs a CUDA device")
    timer = timing.Timer()
    rows = []
    for series, x, B, H, Sq, Sk in SERIES:
        q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, H, Sk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        o = torch.full_like(q, float("nan"))
        call = ops.dense_plan(q, k, v, None, None, False, D ** -0.5, False, False, False, out=o, config=cfg,
                              validate=False)
        ref = F.scaled_dot_product_attention(q, k, v).float()
        call(q, k, v, None, None, o)
        err = ((o.float() - ref).norm() / ref.norm()).item()
        fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v), "ours": lambda: call(q, k, v, None, None, o)}
        us = {n: [] for n in fns}
        for _ in range(a.rounds):
            for n, f in fns.items():
                us[n].append(statistics.median(timer.measure([f], flush=True, rep_ms=60)) * 1e3)
        r = dict(series=series, x=x, shape=[B, H, Sq, Sk, D], err=err, kernel=call.selection.explain(),
                 sdpa_us=min(us["sdpa"]), ours_us=min(us["ours"]), rounds=us)
        rows.append(r)
        print(json.dumps(r), flush=True)
    fits = {}
    for s in ("keys", "items"):
        pts = [r for r in rows if r["series"] == s]
        xs = np.array([r["x"] for r in pts], dtype=float)
        for n in ("sdpa", "ours"):
            slope, icpt = np.polyfit(xs, [r[f"{n}_us"] for r in pts], 1)
            fits[f"{s}/{n}"] = dict(intercept_us=icpt, slope_us=slope)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "cost_fit.json"), "w") as f:
        json.dump(dict(rows=rows, fits=fits, device=torch.cuda.get_device_name()), f, indent=1)
    print(f"\n{'series':>6} {'x':>3} {'shape':>20} {'sdpa':>8} {'ours':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['series']:>6} {r['x']:>3} {'x'.join(map(str, r['shape'])):>20} {r['sdpa_us']:8.2f} "
              f"{r['ours_us']:8.2f} {r['sdpa_us'] / r['ours_us']:6.3f}")
    print("fits (time = intercept + slope * x):")
    for k_, f_ in fits.items():
        print(f"  {k_:>12}: intercept {f_['intercept_us']:7.2f} us, slope {f_['slope_us']:7.3f} us")
    print("max error vs SDPA:", max(r["err"] for r in rows))


if __name__ == "__main__":
    main()
