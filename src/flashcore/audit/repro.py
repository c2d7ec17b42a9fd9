"""Gate: bit-reproducibility. One input, ``--runs`` calls (default 1000) per mode give identical output
bytes, and fresh processes (same seed, shifted allocations) reproduce the same bytes.

Modes: ``secure`` (attention(..., secure=True), query lengths = key lengths), ``secure_causal``,
``secure_cross`` (explicit seqlens_q), ``secure_cross_causal`` (the same, causal: the secret diagonal),
``secure_decode`` (attention_with_kvcache(..., secure=True): one query
token per sequence against the key lengths' cache), ``secure_prefill`` (the same with 128 query tokens: chunked
prefill), ``secure_decode_page16`` (the same from shuffled 16-position pages: the per-key page gather),
``secure_decode_fp8``, ``secure_decode_fp8_page16`` and ``secure_decode_fp8_page128`` (secure decode from a
float8_e4m3fn cache, contiguous and as shuffled 16- and 128-position pages), ``fast_dense`` (secure=False on the
padded tensors) and ``fast_varlen`` (attention_varlen on the packed true lengths). Each output is compared bitwise
on the GPU with the first one (integer views, so NaN payloads and signed zeros count) and hashed with
sha256 on the host. Exit code: 0 identical everywhere, 1 a difference (or a mode that raised), 2 no GPU.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from . import _inputs as I

MODES = ("secure", "secure_causal", "secure_cross", "secure_cross_causal", "secure_decode", "secure_prefill",
         "secure_decode_page16", "secure_decode_fp8", "secure_decode_fp8_page16", "secure_decode_fp8_page128",
         "fast_dense", "fast_varlen")
# the paged decode modes: shuffled pages of 16 positions (the per-key page gather) or 128 (a page per 128-key tile)
_DECODE_PAGES = {"secure_decode_page16": ("same", 16), "secure_decode_fp8": ("fp8", 0),
                 "secure_decode_fp8_page16": ("fp8", 16), "secure_decode_fp8_page128": ("fp8", 128)}
_MARK = "FLASHCORE_REPRO_RESULT "


def add_arguments(p: argparse.ArgumentParser) -> None:
    I.add_shape_arguments(p, batch=2, heads=8, seqlen=1024, head_dim=128)
    p.add_argument("--runs", type=int, default=1000, help="calls per mode in this process")
    p.add_argument("--procs", type=int, default=3, help="fresh processes that must reproduce the bytes")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--backend", default="auto")
    p.add_argument("--child-timeout", type=int, default=240)


def _mode_call(mode: str, case, backend: str):
    if mode == "secure":
        return I.make_call("secure", case, causal=False, lens_mode="self", backend=backend)
    if mode == "secure_causal":
        return I.make_call("secure", case, causal=True, lens_mode="self", backend=backend)
    if mode == "secure_cross":
        return I.make_call("secure", case, causal=False, lens_mode="cross", backend=backend)
    if mode == "secure_cross_causal":  # explicit query lengths, causal: the secret diagonal
        return I.make_call("secure", case, causal=True, lens_mode="cross", backend=backend)
    if mode in I.KV_KINDS:
        return I.make_call(mode, case, causal=True, backend=backend)
    if mode in _DECODE_PAGES:
        kv_dtype, page = _DECODE_PAGES[mode]
        return I.make_call("secure_decode", case, causal=True, backend=backend, kv_dtype=kv_dtype, page_size=page)
    if mode == "fast_dense":
        return I.make_call("fast_dense", case, causal=False, backend=backend)
    if mode == "fast_varlen":
        return I.make_call("fast_varlen", case, causal=False, backend=backend)
    raise ValueError(f"unknown repro mode {mode!r}; known: {MODES}")


def build_case(a, device):
    """The one input: N(0,1) values, per-batch random true lengths, N(0,1) padding (class 'random')."""
    return I.build_case("random", B=a.batch, H=a.heads, Hkv=a.kv_heads or a.heads, S=a.seqlen, D=a.head_dim,
                        dtype=I.parse_dtype(a.dtype), device=device, seed=a.seed)


def _input_hash(case) -> str:
    import hashlib
    h = hashlib.sha256()
    for t in (case.q, case.k, case.v, case.seqlens_q, case.seqlens_k):
        h.update(I.tensor_bytes_hash(t).encode())
    return h.hexdigest()


def _bits(t):
    return t.detach().contiguous().reshape(-1).view(__import__("torch").uint8)


def run_mode(mode: str, case, runs: int, backend: str) -> dict:
    import torch

    fn = _mode_call(mode, case, backend)
    t0 = time.time()
    ref = fn()
    torch.cuda.synchronize()
    ref_bits = _bits(ref).clone()
    ref_hash = I.tensor_bytes_hash(ref)
    hashes = {ref_hash: 1}
    mismatches, first_bad = 0, None
    for i in range(runs - 1):
        out = fn()
        same = torch.equal(_bits(out), ref_bits)
        h = I.tensor_bytes_hash(out)
        hashes[h] = hashes.get(h, 0) + 1
        if not same or h != ref_hash:
            mismatches += 1
            if first_bad is None:
                first_bad = i + 1
    torch.cuda.synchronize()
    return {"mode": mode, "runs": runs, "ref_sha256": ref_hash, "distinct_outputs": len(hashes),
            "hash_counts": hashes if len(hashes) > 1 else None, "mismatches": mismatches,
            "first_mismatch_run": first_bad, "output_shape": list(ref.shape), "has_nan": bool(torch.isnan(ref).any()),
            "elapsed_s": round(time.time() - t0, 2), "identical": mismatches == 0 and len(hashes) == 1}


def child_main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(prog="python -m flashcore.audit.repro --child")
    p.add_argument("--child", action="store_true")
    p.add_argument("--pad-alloc-mb", type=int, default=0, help="allocate this much first, shifting every address")
    p.add_argument("--child-runs", type=int, default=3)
    add_arguments(p)
    a = p.parse_args(argv)
    pad = torch.empty(a.pad_alloc_mb * (1 << 20) + 512, dtype=torch.uint8, device="cuda") if a.pad_alloc_mb else None
    case = build_case(a, "cuda")
    res = {"input_sha256": _input_hash(case), "pad_alloc_mb": a.pad_alloc_mb, "modes": {}}
    for mode in [m.strip() for m in a.modes.split(",") if m.strip()]:
        try:
            fn = _mode_call(mode, case, a.backend)
            res["modes"][mode] = [I.tensor_bytes_hash(fn()) for _ in range(a.child_runs)]
        except Exception as e:
            res["modes"][mode] = {"error": f"{type(e).__name__}: {e}"}
    del pad
    print(_MARK + json.dumps(res), flush=True)
    return 0


def run(a) -> int:
    if not I.cuda_or_message("repro"):
        return 2
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            print(f"flashcore audit repro: unknown mode {m!r}; known: {', '.join(MODES)}", file=sys.stderr)
            return 2
    t0 = time.time()
    case = build_case(a, "cuda")
    report = {"gate": "repro", "env": I.environment(), "gpu_state_start": I.gpu_state(),
              "shape": {"B": a.batch, "H": a.heads, "Hkv": a.kv_heads or a.heads, "S_max": a.seqlen, "D": a.head_dim,
                        "dtype": a.dtype},
              "lens": case.lens_k, "seed": a.seed, "input_sha256": _input_hash(case), "modes": {}}
    print(f"[repro] {a.runs} runs x {len(modes)} modes, then {a.procs} fresh processes", flush=True)
    for m in modes:
        try:
            r = run_mode(m, case, a.runs, a.backend)
        except Exception as e:
            r = {"mode": m, "error": f"{type(e).__name__}: {e}", "identical": False}
        report["modes"][m] = r
        print(f"[repro] {m}: {'identical' if r.get('identical') else 'DIFFERENT/ERROR'} "
              f"({r.get('distinct_outputs', '?')} distinct of {r.get('runs', '?')}; {r.get('error', '')})", flush=True)
    procs = []
    for i in range(a.procs):
        cmd = [sys.executable, "-m", "flashcore.audit.repro", "--child", "--pad-alloc-mb", str(7 * (i + 1)),
               "--batch", str(a.batch), "--heads", str(a.heads), "--kv-heads", str(a.kv_heads), "--seqlen", str(a.seqlen),
               "--head-dim", str(a.head_dim), "--dtype", a.dtype, "--modes", ",".join(modes), "--seed", str(a.seed),
               "--backend", a.backend]
        entry = {"cmd": " ".join(cmd)}
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.child_timeout, env=I.child_env())
            line = next((ln for ln in r.stdout.splitlines() if ln.startswith(_MARK)), None)
            if line is None:
                entry["error"] = f"child exited {r.returncode} without a result: {(r.stdout + r.stderr)[-2000:]}"
            else:
                entry.update(json.loads(line[len(_MARK):]))
        except subprocess.TimeoutExpired:
            entry["error"] = f"child timed out after {a.child_timeout} s"
        procs.append(entry)
    report["processes"] = procs
    cross = {}
    for m in modes:
        ref = report["modes"][m].get("ref_sha256")
        seen, errs = [], []
        for pr in procs:
            v = (pr.get("modes") or {}).get(m)
            if isinstance(v, list):
                seen += v
            else:
                errs.append((v or {}).get("error") if isinstance(v, dict) else pr.get("error", "missing"))
        cross[m] = {"identical": bool(ref) and not errs and len(seen) > 0 and all(h == ref for h in seen),
                    "hashes_seen": sorted(set(seen)), "errors": errs}
    report["cross_process"] = cross
    report["inputs_identical_across_processes"] = all(pr.get("input_sha256") == report["input_sha256"] for pr in procs)
    ok = all(report["modes"][m].get("identical") for m in modes) and all(c["identical"] for c in cross.values()) \
        and report["inputs_identical_across_processes"]
    report.update(status="pass" if ok else "FAIL", exit_code=0 if ok else 1, elapsed_s=round(time.time() - t0, 1),
                  gpu_state_end=I.gpu_state())
    I.publish(a, "repro", report, _print)
    return report["exit_code"]


def _print(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"repro: {report['status']} ({report['shape']}, lens {report['lens']})")
    for c in ("mode", "runs", "distinct", "in-process", "cross-process", "sha256"):
        t.add_column(c)
    for m, r in report["modes"].items():
        cp = report["cross_process"].get(m, {})
        t.add_row(m, str(r.get("runs", "")), str(r.get("distinct_outputs", r.get("error", ""))),
                  "[green]identical[/]" if r.get("identical") else "[bold red]DIFFERENT[/]",
                  "[green]identical[/]" if cp.get("identical") else f"[bold red]DIFFERENT[/] {cp.get('errors') or ''}",
                  (r.get("ref_sha256") or "")[:16])
    Console(width=170).print(t)


if __name__ == "__main__":
    sys.exit(I.module_main("python -m flashcore.audit.repro", add_arguments, run, child_main))
