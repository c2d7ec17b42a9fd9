"""``flashcore bench gpu-check``: all the GPU work of the core issue in one run.

First the GPU test matrix (pytest on ``GPU_TESTS``, bf16 included), then flashcore (fast, and secure at true
length = S_max) against SDPA (default dispatch, cuDNN, flash) on a bench suite (default ``all``): each backend
checked against the float64 reference (the bench's check), then timed with ``triton.testing.do_bench`` (median,
L2 flushed before each call), with same-run ratios and, on small shapes, the host latency of one eager call.
Writes ``gpu_check-<GPU>-<date>-<sha8>.json`` (device, versions, git SHA) to ``--out`` and prints a table last.

Exit codes: 0 the tests passed (or were skipped) and flashcore was correct wherever it ran; 1 otherwise; 2 a bad
suite or no CUDA device. On the device tool's copy of the tree (no ``.git``) pass the SHA in ``FLASHCORE_GIT_SHA``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import flashcore

from . import check, timing
from .backends import make_inputs, make_registry
from .results import collect_environment
from .runner import tool_shapes

GPU_TESTS = ("tests/test_gpu.py", "tests/test_hopper_gluon.py", "tests/test_secure_gluon.py")
BACKENDS = ("flashcore", "flashcore-secure", "sdpa-default", "sdpa-cudnn", "sdpa-flash")
FLASHCORE = ("flashcore", "flashcore_secure")
REP_MS = 200.0  # do_bench's rep per backend and shape (warm-up 25 ms)
TOLERANCE = 2e-2
TIMING = "triton.testing.do_bench median (CUDA events, L2 flushed before each call), bf16, [B,H,S,D]"


def key(name: str) -> str:
    """A backend's key in the rows (``flashcore-secure`` -> ``flashcore_secure``, as in earlier gpu_check files)."""
    return name.replace("-", "_")


def register(tools, default_out: str) -> None:
    p = tools.add_parser("gpu-check", help="the GPU tests, then flashcore vs SDPA (do_bench) on a suite; JSON",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="all", metavar="SUITE",
                   help="seed | large | all | path of a JSON suite file (default: all)")
    p.add_argument("--out", default=default_out, metavar="DIR", help=f"result directory (default: {default_out})")
    p.add_argument("--skip-tests", action="store_true", help="timing only (no pytest run)")
    p.add_argument("--tests-root", default=str(Path(flashcore.__file__).resolve().parents[2]), metavar="DIR",
                   help="the checkout whose tests/ the GPU tests come from (default: the one flashcore is imported from)")
    p.set_defaults(func=run)


def run(args) -> int:
    shapes = tool_shapes("gpu-check", args.suite)
    if shapes is None:
        return 2
    env = collect_environment()
    seed = int(time.time() * 1e6) % 2**31  # fresh inputs each run (recorded)
    doc = {"environment": env, "config": {"suite": args.suite, "backends": list(BACKENDS), "rep_ms": REP_MS,
                                          "tolerance": TOLERANCE, "seed": seed, "timing": TIMING}}
    if not args.skip_tests:
        doc["gpu_tests"] = run_gpu_tests(args.tests_root)
        print(f"GPU tests: {doc['gpu_tests']['summary']}", flush=True)
    registry = make_registry()
    available = {n: registry[n].available() for n in BACKENDS}
    doc["rows"] = []
    t0 = time.time()
    for i, shape in enumerate(shapes):
        doc["rows"].append(check_and_time(shape, registry, available, seed + i))
        print(f"{shape.label} [{time.time() - t0:.0f} s]", flush=True)
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, result_filename(env))
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")
    for line in table_lines(doc["rows"]):
        print(line)
    return exit_code(doc)


def run_gpu_tests(root: str) -> dict:
    """pytest on GPU_TESTS in ``root``, in a fresh process (the same interpreter and environment)."""
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "pytest", *GPU_TESTS, "-q", "-p", "no:cacheprovider"], cwd=root,
                       capture_output=True, text=True)
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]
    return {"exit_code": r.returncode, "summary": tail, "seconds": round(time.time() - t, 1)}


