"""Run flashcore's GPU audit gates in one go: counters, repro, timing (+ the static sass gate if time is left).

    python -m flashcore.bench.experiments.audit_gpu --out $OUT/audit          # full run, ~6-7 minutes on an H100
    python -m flashcore.bench.experiments.audit_gpu --out /tmp/audit --quick  # smoke test, ~1-2 minutes (sass skipped)

Writes <out>/{counters,repro,timing,summary}.json, <out>/timing_samples.npz (and <out>/sass.json when the
SASS gate runs), and prints a short summary table LAST. Exit code: 1 if any gate failed, else 2 if any gate
could not run, else 0. Budget (full, --budget-s 450): counters ~1.5 min, repro ~1 min, timing takes what is
left (at most 4 min). The SASS gate needs no GPU and takes ~5 min: it runs last only when enough budget is
left (--sass auto), or always with --sass on. Unlike ``flashcore audit all`` (every gate with its defaults, sass
first), it fits one device call, has a smoke mode and prints the gates' key numbers. It drives the gates through
``flashcore.audit.cli``'s helpers.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from ...audit import cli as audit_cli
from . import parser

os.environ.setdefault("PYTHONUNBUFFERED", "1")  # the gates' child processes


def _gate_args(gate: str, out: str, extra: list) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"audit {gate}")
    audit_cli._common(p)
    audit_cli._add_gate_args(gate, p)
    return p.parse_args(["--out", out] + extra)


def _plan(quick: bool) -> dict:
    if quick:
        return {
            "counters": ["--classes", "random,zeros,huge,nan_pad,inf_pad,len1,len_half,len_full,masked_rows",
                         "--causal", "0,1",
                         "--lens-modes", "cross", "--seqlen", "256", "--reps", "2", "--contrast-reps", "1",
                         "--ncu-timeout", "200"],
            "repro": ["--runs", "50", "--procs", "2", "--seqlen", "256", "--child-timeout", "120"],
            "timing": ["--pairs", "5000", "--min-pairs", "2000", "--contrast-pairs", "2000", "--heads", "8",
                       "--seqlen", "1024", "--pool", "8", "--power-block-s", "0.2"],
        }
    return {
        "counters": ["--ncu-timeout", "300"],
        "repro": [],
        "timing": [],
    }


def _summary_row(gate: str, out: Path) -> str:
    """A few key numbers from the gate's JSON report."""
    try:
        rep = json.loads((out / f"{gate}.json").read_text())
    except Exception:
        return ""
    try:
        if gate == "counters":
            cfgs = rep.get("configs") or {}
            sec = {k: v for k, v in cfgs.items() if k.startswith("secure/")}
            failed = sorted({m for v in sec.values() for m in v["failed"]})
            noise = sorted({m for v in sec.values() for m in v["within_noise"]})
            con = rep.get("contrast_detected") or {}
            s = f"secure configs pass {sum(v['pass'] for v in sec.values())}/{len(sec)}"
            if failed:
                s += f"; differ: {', '.join(failed[:4])}{' ...' if len(failed) > 4 else ''}"
            if noise:
                s += f"; within run-to-run noise: {len(noise)} metric(s)"
            if con:
                s += f"; fast contrast differs: {sum(con.values())}/{len(con)}"
            return s
        if gate == "repro":
            parts = [f"{m}:{r.get('distinct_outputs', 'err')}" for m, r in (rep.get("modes") or {}).items()]
            cp = all(c.get("identical") for c in (rep.get("cross_process") or {}).values())
            return f"distinct outputs per mode {' '.join(parts)}; cross-process {'identical' if cp else 'DIFFERENT'}"
        if gate == "timing":
            sec = [t for t in rep.get("tests", []) if t.get("scope") == "in_scope" and "max_abs_t" in t]
            pw = [t for t in rep.get("tests", []) if t.get("scope") == "power" and "max_abs_t" in t]
            con = [t for t in rep.get("tests", []) if t.get("scope") == "contrast" and "max_abs_t" in t]
            s = ""
            if sec:
                w = max(sec, key=lambda t: t["max_abs_t"])
                s += f"secure max|t| {w['max_abs_t']:.2f} ({w['test']}, {w['mean_diff_ns']:+.1f} ns)"
            if pw:
                s += f"; power probe |t| {max(t['max_abs_t'] for t in pw):.2f}"
            if con:
                s += f"; fast contrast max|t| {max(t['max_abs_t'] for t in con):.1f}"
            return s
        if gate == "sass":
            sec = rep.get("secure") or []
            fast = rep.get("fast") or []
            s = f"secure configs clean {sum(1 for r in sec if r.get('ok'))}/{len(sec)}"
            if fast:
                s += f"; fast with findings {sum(1 for r in fast if not r.get('ok'))}/{len(fast)}"
            return s
    except Exception as e:
        return f"(summary failed: {e})"
    return ""


