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
from flashcore import api, kernels  # noqa: E402
from flashcore.kernels import configs  # noqa: E402
from gpu_check import environment  # noqa: E402

LARGE = [(16, 16, 2048, 64, False), (4, 32, 4096, 64, False), (4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
         (1, 32, 16384, 128, False), (1, 32, 16384, 128, True)]
SMALL = [(1, 8, 512, 64, False), (1, 16, 1024, 64, False), (4, 16, 1024, 64, False), (4, 32, 4096, 64, True)]


# the secure kernels timed side by side: the Gluon kernel in secure form (the default on Hopper since v11)
# and the secure Triton kernel, each forced through FLASHCORE_SECURE_KERNEL
VARIANTS = {"gluon_ws": "gluon_ws", "triton": "triton"}


def _use(variant):
    """Route secure calls to ``variant``; plans are cached per signature, so drop them first."""
    api._CALLS.clear()
    kernels._PLANS.clear()
    os.environ[configs.SECURE_KERNEL_ENV] = VARIANTS[variant]


def _parts(q, k, v, causal, lens):
    """(pre-pass us, main kernel us) of the one secure plan cached now, timed alone."""
    (plan,) = kernels._PLANS.values()
    o = torch.empty_like(q)
    ks, vs, w = plan.prepass.run(k, v, lens) if plan.prepass is not None else (k, v, None)
    pre = timed(lambda: plan.prepass.run(k, v, lens)) if plan.prepass is not None else 0.0
    if plan.cfg.kernel != "gluon_ws":
        return pre, None
    kw = {} if w is None else dict(key_weights=w)
    return pre, timed(lambda: plan.main.run((q, ks, vs, o, None, lens, lens), q.device, **kw))


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
        for kernel in VARIANTS:
            _use(kernel)
            # validate_seqlens=False: time the kernels, not the eager range check's host sync
            call = lambda: flashcore.attention(q, k, v, causal=causal, secure=True, seqlens_k=lens,  # noqa: E731
                                               validate_seqlens=False)
            sec = call()
            torch.cuda.synchronize()
            err = ((sec.double() - fast.double()).norm() / fast.double().norm()).item()
            row[f"secure_{kernel}_us"] = timed(call)
            row[f"secure_{kernel}_prepass_us"], row[f"secure_{kernel}_main_us"] = _parts(q, k, v, causal, lens)
            row[f"secure_{kernel}_rel_err_vs_fast"] = err
            row[f"secure_{kernel}_ratio"] = row["fast_us"] / row[f"secure_{kernel}_us"]
        os.environ.pop(configs.SECURE_KERNEL_ENV)
        rows.append(row)
        print(json.dumps(row), flush=True)
    res = dict(env=environment(), rows=rows)
    path = os.path.join(args.out, f"{args.tag}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"\n{'shape':<24}{'fast us':>9}" + "".join(f"{v[:16]:>17}{'ratio':>6}{'main':>6}" for v in VARIANTS)
          + f"{'max err':>9}")
    for r in rows:
        B, H, S, D, c = r["shape"]
        name = f"{B}x{H}x{S}x{D}{' causal' if c else ''}"
        line = f"{name:<24}{r['fast_us']:>9.1f}"
        for v in VARIANTS:
            if f"secure_{v}_us" not in r:
                line += f"{'-':>17}{'':>6}{'':>6}"
                continue
            main = r[f"secure_{v}_main_us"]
            line += (f"{r[f'secure_{v}_us']:>17.1f}{r[f'secure_{v}_ratio']:>6.2f}"
                     + (f"{r['fast_us'] / main:>6.2f}" if main else f"{'':>6}"))
        err = max(r[k] for k in r if k.endswith("_rel_err_vs_fast"))
        print(line + f"{err:>9.1e}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
