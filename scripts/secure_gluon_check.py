"""Development timing for the constant-time warp-specialised Gluon kernel (kernels/hopper_secure.py) on one H100: the
secure mode on the Gluon kernel vs on the Triton kernel vs the fast path, same run, on the ANCHORS
shapes at true length = S_max (issue 4's bar: secure >= 0.9x of fast on the large shapes). Each
variant's output is checked against the fast path's before timing. Correctness against float64 is
the GPU test suite (tests/test_hopper_secure.py, run by gpu_check.py).

    PYTHONPATH=src python scripts/secure_gluon_check.py --out $OUT
"""
import argparse, copy, json, os, sys, time

import torch
from triton.testing import do_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
from flashcore import ops  # noqa: E402
from flashcore.kernels import configs  # noqa: E402

SHAPES = [(1, 16, 1024, 64, False), (4, 16, 1024, 64, False), (16, 16, 2048, 64, False), (4, 32, 4096, 64, False),
          (4, 32, 4096, 64, True), (4, 16, 1024, 128, False), (4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
          (1, 32, 16384, 128, False), (1, 32, 16384, 128, True)]


def variants(D, causal, bh, S):
    fast = configs.hopper(D, 2, causal, False, S, S, bh)
    sec_triton = configs.hopper_triton(D, 2, causal, True, S, S, bh)
    return [("fast", fast, False), ("secure_triton", sec_triton, True), ("secure_gluon", configs.gluon_secure(D), True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp")
    args = ap.parse_args()
    rows = []
    for B, H, S, D, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(1234)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        row = dict(shape=[B, H, S, D, causal])
        ref = None
        for name, cfg, secure in variants(D, causal, B * H, S):
            try:
                call = ops.dense_call(q, k, v, None, lens if secure else None, causal, D ** -0.5, False, secure, False,
                                      config=cfg, validate=False)
                row[name + "_kernel"] = type(call.plan.main).__name__ if call.plan.main is not None else "tma"
                fn = lambda: call(q, k, v, None, lens if secure else None)
                o = fn()[0].double()
                if ref is None:
                    ref = o
                row[name + "_err_vs_fast"] = ((o - ref).norm() / ref.norm()).item()
                us = do_bench(fn, warmup=50, rep=300) * 1e3
                row[name + "_us"], row[name + "_tflops"] = us, flops / us / 1e6
            except Exception as exc:  # a variant that fails is a result, not a crash
                row[name + "_error"] = repr(exc)[:400]
        if D in (64, 128):  # cost attribution: the Gluon kernel without V sanitising / without the key mask
            base = ops.dense_call(q, k, v, None, lens, causal, D ** -0.5, False, True, False,
                                  config=configs.gluon_secure(D), validate=False).plan.main.step
            o = torch.empty_like(q)
            for name, skip in (("dev_nofix", 1), ("dev_nofix_nomask", 3)):
                st = copy.copy(base)
                st.constexprs, st.compiled = dict(base.constexprs, DEV_SKIP=skip), None
                fn = lambda: st.run((q, k, v, o, q, lens, lens), q.device)
                fn()
                row[name + "_us"] = do_bench(fn, warmup=50, rep=300) * 1e3
        for key in list(row):
            if key.startswith("secure") and key.endswith("_us") and "fast_us" in row:
                row[key.replace("_us", "_vs_fast")] = row["fast_us"] / row[key]
        rows.append(row)
        cells = "  ".join(f"{kk[:-3]}={vv:8.1f}" for kk, vv in row.items() if kk.endswith("_us"))
        errs = "  ".join(f"{kk}={str(vv)[:120]}" for kk, vv in row.items() if kk.endswith("_error"))
        print(f"{B}x{H}x{S}x{D}{'c' if causal else ' '} {cells} {errs}", flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__, git_sha=os.environ.get("FLASHCORE_GIT_SHA", "unknown"),
                date=time.strftime("%Y-%m-%d %H:%M:%S"))
    path = os.path.join(args.out, f"secure-gluon-{meta['git_sha']}.json")
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print("\nshape              gluon/fast  triton/fast  gluon TFLOP/s  nofix/fast  nofix_nomask/fast")
    nan = float("nan")
    for r in rows:
        B, H, S, D, c = r["shape"]
        f = r.get("fast_us", nan)
        print(f"{B}x{H}x{S}x{D}{'c' if c else ' ':<6} {r.get('secure_gluon_vs_fast', nan):>10.3f}"
              f" {r.get('secure_triton_vs_fast', nan):>12.3f} {r.get('secure_gluon_tflops', nan):>12.0f}"
              f" {f / r.get('dev_nofix_us', nan):>11.3f} {f / r.get('dev_nofix_nomask_us', nan):>14.3f}")
    print("wrote", path)


if __name__ == "__main__":
    main()
