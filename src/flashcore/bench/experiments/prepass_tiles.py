"""The secure pre-passes' tile configurations (issue 25 §3; docs/perf-notes.md v45): rows per program and warps of
the K/V pre-pass (``attn_secure_sanitize_kv_kernel``) and the V pre-pass (``attn_secure_zero_v_padding_kernel``),
each timed beside a plain device copy of the same bytes (``torch.Tensor.copy_`` of K and V: one read and one write,
the floor a pre-pass can reach) in one process, cold L2 (``bench.timing.Timer``), the median of ``--rounds`` rounds,
every variant once per round in turn.

Before timing, every configuration's outputs are compared bit for bit with the shipped configuration's on random
inputs and random lengths (the pre-passes' values depend on positions only, not on the tiling), outputs poisoned
with NaN first; a configuration that differs is reported and not timed.

    python -m flashcore.bench.experiments.prepass_tiles --out $OUT [--shapes 4x32x4096x128,...] \
        [--configs 64x4,32x4,32x8,16x4] [--rounds 5] [--dtype bfloat16|float16|float32]

Writes ``prepass-tiles.json`` and prints a table: µs and the fraction of the copy's bandwidth.
"""
from __future__ import annotations

import json
import time

import torch

from ...kernels.secure.prepass import attn_secure_sanitize_kv_kernel, attn_secure_zero_v_padding_kernel
from ...launch import secure_prepass as sp
from ...runtime import KernelStep
from ..suites import parse_shapes
from ..timing import Timer
from . import interleaved_rounds, parser, print_us_table, write_rows

SHAPES = "1x8x512x64,4x16x1024x64,16x16x2048x64,4x16x1024x128,4x32x4096x128,1x32x16384x128"
CONFIGS = "64x4,64x8,32x4,32x8,16x4"


def _parse_config(text: str) -> tuple[int, int]:
    rows, warps = text.split("x")
    return int(rows), int(warps)


def _steps(kind: str, k, v, lens, block_s: int, warps: int):
    """(callable, outputs) of one pre-pass launch with ``block_s`` rows per program and ``warps`` warps."""
    B, Hkv, S, D = k.shape
    strides = k.stride()[:3]
    if kind == "kv":
        ks, vs = torch.empty_like(k), torch.empty_like(v)
        w = torch.empty(sp.key_weights_shape(B, S), dtype=k.dtype, device=k.device)
        grid, args, ce = sp.build_prepass_kv(k, v, ks, vs, w, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv,
                                             k_strides=strides, v_strides=strides)
        outs, fn, n_ptrs = (ks, vs, w), attn_secure_sanitize_kv_kernel, 6
        ptrs = (k, v, ks, vs, w, lens)
    else:
        vs = torch.empty_like(v)
        grid, args, ce = sp.build_prepass(v, vs, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv, v_strides=strides)
        outs, fn, n_ptrs = (vs,), attn_secure_zero_v_padding_kernel, 3
        ptrs = (v, vs, lens)
    ce = dict(ce, BLOCK_S=block_s)
    grid = (-(-S // block_s), grid[1])
    step = KernelStep(fn, grid, args, n_ptrs, ce, warps, 1)
    return (lambda: step.run(ptrs, k.device)), outs


def time_shape(shape, configs, rounds, timer, dtype=torch.bfloat16):
    B, H, S, D = shape.B, shape.Hkv, shape.Sk, shape.D
    g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1e3) % 2**31)
    k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    lens = torch.randint(0, S + 1, (B,), device="cuda", dtype=torch.int32, generator=g)
    kc, vc = torch.empty_like(k), torch.empty_like(v)
    fns = {"copy K+V": lambda: (kc.copy_(k), vc.copy_(v)), "copy V": lambda: vc.copy_(v)}
    mismatch = {}
    for kind in ("kv", "v"):
        ref = None
        for name in configs:
            bs, warps = _parse_config(name)
            tag = f"{kind}:{name}"
            try:
                fn, outs = _steps(kind, k, v, lens, bs, warps)
                for o in outs:
                    o.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                got = [o.clone() for o in outs]
                if ref is None:
                    ref = got
                bits = torch.int32 if k.element_size() == 4 else torch.int16
                same = all(torch.equal(a.view(bits), b.view(bits)) for a, b in zip(got, ref))
                if not same:
                    mismatch[tag] = "differs from the first configuration's output"
                    continue
                fns[tag] = fn
            except Exception as e:  # noqa: BLE001 - a configuration that cannot run here is data
                mismatch[tag] = f"{type(e).__name__}: {str(e)[:200]}"
    rounds_us, us = interleaved_rounds(fns, rounds, lambda fn: timer.stats([fn], flush=True)["median_us"])
    return dict(shape=[B, H, S, D], dtype=str(dtype).replace("torch.", ""), lens=lens.tolist(), us=us, rounds=rounds_us, errors=mismatch,
                of_copy={n: (us["copy K+V" if n.startswith("kv:") else "copy V"] / u) for n, u in us.items()
                         if n.startswith(("kv:", "v:"))})


def main(argv=None):
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--shapes", metavar="S", default=SHAPES, help="BxHkvxSxD list (as the bench's shapes)")
    ap.add_argument("--configs", metavar="C", default=CONFIGS,
                    help="ROWSxWARPS list; the first is the reference for the bits")
    ap.add_argument("--rounds", metavar="N", type=int, default=5)
    ap.add_argument("--dtype", metavar="T", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                    help="bfloat16 (default), float16 or float32")
    a = ap.parse_args(argv)
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    timer = Timer()
    rows = []
    for s in parse_shapes(a.shapes):
        rows.append(time_shape(s, configs, a.rounds, timer, getattr(torch, a.dtype)))
        print(json.dumps(rows[-1]), flush=True)
    path = write_rows(a.out, "prepass-tiles.json", f"bench.timing.Timer medians (cold L2), median of {a.rounds} "
                      "rounds, us", rows)
    names = ["copy K+V", "copy V"] + [f"{k}:{c}" for k in ("kv", "v") for c in configs]
    print_us_table("us (fraction of the copy's bandwidth); '-': failed or differs (see errors in the JSON)", rows,
                   names, lambda r: "x".join(map(str, r["shape"])), "of_copy", 16)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
