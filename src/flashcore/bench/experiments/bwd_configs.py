"""Backward configurations (``plan.backward.BwdConfig``) timed per shape on saved forward tensors (issue 23).

Each configuration runs ``ops.dense_backward`` with an explicit config on one forward's ``out``/``lse`` (bf16,
``bshd``), timed with ``triton.testing.do_bench`` (median, L2 flushed); SDPA's backward of the same problem
(default backend choice, ``enable_gqa``) is timed in the same run. TFLOP/s count the backward as 2.5x the
forward's FLOPs (the FlashAttention convention; causal halves them). ``err_vs_auto`` is each gradient's relative
difference to the planner's configuration; ``err_vs_fp32`` the gradients' relative error against an fp32 SDPA
backward of the same inputs (for the FA rule's scale; the GPU tests check the rule itself).

    python -m flashcore.bench.experiments.bwd_configs --out $OUT [--head-dim 256]

First list (v26): D=256, whose planner row (32x64w4s1-64x32w4s1) spills 2.4 KB per thread in dK/dV when
compiled for sm_90a; the candidates were chosen by compiling on the CPU (no or few spills). D=128 and 64 (v29):
the Gluon dK/dV kernel's forms (``-gluonMxNwWsS``) against the Triton kernel's row.
"""
from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import flashcore
from ... import ops
from ...plan.backward import parse_bwd_config_name
from ..results import collect_environment
from . import parser

