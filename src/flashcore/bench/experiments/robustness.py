"""Robustness of the kernels on the GPU: compute-sanitizer (memcheck, racecheck, synccheck) over every
kernel family, and concurrent calls from several threads.

* ``sanitize``: runs ``workloads`` (below) in a child process under each compute-sanitizer tool and records
  the tool's error summary and its first findings. Shapes are the bench's seed and large families at reduced
  size (the sanitizer slows kernels by 10-1000x), and each workload is checked against the float64 reference,
  so a kernel that misbehaves only under the tool is also seen.
* ``threads``: 8 threads x different shapes (both kernels, fast and secure, GQA, varlen) calling at once,
  each on its own stream, from an empty plan cache; every result is compared bitwise with a single-threaded
  run of the same call.

    python -m flashcore.bench.experiments.robustness --out $OUT [--tools memcheck racecheck synccheck]

Writes ``robustness-<date>.json`` (device, versions, git SHA, per tool and per check) and prints a table.
``workload`` (internal): the child process the sanitizer wraps.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import torch

import flashcore

from ...demo import rel_err
from ..results import collect_environment
from . import parser

# name, (B, Hq, Hkv, Sq, Sk, D, causal, dtype, secure). Which kernel runs is recorded from the plan.
DENSE = [
    ("seed-fast-d64", (2, 4, 4, 256, 256, 64, False, "bf16", False)),
    ("seed-fast-d128-causal", (1, 4, 4, 512, 512, 128, True, "bf16", False)),
    ("large-fast-d128-causal", (1, 8, 8, 1024, 1024, 128, True, "bf16", False)),
    ("gqa-causal-sq<sk", (1, 8, 2, 200, 333, 128, True, "bf16", False)),
    ("gqa-causal-sq>sk", (1, 8, 2, 333, 200, 64, True, "fp16", False)),
    ("triton-d96", (1, 4, 2, 300, 300, 96, True, "bf16", False)),
    ("triton-d256", (1, 2, 2, 200, 200, 256, False, "bf16", False)),
    ("triton-fp32", (1, 2, 1, 130, 130, 64, True, "fp32", False)),
    ("small-d40", (1, 2, 1, 77, 77, 40, True, "fp16", False)),
    ("secure-d128", (2, 4, 4, 512, 512, 128, False, "bf16", True)),
    ("secure-d128-causal", (2, 4, 4, 512, 512, 128, True, "bf16", True)),
    ("secure-d64-gqa", (2, 8, 2, 384, 384, 64, True, "bf16", True)),
    ("secure-triton-d96", (2, 4, 2, 200, 200, 96, False, "bf16", True)),
]
VARLEN = [("varlen-causal-gqa", ([100, 0, 257, 1, 64], 8, 2, 128, True)),
          ("varlen-d64", ([33, 300, 7], 4, 4, 64, False))]
MODULE = "flashcore.bench.experiments.robustness"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {"bf16": 1.2e-2, "fp16": 2e-3, "fp32": 2e-5}


def _dense_call(spec, seed):
    B, Hq, Hkv, Sq, Sk, D, causal, dt, secure = spec
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h, s: torch.randn(B, h, s, D, device="cuda", generator=g).to(DTYPES[dt])
    q, k, v = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk)
    kw = dict(causal=causal)
    if secure:
        kw.update(secure=True, seqlens_k=torch.randint(1, Sk + 1, (B,), device="cuda", dtype=torch.int32, generator=g))
    return (lambda: flashcore.attention(q, k, v, **kw)), (lambda: flashcore.reference.attention(q, k, v, **kw)), \
        (lambda: flashcore.plan_attention(q, k, v, **kw))


def _varlen_call(spec, seed):
    lengths, Hq, Hkv, D, causal = spec
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, Hq, D, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(total, Hkv, D, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(total, Hkv, D, device="cuda", generator=g).to(torch.bfloat16)
    cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32, device="cuda")
    m = max(lengths)
    return (lambda: flashcore.attention_varlen(q, k, v, cu, cu, m, m, causal=causal)), \
        (lambda: flashcore.reference.attention_varlen(q, k, v, cu, cu, m, m, causal=causal)), (lambda: None)


def calls(seed: int = 0):
    """(name, run, reference, plan, tolerance) of every workload."""
    out = []
    for i, (name, spec) in enumerate(DENSE):
        out.append((name, *_dense_call(spec, seed + i), TOL[spec[7]]))
    for i, (name, spec) in enumerate(VARLEN):
        out.append((name, *_varlen_call(spec, seed + 100 + i), TOL["bf16"]))
    return out


def ws_control() -> bool:
    """The smallest Gluon warp_specialize kernel (kernels/sm90/ws_control.py): a sanitizer control."""
    from ...kernels.sm90.ws_control import ws_control_kernel

    out = torch.full((192,), -1, dtype=torch.int32, device="cuda")
    ws_control_kernel[(4,)](out, num_warps=4)
    torch.cuda.synchronize()
    want = torch.cat([torch.arange(128), torch.arange(32), torch.arange(32) + 1]).to(out)
    return bool(torch.equal(out, want))


# The racecheck controls (kernels/sm90/ws_control.py): the barrier control's forms, by the switches
# (PROLOGUE, IN_DEFAULT, IN_WORKER), and the hand-written CUDA copy of the dispatch (racecheck_dispatch.cu), by its
# (prologue, in_default) barriers and their barrier id. Each runs alone under racecheck, so a report names the form that caused it.
BARRIER_FORMS = {"none": (0, 0, 0), "prologue": (1, 0, 0), "in-default": (0, 1, 0), "in-worker": (0, 0, 1)}
CUDA_FORMS = {"none": (0, 0, 0), "prologue": (1, 0, 0), "in-default": (0, 1, 0), "prologue-id5": (1, 0, 5),
              "in-default-id5": (0, 1, 5)}
GLUON_WORKLOADS = ("large-fast-d128-causal", "secure-d128")


def ws_barrier_control(form: str) -> bool:
    """``ws_barrier_control_kernel`` in one form of BARRIER_FORMS: 132 launches of one program each (as many as the
    persistent kernel's programs), each writing its own row, every row checked."""
    from ...kernels.sm90.ws_control import ws_barrier_control_kernel

    prologue, in_default, in_worker = (bool(x) for x in BARRIER_FORMS[form])
    out = torch.full((132, 384), -1, dtype=torch.int32, device="cuda")
    for i in range(out.shape[0]):
        ws_barrier_control_kernel[(1,)](out[i], PROLOGUE=prologue, IN_DEFAULT=in_default, IN_WORKER=in_worker,
                                        num_warps=4)
    torch.cuda.synchronize()
    want = torch.cat([torch.arange(128), torch.arange(128), torch.arange(128) + 1]).to(out)
    return bool((out == want).all())


def build_cuda_control(workdir: str) -> str:
    """nvcc-built racecheck_dispatch.cu (the hand-written dispatch); returns the executable's path."""
    src = os.path.join(os.path.dirname(__file__), "racecheck_dispatch.cu")
    os.makedirs(workdir, exist_ok=True)
    exe = os.path.join(workdir, "racecheck_dispatch")
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    subprocess.run([nvcc, "-arch=sm_90a", "-O2", "-o", exe, src], check=True, capture_output=True, text=True)
    return exe


def racecheck_controls(timeout_s: int, workdir: str, gluon: bool = True) -> list:
    """racecheck on each control form alone, then (``gluon``) on the Gluon workloads alone (which of their reports
    follow which form)."""
    rows = []
    if gluon:
        rows.append(sanitize("racecheck", timeout_s, only="ws-control"))
        rows += [sanitize("racecheck", timeout_s, only=f"ws-barrier:{form}") for form in BARRIER_FORMS]
    try:
        exe = build_cuda_control(workdir)
        rows += [sanitize("racecheck", timeout_s, argv=[exe, *map(str, CUDA_FORMS[form])], label=f"cuda-dispatch:{form}")
                 for form in CUDA_FORMS]
    except (OSError, subprocess.CalledProcessError) as e:
        rows.append({"tool": "racecheck (cuda-dispatch)", "returncode": "not built", "errors": None, "workloads": [],
                     "findings": [f"{type(e).__name__}: {getattr(e, 'stderr', '') or e}"[:500]], "seconds": 0.0})
    if gluon:
        rows += [sanitize("racecheck", timeout_s, only=name) for name in GLUON_WORKLOADS]
    return rows


def workload(only: str | None = None) -> int:
    """Run every workload once and check it (the process compute-sanitizer wraps). ``only="ws-control"``:
    just the control kernel; ``only="ws-barrier:FORM"``: the barrier control in that form (BARRIER_FORMS);
    ``only=NAME``: the workload NAME alone."""
    if only and only.startswith("ws-barrier:"):
        form = only.split(":", 1)[1]
        ok = ws_barrier_control(form)
        print(f"WORKLOAD ws-barrier:{form} kernel=ws_barrier_control_kernel ok={ok}", flush=True)
        return 0 if ok else 1
    ok = ws_control()
    print(f"WORKLOAD ws-control kernel=ws_control_kernel ok={ok}", flush=True)
    if only == "ws-control":
        return 0 if ok else 1
    bad = [] if ok else ["ws-control"]
    for name, run, ref, plan, tol in calls(seed=1):
        if only and name != only:
            continue
        out = run()
        torch.cuda.synchronize()
        p = plan()
        err = rel_err(out, ref())
        kernel = p.selection.kernel if p is not None else "triton_fwd (varlen)"
        print(f"WORKLOAD {name} kernel={kernel} rel_err={err:.2e}", flush=True)
        if not err < tol:
            bad.append(name)
    print(f"WORKLOADS {'FAILED ' + ','.join(bad) if bad else 'OK'}", flush=True)
    return 1 if bad else 0


def sanitize(tool: str, timeout_s: int, only: str | None = None, argv: list | None = None,
             label: str | None = None) -> dict:
    """``tool`` over the workload process (``only``: one workload, see :func:`workload`), or over ``argv``."""
    exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    cmd = [exe, "--tool", tool, "--print-limit", "50", "--error-exitcode", "99"]
    if tool == "memcheck":
        cmd += ["--leak-check", "no"]  # torch's caching allocator keeps memory by design
    cmd += argv or ([sys.executable, "-m", MODULE, "workload"] + ([only] if only else []))
    only = label or only
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        text, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace"), "timeout"
    m = re.search(r"ERROR SUMMARY: (\d+) error", text) or re.search(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", text)
    findings = [ln for ln in text.splitlines() if ln.startswith("========= ") and "ERROR SUMMARY" not in ln
                and "COMPUTE-SANITIZER" not in ln][:60]
    return {"tool": tool + (f" ({only})" if only else ""), "returncode": rc, "errors": int(m.group(1)) if m else None,
            "workloads": [ln for ln in text.splitlines() if ln.startswith("WORKLOAD")],
            "findings": findings, "seconds": round(time.time() - t0, 1), "command": " ".join(cmd[:6])}


def threads_check(n_threads: int = 8, repeats: int = 10, work=None) -> dict:
    """Concurrent calls (each thread its own workload and stream; ``work``: entries of :func:`calls`, default
    the first ``n_threads``) against single-threaded results."""
    # (run in a fresh process: nothing is planned or compiled yet, so the threads race on planning too)
    work = calls(seed=7)[:n_threads] if work is None else work
    results, errors = {}, []
    barrier = threading.Barrier(len(work))

    def worker(i):
        try:
            barrier.wait()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                results[i] = [work[i][1]() for _ in range(repeats)]
            s.synchronize()
        except Exception as e:  # noqa: BLE001
            errors.append(f"{work[i][0]}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(len(work))]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rows = []
    for i, (name, run, ref, plan, tol) in enumerate(work):
        single = run()
        torch.cuda.synchronize()
        same = i in results and all(torch.equal(o, single) for o in results[i])
        rows.append({"workload": name, "bitwise_equal_to_single_thread": same, "rel_err": rel_err(single, ref())})
    return {"threads": len(work), "repeats": repeats, "errors": errors, "rows": rows,
            "ok": not errors and all(r["bitwise_equal_to_single_thread"] for r in rows),
            "seconds": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["workload"]:
        return workload(argv[1] if len(argv) > 1 else None)
    ap = parser(MODULE, __doc__)
    ap.add_argument("--tools", nargs="*", default=["memcheck", "racecheck", "synccheck"])
    ap.add_argument("--timeout", type=int, default=240, help="seconds per sanitizer tool")
    ap.add_argument("--no-threads", action="store_true")
    ap.add_argument("--racecheck-controls", action="store_true",
                    help="racecheck on each control form alone and on the Gluon workloads alone (after --tools)")
    ap.add_argument("--cuda-controls-only", action="store_true",
                    help="with --racecheck-controls: the hand-written CUDA forms only")
    args = ap.parse_args(argv)
    doc = {"environment": collect_environment(), "workloads": [n for n, _ in DENSE] + [n for n, _ in VARLEN],
           "sanitizer": [sanitize(t, args.timeout) for t in args.tools]}
    if args.racecheck_controls:
        doc["sanitizer"] += racecheck_controls(args.timeout, args.out, gluon=not args.cuda_controls_only)
    elif "racecheck" in args.tools:  # the control alone: which racecheck findings are Triton's dispatch
        doc["sanitizer"].append(sanitize("racecheck", args.timeout, only="ws-control"))
    if not args.no_threads:
        doc["threads"] = threads_check()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"robustness-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    for s in doc["sanitizer"]:
        print(f"{s['tool']:<10} errors={s['errors']} rc={s['returncode']} {s['seconds']}s "
              f"{(s['workloads'] or ['no workload output'])[-1]}")
        for ln in s["findings"][:6]:
            print("    " + ln[:200])
    if "threads" in doc:
        t = doc["threads"]
        print(f"threads    ok={t['ok']} ({t['threads']} threads x {t['repeats']}) errors={t['errors'][:3]}")
    print(f"wrote {path}")
    ok = all(s["errors"] == 0 and s["returncode"] == 0 for s in doc["sanitizer"]) and doc.get("threads", {}).get("ok", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
