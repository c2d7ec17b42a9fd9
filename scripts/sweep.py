"""Config sweep on the GPU: candidate tile configs on the ANCHORS shapes, beside SDPA in the same
run, fast and secure (true length = S_max) paths. Writes ``sweep.json`` to --out and prints a
table. Used to choose kernels/configs.py (docs/perf-notes.md has the history).

Each candidate is planned once (``ops.dense_call``) and replayed, so its host cost is the replay's
(a few µs), hidden behind do_bench's L2 flush. Seed shapes are also timed inside a CUDA graph
(``do_bench_cudagraph``: kernel time with warm L2, no host at all).

    PYTHONPATH=src python scripts/sweep.py --out $OUT [--quick]
"""
import argparse, json, os, sys, time, subprocess
import torch, triton
from triton.testing import do_bench, do_bench_cudagraph
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from flashcore import ops  # noqa: E402
from flashcore.kernels.configs import Config, config_name  # noqa: E402

SEED = [(1, 8, 512, 64, False), (1, 16, 1024, 64, False), (4, 16, 1024, 64, False), (16, 16, 2048, 64, False)]
LARGE = [(4, 32, 4096, 64, False), (4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
         (1, 32, 16384, 128, False), (1, 32, 16384, 128, True)]
C = lambda m, n, w, s, pre=True, **kw: Config(m, n, w, s, v_prepass=pre, **kw)  # noqa: E731
FAST = {
    64: [C(128, 64, 8, 3), C(64, 64, 4, 3), C(64, 128, 4, 3), C(128, 128, 8, 3), C(256, 64, 16, 3), C(256, 128, 16, 2)],
    128: [C(128, 64, 8, 3), C(128, 128, 8, 3), C(256, 32, 16, 3), C(256, 64, 16, 2)],
}
SECURE = {  # v_prepass=False: the select-in-the-loop kernel of the previous sessions, for contrast
    64: [C(128, 64, 8, 3), C(64, 64, 4, 3), C(64, 64, 4, 3, False)],
    128: [C(128, 64, 8, 3), C(128, 128, 8, 3), C(256, 32, 16, 3), C(128, 128, 8, 3, False)],
}

# --d64: the head-dim-64 question of perf-notes v7 (issue 2's seed bar). Register caps that let two
# 256-thread programs share an SM, TMA loads, and the Gluon kernel at D=64, beside the current table.
D64 = [C(128, 64, 8, 3), C(64, 128, 4, 3), C(64, 64, 4, 3), C(128, 64, 8, 3, tma=True),
       C(128, 128, 8, 2, maxnreg=128), C(128, 128, 8, 2, tma=True, maxnreg=128),
       C(64, 128, 4, 2, maxnreg=168), C(64, 128, 4, 2, tma=True, maxnreg=168),
       Config(128, 128, 4, 3, kernel="gluon_ws"), Config(128, 128, 4, 2, kernel="gluon_ws"),
       # 64-key tiles for the Gluon kernel (perf-notes v12.2): shorter steps, deeper rings
       Config(128, 64, 4, 4, kernel="gluon_ws"), Config(128, 64, 4, 6, kernel="gluon_ws"),
       Config(192, 64, 4, 4, kernel="gluon_ws")]


name = config_name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="large shapes only at 4096")
    ap.add_argument("--d64", action="store_true", help="head dim 64 only, with the D64 candidates (fast path)")
    ap.add_argument("--current", action="store_true",
                    help="with --d64: also the D=128 shapes, planner's choice (fast and secure) beside the Triton 128x64")
    ap.add_argument("--gluon-only", action="store_true",
                    help="with --d64: only the planner's choice and the Gluon candidates")
    a = ap.parse_args()
    d64 = [None] + [c for c in D64 if c.kernel == "gluon_ws"] if a.gluon_only else D64
    rows = []
    t_start = time.time()
    for (B, H, S, D, causal) in SEED + LARGE:
        if (a.quick and S > 4096) or (a.d64 and D != 64 and not a.current):
            continue
        seed = (B, H, S, D, causal) in SEED
        g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1e3) % 2**31)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
        res = {"shape": [B, H, S, D, causal], "fast": {}, "secure": {}}
        sd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
        res["sdpa_default"] = do_bench(sd, return_mode="median") * 1e3
        if seed:
            res["sdpa_default_graph"] = do_bench_cudagraph(sd, return_mode="median") * 1e3
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        if a.d64 and D == 64:
            todo = ((False, d64),)
        elif a.d64:
            todo = ((False, [None, C(128, 64, 8, 3)]), (True, [None]))
        else:
            todo = ((False, FAST[D]), (True, SECURE[D] if not seed else []))
        for secure, cands in todo:
            for cfg in cands:
                try:
                    call = ops.dense_call(q, k, v, None, lens if secure else None, causal, D ** -0.5, False, secure,
                                          False, config=cfg, validate=False)
                    fn = lambda: call(q, k, v, None, lens if secure else None)[0]  # noqa: E731
                    out = fn().float()
                    err = ((out - ref).norm() / ref.norm()).item()
                    if not err < 2e-2:
                        res["secure" if secure else "fast"][name(cfg)] = f"WRONG {err:.3g}"
                        continue
                    r = {"us": do_bench(fn, return_mode="median") * 1e3}
                    if seed:
                        r["graph_us"] = do_bench_cudagraph(fn, return_mode="median") * 1e3
                    res["secure" if secure else "fast"][name(cfg)] = r
                except Exception as e:  # noqa: BLE001 - a config that does not fit is data, not a crash
                    res["secure" if secure else "fast"][name(cfg)] = f"FAIL {type(e).__name__}: {str(e)[:100]}"
        rows.append(res)
        ok = {k_: v_ for k_, v_ in res["fast"].items() if isinstance(v_, dict)}
        best = min(ok, key=lambda k_: ok[k_]["us"])
        line = (f"{B}x{H}x{S}x{D}{'c' if causal else ' '} sdpa {res['sdpa_default']:8.1f} | best fast {best:>14} "
                f"{ok[best]['us']:8.1f} ({res['sdpa_default'] / ok[best]['us']:.3f}x)")
        if seed:
            gb = min(ok, key=lambda k_: ok[k_]["graph_us"])
            line += f" | graph sdpa {res['sdpa_default_graph']:.1f} best {gb} {ok[gb]['graph_us']:.1f}"
        sec = {k_: v_ for k_, v_ in res["secure"].items() if isinstance(v_, dict)}
        if sec:
            sb = min(sec, key=lambda k_: sec[k_]["us"])
            line += f" | best secure {sb} {sec[sb]['us']:.1f} ({ok[best]['us'] / sec[sb]['us']:.3f} of fast)"
        print(line, f"[{time.time() - t_start:.0f}s]", flush=True)
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               sha=os.environ.get("FLASHCORE_GIT_SHA") or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                                                         text=True).stdout.strip(),
               date=time.strftime("%Y-%m-%d %H:%M:%S"), method="do_bench median (L2 flushed), us; seed shapes also "
               "do_bench_cudagraph (graph_us)")
    with open(os.path.join(a.out, "sweep.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
