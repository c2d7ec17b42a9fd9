"""Secure mode on the two kernels, same run: fast path vs secure on the Gluon kernel vs secure on the
Triton kernel (true length = S_max), on the ANCHORS shapes; each secure output is checked against the
fast one (same inputs, every row valid). Writes JSON, prints a table of secure/fast ratios.

    PYTHONPATH=src python scripts/secure_gluon_check.py --out $OUT [--shapes large|all]
"""
import argparse
import json
import os
import sys

import torch
from triton.testing import do_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import flashcore  # noqa: E402
from flashcore.kernels import configs  # noqa: E402
from gpu_check import environment  # noqa: E402

LARGE = [(16, 16, 2048, 64, False), (4, 32, 4096, 64, False), (4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
         (1, 32, 16384, 128, False), (1, 32, 16384, 128, True)]
SMALL = [(1, 8, 512, 64, False), (1, 16, 1024, 64, False), (4, 16, 1024, 64, False), (4, 32, 4096, 64, True)]


def timed(fn, rounds=3):
    return min(do_bench(fn, warmup=25, rep=100) for _ in range(rounds)) * 1e3  # us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/sweeps")
    ap.add_argument("--shapes", choices=("large", "all"), default="all")
    ap.add_argument("--tag", default="secure-gluon")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    shapes = LARGE + (SMALL if args.shapes == "all" else [])
    for B, H, S, D, causal in shapes:
        g = torch.Generator(device="cuda").manual_seed(4321 + S + D)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        row = dict(shape=[B, H, S, D, causal])
        fast = flashcore.attention(q, k, v, causal=causal)
        row["fast_us"] = timed(lambda: flashcore.attention(q, k, v, causal=causal))
        for kernel in ("gluon_ws", "triton"):
            os.environ[configs.SECURE_KERNEL_ENV] = kernel
            sec = flashcore.attention(q, k, v, causal=causal, secure=True, seqlens_k=lens)
            torch.cuda.synchronize()
            err = ((sec.double() - fast.double()).norm() / fast.double().norm()).item()
            row[f"secure_{kernel}_us"] = timed(lambda: flashcore.attention(q, k, v, causal=causal, secure=True,
                                                                           seqlens_k=lens))
            row[f"secure_{kernel}_rel_err_vs_fast"] = err
            row[f"secure_{kernel}_ratio"] = row["fast_us"] / row[f"secure_{kernel}_us"]
        os.environ.pop(configs.SECURE_KERNEL_ENV)
        rows.append(row)
        print(json.dumps(row), flush=True)
    res = dict(env=environment(), rows=rows)
    path = os.path.join(args.out, f"{args.tag}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"\n{'shape':<24}{'fast us':>10}{'sec gluon':>11}{'ratio':>7}{'sec triton':>12}{'ratio':>7}{'err':>9}")
    for r in rows:
        B, H, S, D, c = r["shape"]
        name = f"{B}x{H}x{S}x{D}{' causal' if c else ''}"
        print(f"{name:<24}{r['fast_us']:>10.1f}{r['secure_gluon_ws_us']:>11.1f}{r['secure_gluon_ws_ratio']:>7.2f}"
              f"{r['secure_triton_us']:>12.1f}{r['secure_triton_ratio']:>7.2f}"
              f"{r['secure_gluon_ws_rel_err_vs_fast']:>9.1e}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