# v33 (issue 23's D=128 shapes with and without GQA, and the D=64 ones): the shapes of the fused-dQ, operand and
# program-order sweeps (--set v33; bench/results/sweeps/bwd-v33-h200.json)
V33_SHAPES = {
    128: [(4, 32, 32, 4096, False), (4, 32, 32, 4096, True), (1, 32, 32, 16384, True), (2, 32, 8, 4096, True),
          (8, 32, 8, 2048, True), (1, 32, 8, 16384, True), (2, 16, 16, 2048, False), (8, 16, 16, 1024, True)],
    64: [(8, 16, 16, 2048, False), (8, 16, 8, 2048, True), (4, 32, 32, 4096, True)],
}
V39_SHAPES = {  # D=64: the wide fused form (v39) over issue 23's and the training bench's D=64 shapes, GQA and not
    64: [(8, 16, 16, 2048, False), (8, 16, 16, 2048, True), (4, 32, 32, 4096, False), (4, 32, 32, 4096, True),
         (1, 16, 16, 16384, True), (8, 16, 2, 2048, False), (8, 16, 8, 2048, True), (4, 64, 8, 4096, True),
         (2, 16, 8, 8192, True)],
}
SHAPES = {  # head dim: [(B, Hq, Hkv, S, causal)]
    256: [(4, 16, 16, 4096, False), (4, 16, 16, 4096, True)],
    # v29: the Gluon dK/dV kernel against the Triton one (issue 23's shapes, and one GQA training shape)
    128: [(4, 32, 32, 4096, False), (4, 32, 32, 4096, True), (1, 32, 32, 16384, False), (1, 32, 32, 16384, True),
          (2, 32, 8, 4096, True)],
    64: [(8, 16, 16, 2048, False), (4, 32, 32, 4096, True)],
}
CANDIDATES = {
    256: ["auto", "16x32w4s2-32x32w4s2", "32x64w8s2-64x64w8s2", "16x64w8s2-64x64w8s2"],
    # v33: the planner (dQ inside the Gluon kernel without GQA) against the dQ-kernel form
    128: ["auto", "64x128w8s4-128x64w8s4-gluon64x128w8s2"],
    # v38: the fused form with 128-query steps (launch.sm90_bwd.WIDE_STEP), compiled without spills on the CPU, not yet
    # timed or run on a GPU
    64: ["auto", "32x128w4s3-64x64w4s3-atomic-gluon64x64w4s3", "32x128w4s3-64x64w4s3-atomic-gluon64x128w8s2",
         "32x128w4s3-64x64w4s3-atomic-gluon128x128w8s2"],
}


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def run_shape(B, Hq, Hkv, S, causal, D, names) -> list:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(B * 1000 + S + D)
    q = torch.randn(B, S, Hq, D, generator=gen, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, S, Hkv, D, generator=gen, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, S, Hkv, D, generator=gen, device=dev, dtype=torch.bfloat16)
    do = torch.randn(B, S, Hq, D, generator=gen, device=dev, dtype=torch.bfloat16)
    scale = D ** -0.5
    out, lse = flashcore.attention(q, k, v, causal=causal, scale=scale, layout="bshd", return_lse=True)
    flops = 4 * B * Hq * S * S * D * (0.5 if causal else 1.0) * 2.5

    def sdpa_grads(dtype):
        qt, kt, vt = (t.detach().to(dtype).transpose(1, 2).requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale, enable_gqa=Hq != Hkv)
        return o, (qt, kt, vt)

    ref_o, ref_in = sdpa_grads(torch.float32)
    ref = torch.autograd.grad(ref_o, ref_in, do.float().transpose(1, 2))
    ref = [g.transpose(1, 2) for g in ref]
    rows, base = [], None
    for name in names:
        cfg = parse_bwd_config_name(name)
        fn = lambda: ops.dense_backward(do, q, k, v, out, lse, None, causal, scale, True, False, config=cfg)  # noqa: E731
        try:
            grads = fn()
            base = grads if base is None else base
            us = do_bench(fn, rep=60) * 1e3
            rows.append(dict(shape=[B, Hq, Hkv, S, D, causal], cfg=name, bwd_us=us, bwd_tflops=flops / us / 1e6,
                             err_vs_auto=[_rel(g, b) for g, b in zip(grads, base)],
                             err_vs_fp32=[_rel(g, r) for g, r in zip(grads, ref)]))
        except Exception as e:  # a config that does not compile or fit: say so, go on
            rows.append(dict(shape=[B, Hq, Hkv, S, D, causal], cfg=name, error=f"{type(e).__name__}: {e}"[:300]))
        print(json.dumps(rows[-1]), flush=True)
    o, ins = sdpa_grads(torch.bfloat16)
    g = do.transpose(1, 2)
    us = do_bench(lambda: torch.autograd.grad(o, ins, g, retain_graph=True), rep=60) * 1e3
    grads = [t.transpose(1, 2) for t in torch.autograd.grad(o, ins, g, retain_graph=True)]
    rows.append(dict(shape=[B, Hq, Hkv, S, D, causal], cfg="sdpa", bwd_us=us, bwd_tflops=flops / us / 1e6,
                     err_vs_fp32=[_rel(a, r) for a, r in zip(grads, ref)]))
    print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--head-dim", type=int, nargs="+", default=[256])
    ap.add_argument("--set", choices=["default", "v33", "v39"], default="default",
                    help="the shape list (v33: V33_SHAPES, v39: V39_SHAPES)")
    ap.add_argument("--candidates", nargs="+", help="config names instead of the head dim's CANDIDATES")
    ap.add_argument("--head-chunk", type=int, help="launch.sm90_bwd.HEAD_CHUNK for this run (program order)")
    ap.add_argument("--ds-sets", type=int, help="launch.sm90_bwd.DS_SETS for this run (fused dQ's dS^T sets)")
    ap.add_argument("--rs-dv", type=int, choices=(0, 1),
                    help="non-causal fused forms: P^T as dV's register operand (1, launch.sm90_bwd.FUSED_FORM's "
                         "choice) or through shared memory (0)")
    ap.add_argument("--widen-asm", type=int, choices=(0, 1),
                    help="the wide D=64 step: its 16-bit P^T widened back by integer operations on pairs (1, "
                         "launch.sm90_bwd.WIDE_STEP's choice since v40) or by .to(float32) (0, v39)")
    ap.add_argument("--split-group", type=int, choices=(0, 1),
                    help="fused forms with GQA, every step: a program per query head, dK/dV added in fp32 (1), or per "
                         "K/V head (0); default: launch.triton_bwd.SPLIT_GROUP's choice by step")
    a = ap.parse_args(argv)
    from ...launch import sm90_bwd, triton_bwd
    if a.split_group is not None:
        triton_bwd.SPLIT_GROUP = {False: bool(a.split_group), True: bool(a.split_group)}
    if a.head_chunk:
        sm90_bwd.HEAD_CHUNK = a.head_chunk
    if a.ds_sets:
        sm90_bwd.DS_SETS = a.ds_sets
    if a.widen_asm is not None:
        sm90_bwd.WIDE_STEP = {**sm90_bwd.WIDE_STEP, "widen_asm": bool(a.widen_asm)}
    if a.rs_dv is not None:
        sm90_bwd.FUSED_FORM = {**sm90_bwd.FUSED_FORM, False: dict(sm90_bwd.FUSED_FORM[False], rs_dv=bool(a.rs_dv))}
    res = dict(env=collect_environment(), what=__doc__.split("\n")[0], rows=[],
               knobs=dict(head_chunk=sm90_bwd.HEAD_CHUNK, ds_sets=sm90_bwd.DS_SETS,
                          fused_form={str(k): v for k, v in sm90_bwd.FUSED_FORM.items()},
                          wide_step=sm90_bwd.WIDE_STEP))
    shapes = dict(v33=V33_SHAPES, v39=V39_SHAPES).get(a.set, SHAPES)
    for D in a.head_dim:
        for B, Hq, Hkv, S, causal in shapes[D]:
            res["rows"] += run_shape(B, Hq, Hkv, S, causal, D, a.candidates or CANDIDATES[D])
            torch.cuda.empty_cache()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"bwd_configs_d{'-'.join(map(str, a.head_dim))}.json"), "w") as f:
        json.dump(res, f, indent=1)
    for r in res["rows"]:
        print(f"{str(r['shape']):34s} {r['cfg']:24s} {r.get('bwd_us', float('nan')):9.1f} us "
              f"{r.get('bwd_tflops', float('nan')):6.1f} TF  {r.get('error', '')[:60]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
