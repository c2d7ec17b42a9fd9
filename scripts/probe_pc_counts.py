"""Probe (device): per-SASS-instruction execution counts of the secure Gluon kernel under ncu's
SourceCounters, for a few input classes x reps, exported as ncu's source page (CSV). Used to design a
gate 2 that tells timing-driven wait loops from everything else.

    PYTHONPATH=src python scripts/probe_pc_counts.py --out $OUT [--realloc] [--causal]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))


def child(a):
    import torch
    from flashcore.audit import _inputs as I
    from flashcore.kernels import configs
    os.environ[configs.SECURE_KERNEL_ENV] = "gluon_ws"
    if a.realloc:
        configs.gluon_secure = lambda hd, causal=False: configs.gluon_ws(hd, a.seqlen, causal)
    cases = {c: I.build_case(c, B=2, H=4, S=a.seqlen, D=a.head_dim, dtype=torch.bfloat16, device="cuda", seed=7)
             for c in a.classes.split(",")}
    calls = []
    for c, case in cases.items():
        fn = I.make_call("secure", case, causal=a.causal, lens_mode="self")
        fn(); fn(); torch.cuda.synchronize()
        calls.append((c, fn))
    for rep in range(a.reps):
        for c, fn in calls:
            torch.cuda.synchronize(); torch.cuda.profiler.start(); fn(); torch.cuda.synchronize(); torch.cuda.profiler.stop()
            print("launch", rep, c, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/pc")
    ap.add_argument("--realloc", action="store_true")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--classes", default="random,len1,nan_pad")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    if a.child:
        return child(a)
    os.makedirs(a.out, exist_ok=True)
    tag = f"pc-d{a.head_dim}-{'causal' if a.causal else 'full'}-{'realloc' if a.realloc else 'norealloc'}"
    rep = os.path.join(a.out, tag)
    ncu = os.environ.get("NCU", "ncu")
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--seqlen", str(a.seqlen), "--head-dim",
            str(a.head_dim), "--classes", a.classes, "--reps", str(a.reps)] + (["--realloc"] if a.realloc else []) + \
        (["--causal"] if a.causal else [])
    cmd = [ncu, "--target-processes", "all", "--profile-from-start", "off", "--clock-control", "none",
           "--kernel-name", "regex:attn_fwd_hopper", "--section", "SourceCounters", "--section", "InstructionStats",
           "-f", "-o", rep] + argv
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    open(rep + ".log", "w").write(r.stdout + r.stderr)
    print(r.stdout[-1500:], r.stderr[-1500:])
    for page, extra in (("source", ["--print-source", "sass"]), ("details", []), ("raw", [])):
        r2 = subprocess.run([ncu, "-i", rep + ".ncu-rep", "--csv", "--page", page] + extra, capture_output=True,
                            text=True, timeout=300)
        open(f"{rep}.{page}.csv", "w").write(r2.stdout + r2.stderr)
        print(page, len(r2.stdout), r2.stderr[-500:])


if __name__ == "__main__":
    main()