def main(argv=None) -> int:
    p = parser(__spec__.name, __doc__, out_default="audit/results")
    p.add_argument("--quick", action="store_true", help="shrink every gate for a smoke test")
    p.add_argument("--skip", default="", help="comma list of gates to skip (sass, counters, repro, timing)")
    p.add_argument("--budget-s", type=float, default=450.0, help="total wall-time budget; timing gets the rest")
    p.add_argument("--sass", choices=("auto", "on", "off"), default="auto",
                   help="the static SASS gate needs no GPU and takes ~5 min (72 configurations): 'auto' runs it "
                        "last only if --sass-min-s of the budget is left, 'on' always (last), 'off' never")
    p.add_argument("--sass-min-s", type=float, default=320.0)
    p.add_argument("--secure-v-zeroing", choices=("auto", "prepass", "in_loop"), default=None,
                   help="force the secure kernel's V zeroing variant in every gate (see flashcore audit --help)")
    a = p.parse_args(argv)
    audit_cli.apply_secure_v_zeroing(a.secure_v_zeroing)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    plan = _plan(a.quick)
    t0 = time.time()
    results = {}
    if a.sass == "off" or (a.quick and a.sass == "auto"):
        skip.add("sass")
    # GPU gates first (timing takes what is left of the budget), the static SASS gate last.
    for gate in ("counters", "repro", "timing", "sass"):
        if gate in skip:
            continue
        print(f"\n===== audit {gate} =====", flush=True)
        g0 = time.time()
        try:
            if gate == "sass":
                mod, why = audit_cli._load_sass()
                left = a.budget_s - (time.time() - t0)
                if mod is None or (a.sass == "auto" and left < a.sass_min_s):
                    why = why or (f"{left:.0f} s of the {a.budget_s:.0f} s budget left, it needs ~{a.sass_min_s:.0f} s; "
                                  f"run `flashcore audit sass` separately (static: no GPU needed) or pass --sass on")
                    print(f"[sass] skipped: {why}", flush=True)
                    results[gate] = {"code": None, "note": f"skipped: {why}"}
                    continue
                code = audit_cli._run_sass(argparse.Namespace(sass_args=[], out=str(out), json=False))
            else:
                extra = list(plan[gate])
                if gate == "timing":
                    left = a.budget_s - (time.time() - t0) - 25.0
                    budget = max(30.0, min(240.0 if not a.quick else 45.0, left))
                    extra += ["--budget-s", f"{budget:.0f}"]
                code = audit_cli._gpu_handler(gate)(_gate_args(gate, str(out), extra))
        except SystemExit as e:  # argparse errors inside a gate
            code = int(e.code or 0) if isinstance(e.code, int) else 2
        except Exception as e:
            traceback.print_exc()
            print(f"[{gate}] crashed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            code = 1
            results[gate] = {"code": code, "crash": f"{type(e).__name__}: {e}"}
        results.setdefault(gate, {})
        results[gate].update(code=code, elapsed_s=round(time.time() - g0, 1), summary=_summary_row(gate, out))
    codes = [r["code"] for r in results.values() if r.get("code") is not None]
    final = audit_cli.combine_codes(codes) if codes else 2
    summary = {"gates": results, "exit_code": final, "quick": a.quick, "elapsed_s": round(time.time() - t0, 1),
               "out": str(out)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    # The short summary table, printed LAST.
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"flashcore GPU audit{' (quick)' if a.quick else ''}: {audit_cli._word(final)} "
                        f"in {summary['elapsed_s']:.0f} s -> {out}")
        for c in ("gate", "result", "time", "key numbers"):
            t.add_column(c)
        for g, r in results.items():
            word = "skipped" if r.get("code") is None else audit_cli._word(r["code"])
            style = {"pass": "green", "FAIL": "bold red", "not run": "yellow"}.get(word, "")
            t.add_row(g, f"[{style}]{word}[/]" if style else word, f"{r.get('elapsed_s', 0):.0f} s",
                      r.get("summary") or r.get("note") or r.get("crash") or "")
        Console(width=160).print(t)
    except Exception:
        for g, r in results.items():
            print(f"{g}: code={r.get('code')} {r.get('elapsed_s', 0)} s {r.get('summary') or r.get('note') or ''}")
    return final


if __name__ == "__main__":
    sys.exit(main())