def check_and_time(shape, registry, available, seed: int, device="cuda") -> dict:
    """One row: every backend checked against the float64 reference, then timed (only if correct)."""
    inputs = make_inputs(shape, torch.bfloat16, device, seed=seed)
    pieces = check.reference_pieces(inputs)
    row = {"key": shape.key, "shape": shape.to_dict(), "flops": int(shape.flops)}
    for name in BACKENDS:
        b = registry[name]
        ok, why = available[name]
        status = b.check_shape(shape, inputs.q.dtype) if ok else ("unavailable", why)
        if status[0] != "ok":
            row[key(name)] = {"status": status[0], "error": status[1]}
            continue
        try:
            fn = b.make_fn(inputs)
            out = b.to_canonical(fn(), inputs)
            bad = check.describe_mismatch(out, inputs)
            correct, err = (False, math.nan) if bad else check.check_output(out, pieces, TOLERANCE)
            if not correct:
                row[key(name)] = {"status": "wrong", "error": bad or f"wrong answer: rel err {err:.3g}"}
                continue
            us = timing.do_bench_median_us(fn, REP_MS)
            row[key(name)] = {"status": "ok", "us": us, "tflops": shape.flops / (us * 1e-6) / 1e12, "rel_err": err}
            if shape.flops < timing.SMALL_FLOPS and name in ("flashcore", "sdpa-default"):
                # launch cost matters here: wall time of one eager call, synchronised
                row[key(name)]["host_latency_us"] = timing.host_latency_us([fn], calls=200, budget_s=30.0)
        except Exception as e:  # noqa: BLE001 - an unsupported backend is a finding, not a crash
            row[key(name)] = {"status": "error", "error": f"{type(e).__name__}: {str(e)[:200]}"}
    add_ratios(row)
    return row


def add_ratios(row: dict) -> None:
    """Same-run ratios: each backend's speed-up over SDPA's default dispatch, and secure / fast throughput."""
    base = row.get("sdpa_default", {}).get("us")
    for name in BACKENDS:
        if base and "us" in row.get(key(name), {}):
            row[key(name)]["speedup_vs_sdpa_default"] = base / row[key(name)]["us"]
    fast, sec = row.get("flashcore", {}).get("us"), row.get("flashcore_secure", {}).get("us")
    if fast and sec:
        row["secure_throughput_fraction"] = fast / sec


def result_filename(env: dict) -> str:
    """``gpu_check-<GPU name>-<date>-<sha8>.json`` (the names of the earlier files in bench/results)."""
    gpu = ((env.get("gpu") or {}).get("name") or "nogpu").replace(" ", "_")
    return f"gpu_check-{gpu}-{env['date'][:10]}-{(env.get('git_sha') or 'unknown')[:8]}.json"


def exit_code(doc: dict) -> int:
    """1 if the GPU tests failed or flashcore (fast or secure) was wrong, failed or missing on a shape, else 0."""
    if doc.get("gpu_tests", {}).get("exit_code", 0) != 0:
        return 1
    bad = [r["key"] for r in doc["rows"] for n in FLASHCORE if r[n]["status"] in ("wrong", "error", "unavailable")]
    return 1 if bad else 0


def table_lines(rows) -> list:
    """The summary printed last: us per backend, flashcore / SDPA and secure / fast; then the host latencies."""
    def us(r, n):
        return f"{r[n]['us']:9.1f}" if "us" in r[n] else f"{'ERR' if r[n]['status'] in ('wrong', 'error') else '-':>9s}"

    lines = [f"{'shape':28s} {'flashcore':>10s} {'secure':>9s} {'sdpa':>9s} {'cudnn':>9s} {'flash':>9s} "
             f"{'fc/sdpa':>8s} {'sec/fast':>8s}"]
    for r in rows:
        ratio = r["flashcore"].get("speedup_vs_sdpa_default", float("nan"))
        lines.append(f"{r['key']:28s} {us(r, 'flashcore'):>10s} {us(r, 'flashcore_secure')} {us(r, 'sdpa_default')} "
                     f"{us(r, 'sdpa_cudnn')} {us(r, 'sdpa_flash')} {ratio:8.3f} "
                     f"{r.get('secure_throughput_fraction', float('nan')):8.3f}")
    for r in rows:
        if "host_latency_us" in r["flashcore"]:
            lines.append(f"host latency of one eager call, {r['key']}: flashcore {r['flashcore']['host_latency_us']:.1f} us, "
                         f"SDPA {r['sdpa_default'].get('host_latency_us', float('nan')):.1f} us")
    return lines
