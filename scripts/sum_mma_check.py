"""Fast path, same run: the Gluon kernel's row sums by adds (shipped) vs by a 64x8 MMA against a ones
tile (``GluonLaunch.fast_sum_mma``, the secure non-causal kernel's way), with SDPA for reference. Each
variant's output is checked against float64 on a small shape and against the other on every shape.

    PYTHONPATH=src python scripts/sum_mma_check.py --out $OUT
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import flashcore  # noqa: E402
from flashcore import api, kernels  # noqa: E402
from flashcore.kernels import hopper_fwd  # noqa: E402
from gpu_check import environment  # noqa: E402

SHAPES = [(4, 16, 1024, 64, False), (2, 16, 1024, 64, False), (16, 16, 2048, 64, False), (4, 32, 4096, 64, False),
          (4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (1, 32, 16384, 128, False),
          (1, 32, 16384, 128, True)]


def _use(sum_mma: bool):
    api._CALLS.clear()
    kernels._PLANS.clear()
    hopper_fwd.GluonLaunch.fast_sum_mma = sum_mma


def timed(fn, rounds=3):
    return min(do_bench(fn, warmup=25, rep=100) for _ in range(rounds)) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/sweeps")
    ap.add_argument("--tag", default="fast-sum-mma")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(99)
    q, k, v = (torch.randn(2, 8, 1000, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    checks = {}
    for mma in (False, True):
        _use(mma)
        for causal in (False, True):
            out = flashcore.attention(q, k, v, causal=causal)
            ref = flashcore.reference.attention(q, k, v, causal=causal)
            checks[f"sum_mma={mma} causal={causal}"] = ((out.double() - ref).norm() / ref.norm()).item()
    print(json.dumps(checks))
    rows = []
    for B, H, S, D, causal in SHAPES:
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        row = dict(shape=[B, H, S, D, causal])
        row["sdpa_us"] = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        outs = {}
        for _ in range(2):  # two alternating rounds
            for mma in (False, True):
                _use(mma)
                outs[mma] = flashcore.attention(q, k, v, causal=causal)
                t = timed(lambda: flashcore.attention(q, k, v, causal=causal))
                key = "mma_us" if mma else "adds_us"
                row[key] = min(row.get(key, 1e30), t)
        row["rel_diff"] = ((outs[True].double() - outs[False].double()).norm() / outs[False].double().norm()).item()
        rows.append(row)
        print(json.dumps(row), flush=True)
    _use(False)
    with open(os.path.join(args.out, f"{args.tag}.json"), "w") as f:
        json.dump(dict(env=environment(), checks=checks, rows=rows), f, indent=1)
    print(f"\n{'shape':<24}{'sdpa':>9}{'adds':>9}{'mma':>9}{'mma/adds':>10}{'sdpa/mma':>10}")
    for r in rows:
        B, H, S, D, c = r["shape"]
        print(f"{f'{B}x{H}x{S}x{D}' + (' causal' if c else ''):<24}{r['sdpa_us']:>9.1f}{r['adds_us']:>9.1f}"
              f"{r['mma_us']:>9.1f}{r['adds_us'] / r['mma_us']:>10.3f}{r['sdpa_us'] / r['mma_us']:>10.3f}")


if __name__ == "__main__":
    main()
