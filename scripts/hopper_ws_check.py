"""Development timing for the warp-specialised Gluon kernel (kernels/hopper_fwd.py) on one H100:
Gluon vs Triton kernel vs SDPA on the ANCHORS shapes (same run, each checked against SDPA's
output), and per-call host cost / CUDA-graph time on small shapes. Writes JSON. Correctness
against float64 is the GPU test suite (tests/test_hopper_gluon.py, run by gpu_check.py).

    PYTHONPATH=src python scripts/hopper_ws_check.py --out $OUT [--part time|host|all]
"""
import argparse, json, os, sys, time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
from flashcore import ops  # noqa: E402
from flashcore.kernels import configs  # noqa: E402

ANCHORS = [(1, 8, 512, 64, False), (1, 16, 1024, 64, False), (4, 16, 1024, 64, False), (16, 16, 2048, 64, False),
           (4, 32, 4096, 64, False), (4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
           (1, 32, 16384, 128, False), (1, 32, 16384, 128, True)]


def run_cfg(q, k, v, causal, cfg):
    call = ops.dense_call(q, k, v, None, None, causal, q.shape[-1] ** -0.5, False, False, False, config=cfg)
    return call(q, k, v, None, None)


def rel(a, ref):
    return ((a.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def time_all(shapes, variants):
    rows = []
    for B, H, S, D, causal in shapes:
        g = torch.Generator(device="cuda").manual_seed(1234)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        row = dict(shape=[B, H, S, D, causal])
        ref_o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        row["sdpa_default_us"] = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                          warmup=50, rep=300) * 1e3
        for name, cfg in variants(D, causal, B * H, S):
            try:
                o, _ = run_cfg(q, k, v, causal, cfg)
                err = rel(o, ref_o.double())
                us = do_bench(lambda: run_cfg(q, k, v, causal, cfg), warmup=50, rep=300) * 1e3
                row[name + "_us"], row[name + "_err"] = us, err
            except Exception as exc:  # a variant that does not compile is a result, not a crash
                row[name + "_error"] = repr(exc)[:300]
        for key in list(row):
            if key.endswith("_us"):
                row[key.replace("_us", "_tflops")] = flops / row[key] / 1e6
        rows.append(row)
        cells = "  ".join(f"{kk[:-3]}={vv:8.1f}" for kk, vv in row.items() if kk.endswith("_us"))
        print(f"{B}x{H}x{S}x{D}{'c' if causal else ' '} {cells}", flush=True)
    return rows


def variants(D, causal, bh, S):
    base = configs.hopper_triton(D, 2, causal, False, S, S, bh)
    from dataclasses import replace

    g = configs.gluon_ws(D)
    out = [("triton", base), ("gluon", g)]
    for st in ((2, 4) if D == 64 else (3,)):
        out.append((f"gluon_s{st}", replace(g, num_stages=st)))
    return out


SMALL = [(1, 8, 512, 64), (1, 16, 1024, 64), (4, 16, 1024, 64), (1, 8, 512, 128), (1, 16, 1024, 128),
         (4, 16, 1024, 128), (2, 16, 2048, 128), (8, 16, 2048, 128)]


def host_and_graph():
    """Per-call host cost (eager loop, no sync inside) and GPU-only time (CUDA graph) on small
    shapes, Triton vs Gluon kernel, plus a profile of the Gluon launch path."""
    import cProfile, io, pstats
    from triton.testing import do_bench_cudagraph

    rows = []
    for B, H, S, D in SMALL:
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        row = dict(shape=[B, H, S, D])
        for name, cfg in (("triton", configs.hopper_triton(D, 2, False, False, S, S, B * H)),
                          ("gluon", configs.gluon_ws(D))):
            call = ops.dense_call(q, k, v, None, None, False, D ** -0.5, False, False, False, config=cfg)
            fn = lambda: call(q, k, v, None, None)
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            n = 300
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            row[name + "_host_us"] = (t1 - t0) / n * 1e6
            row[name + "_graph_us"] = do_bench_cudagraph(fn, rep=200) * 1e3
        rows.append(row)
        print(f"{B}x{H}x{S}x{D}".ljust(16), "  ".join(f"{kk}={vv:7.1f}" for kk, vv in row.items() if kk != "shape"),
              flush=True)
    q, k, v = (torch.randn(1, 8, 512, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    call = ops.dense_call(q, k, v, None, None, False, 128 ** -0.5, False, False, False, config=configs.gluon_ws(128))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        call(q, k, v, None, None)
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(12)
    print(buf.getvalue()[-3000:])
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--part", default="all", choices=["time", "host", "all"])
    a = ap.parse_args()
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               git_sha=os.environ.get("FLASHCORE_GIT_SHA", "unknown"), date=time.strftime("%Y-%m-%d %H:%M"))
    if a.part in ("host", "all"):
        res["host"] = host_and_graph()
    if a.part in ("time", "all"):
        res["timing"] = time_all(ANCHORS, variants)
    if a.part in ("time", "all"):
        print(f"{'shape':22s} {'sdpa':>8s} {'triton':>8s} {'gluon':>8s}  gluon/sdpa triton/sdpa")
        for r in res["timing"]:
            B, H, S, D, c = r["shape"]
            sd, tr, gw = r["sdpa_default_us"], r.get("triton_us", float("nan")), r.get("gluon_us", float("nan"))
            print(f"{B}x{H}x{S}x{D}{'c' if c else ''}".ljust(22), f"{sd:8.1f} {tr:8.1f} {gw:8.1f}  {sd / gw:9.2f} {sd / tr:9.2f}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"hopper_ws_{a.part}.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
