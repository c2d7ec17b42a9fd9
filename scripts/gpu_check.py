"""All the GPU work of the core issue in one run: the GPU test matrix (bf16 included), then
flashcore against SDPA (default, cuDNN, flash) on the ANCHORS shapes, same-run ratios, JSON.

    PYTHONPATH=src python scripts/gpu_check.py --out bench/results
"""
import argparse, datetime, json, os, platform, subprocess, sys, time

import torch
import triton
from triton.testing import do_bench
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
import flashcore  # noqa: E402

SEED = [(1, 8, 512, 64, False), (1, 16, 1024, 64, False), (4, 16, 1024, 64, False), (16, 16, 2048, 64, False)]
LARGE = [(4, 32, 4096, 64, False), (4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
         (1, 32, 16384, 128, False), (1, 32, 16384, 128, True)]


def sdpa(backend):
    def run(q, k, v, causal):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def fc_fast(q, k, v, causal):
    return flashcore.attention(q, k, v, causal=causal)


def fc_secure(q, k, v, causal, _lens={}):
    B, S = q.shape[0], q.shape[2]
    lens = _lens.setdefault((B, S), torch.full((B,), S, dtype=torch.int32, device=q.device))
    # validate_seqlens=False: time the kernel, not the eager range check's host sync
    return flashcore.attention(q, k, v, causal=causal, secure=True, seqlens_k=lens, validate_seqlens=False)


BACKENDS = {"flashcore": fc_fast, "flashcore_secure": fc_secure, "sdpa_default": sdpa(None),
            "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION)}


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def check_and_time(shape):
    B, H, S, D, causal = shape
    g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1e6) % 2**31)  # fresh seed each run
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    # float64 reference on a slice (2 heads of batch 0) keeps the check cheap at 16k
    sl = (slice(0, 1), slice(0, 2))
    ref = flashcore.reference.attention(q[sl], k[sl], v[sl], causal=causal)
    row = {"shape": dict(B=B, H=H, S=S, D=D, causal=causal)}
    flops = 4 * B * H * S * S * D / (2 if causal else 1)
    for name, fn in BACKENDS.items():
        try:
            out = fn(q, k, v, causal)
            err = rel_err(out[sl], ref)
            if not err < 2e-2:
                row[name] = {"error": f"wrong answer: rel err {err:.3g}"}
                continue
            ms = do_bench(lambda: fn(q, k, v, causal), warmup=25, rep=200, return_mode="median")
            row[name] = {"us": ms * 1e3, "tflops": flops / (ms * 1e-3) / 1e12, "rel_err": err}
        except Exception as e:  # noqa: BLE001 - an unsupported backend is a finding, not a crash
            row[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    base = row.get("sdpa_default", {}).get("us")
    for name in BACKENDS:
        if base and "us" in row[name]:
            row[name]["speedup_vs_sdpa_default"] = base / row[name]["us"]
    if flops < 2e10:  # launch cost matters here: wall time of one eager call, synchronised
        for name in ("flashcore", "sdpa_default"):
            if "us" in row[name]:
                row[name]["host_latency_us"] = host_latency_us(lambda: BACKENDS[name](q, k, v, causal))
    fast, sec = row["flashcore"].get("us"), row["flashcore_secure"].get("us")
    if fast and sec:
        row["secure_throughput_fraction"] = fast / sec
    return row


def host_latency_us(fn, n=200):
    import statistics
    fn(); torch.cuda.synchronize()
    samples = []
    for _ in range(n):
        t = time.perf_counter(); fn(); torch.cuda.synchronize(); samples.append((time.perf_counter() - t) * 1e6)
    return statistics.median(samples)


def environment():
    p = torch.cuda.get_device_properties(0)
    # the device copy of the tree has no .git: the caller passes the SHA it ran
    sha = os.environ.get("FLASHCORE_GIT_SHA") or subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip() or "unknown"
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=ROOT).stdout.strip())
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return dict(gpu=p.name, sm_count=p.multi_processor_count, driver_clocks=smi, torch=torch.__version__,
                triton=triton.__version__, cudnn=torch.backends.cudnn.version(), cuda=torch.version.cuda,
                python=platform.python_version(), flashcore=flashcore.__version__, git_sha=sha, git_dirty=dirty,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                timing="triton.testing.do_bench median (CUDA events, L2 flushed before each call), bf16, [B,H,S,D]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--skip-tests", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing to do (the CPU tests are `pytest`)", file=sys.stderr)
        return 2
    doc = {"environment": environment()}
    if not a.skip_tests:
        t = time.time()
        r = subprocess.run([sys.executable, "-m", "pytest", "tests/test_gpu.py", "tests/test_hopper_gluon.py", "tests/test_secure_gluon.py", "-q", "-p", "no:cacheprovider"],
                           cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
        tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]
        doc["gpu_tests"] = {"exit_code": r.returncode, "summary": tail, "seconds": round(time.time() - t, 1)}
        print(f"GPU tests: {tail}", flush=True)
    doc["rows"] = []
    for shape in SEED + LARGE:
        doc["rows"].append(check_and_time(shape))
        print(".", end="", flush=True)
    print()
    os.makedirs(a.out, exist_ok=True)
    name = f"gpu_check-{doc['environment']['gpu'].replace(' ', '_')}-{doc['environment']['date'][:10]}-{doc['environment']['git_sha'][:8]}.json"
    with open(os.path.join(a.out, name), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {os.path.join(a.out, name)}")
    hdr = f"{'shape':28s} {'flashcore':>10s} {'secure':>9s} {'sdpa':>9s} {'cudnn':>9s} {'flash':>9s} {'fc/sdpa':>8s} {'sec/fast':>8s}"
    print(hdr)
    for row in doc["rows"]:
        s = row["shape"]
        label = f"{s['B']}x{s['H']}x{s['S']}x{s['D']}{' causal' if s['causal'] else ''}"
        us = lambda n: f"{row[n]['us']:9.1f}" if "us" in row[n] else f"{'ERR':>9s}"
        ratio = row["flashcore"].get("speedup_vs_sdpa_default", float("nan"))
        print(f"{label:28s} {us('flashcore'):>10s} {us('flashcore_secure')} {us('sdpa_default')} {us('sdpa_cudnn')} {us('sdpa_flash')} "
              f"{ratio:8.3f} {row.get('secure_throughput_fraction', float('nan')):8.3f}")
    for row in doc["rows"]:
        if "host_latency_us" in row["flashcore"]:
            s = row["shape"]
            print(f"host latency of one eager call, {s['B']}x{s['H']}x{s['S']}x{s['D']}: flashcore "
                  f"{row['flashcore']['host_latency_us']:.1f} us, SDPA {row['sdpa_default'].get('host_latency_us', float('nan')):.1f} us")
    return 0 if doc.get("gpu_tests", {}).get("exit_code", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
