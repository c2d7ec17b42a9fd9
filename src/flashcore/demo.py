"""`flashcore demo`: the main job. Checks flashcore against the float64 reference on a few shapes
(and, on a GPU, against PyTorch SDPA with timings) and prints a short table."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from . import api, reference

SHAPES = [  # B, Hq, Hkv, S, D, causal
    (1, 4, 4, 128, 64, False),
    (2, 8, 2, 200, 128, True),
    (1, 4, 1, 77, 40, True),
]


def register(sub) -> None:
    p = sub.add_parser("demo", help="check flashcore against the float64 reference (and SDPA on a GPU)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh each run)")
    p.add_argument("--reference-only", action="store_true",
                   help="on a CPU, do not run the kernels under the Triton interpreter (then no kernel runs, "
                        "and the demo says so)")
    p.set_defaults(func=run)


def rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _rerun_under_interpreter(args) -> int:
    """The interpreter must be chosen before triton is imported, so run the demo again in a child process
    with TRITON_INTERPRET=1 (the kernels then run on CPU tensors, in fp32)."""
    argv = [sys.executable, "-m", "flashcore", "demo"] + (["--seed", str(args.seed)] if args.seed is not None else [])
    return subprocess.call(argv, env={**os.environ, "TRITON_INTERPRET": "1"})


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    cuda = torch.cuda.is_available()
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1" and not args.reference_only:
        return _rerun_under_interpreter(args)
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    seed = args.seed if args.seed is not None else int(time.time() * 1e3) % 2**31
    gen = torch.Generator(device=device).manual_seed(seed)
    # Without a GPU the Triton kernels run under the interpreter (TRITON_INTERPRET=1).
    backend = "auto" if cuda else ("reference" if args.reference_only else "triton")
    table = Table(title=f"flashcore demo on {torch.cuda.get_device_name() if cuda else 'CPU'} ({dtype}, backend={backend}, seed={seed})")
    for col in ("shape B×Hq/Hkv×S×D", "causal", "kernel", "rel err vs float64", "SDPA rel err", "flashcore µs",
                "SDPA µs"):
        table.add_column(col, justify="right")
    ok = True
    kernels = set()
    for B, Hq, Hkv, S, D, causal in SHAPES:
        q = torch.randn(B, Hq, S, D, device=device, generator=gen).to(dtype)
        k = torch.randn(B, Hkv, S, D, device=device, generator=gen).to(dtype)
        v = torch.randn(B, Hkv, S, D, device=device, generator=gen).to(dtype)
        out = api.attention(q, k, v, causal=causal, backend=backend)
        plan = api.plan_attention(q, k, v, causal=causal, backend=backend)
        kernel = plan.selection.kernel if plan is not None else "none (float64 reference)"
        kernels.add(kernel)
        ref = reference.attention(q, k, v, causal=causal)
        err = rel_err(out, ref)
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
        ok &= err < tol
        sd_err, fc_us, sd_us = "-", "-", "-"
        if cuda:
            import torch.nn.functional as F
            from triton.testing import do_bench

            sd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            sd_err = f"{rel_err(sd(), ref):.2e}"
            fc_us = f"{do_bench(lambda: api.attention(q, k, v, causal=causal), return_mode='median') * 1e3:.1f}"
            sd_us = f"{do_bench(sd, return_mode='median') * 1e3:.1f}"
        table.add_row(f"{B}×{Hq}/{Hkv}×{S}×{D}", str(causal), kernel, f"{err:.2e}" + ("" if err < tol else " FAIL"), sd_err, fc_us, sd_us)
    console.print(table)
    ran = sorted(k for k in kernels if not k.startswith("none"))
    if not ran:
        console.print("[yellow]no kernel ran[/yellow]: the float64 reference was compared with itself "
                      "(run without --reference-only, or on a CUDA GPU, to check the kernels)")
        return 0 if ok else 1
    console.print(f"[green]all checks passed[/green] (kernels: {', '.join(ran)})" if ok else "[red]a check failed[/red]")
    return 0 if ok else 1
