"""``flashcore audit``: the constant-time gates.

    flashcore audit sass      static SASS/PTX audit of every compiled secure configuration (audit/sass/)
    flashcore audit counters  Nsight Compute counters identical across secret input classes
    flashcore audit repro     bit-identical outputs over 1000 runs and across processes
    flashcore audit timing    dudect-style timing tests (Welch t with cropping, paired t)
    flashcore audit all       all four, in that order

Common options: ``--out DIR`` (JSON reports, default ./flashcore-audit; committed reports go to audit/results by an explicit --out) and ``--json`` (print the JSON
report instead of the table). Exit codes: 0 pass, 1 a gate failed, 2 a gate could not run (no CUDA GPU,
no ncu, module missing). GPU gates on a machine without CUDA print why and exit 2.
"""
from __future__ import annotations

import argparse
import os
import importlib
import sys

GATES = ("sass", "counters", "repro", "timing")
# A working directory: committing a report under audit/results is a deliberate --out, never a side effect.
DEFAULT_OUT = "flashcore-audit"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=DEFAULT_OUT, help=f"directory for JSON reports (default {DEFAULT_OUT})")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of a table")
    p.add_argument("--secure-v-zeroing", choices=("auto", "prepass", "in_loop"), default=None,
                   help="GPU gates: force the secure kernel's V-padding zeroing variant (default: as flashcore "
                        "chooses by size, which is the in-loop select at the gates' small shapes)")


def _gate_module(name: str):
    return importlib.import_module(f"flashcore.audit.{name}")


def _load_sass():
    """The SASS gate's module, or (None, why)."""
    try:
        return _gate_module("sass"), None
    except ModuleNotFoundError as e:
        if e.name and e.name.endswith("sass"):
            return None, "flashcore.audit.sass is not installed in this checkout"
        return None, f"flashcore.audit.sass could not be imported: {e}"
    except Exception as e:  # a broken module must not break the other gates
        return None, f"flashcore.audit.sass could not be imported: {type(e).__name__}: {e}"


def sass_parser(mod) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashcore audit sass", conflict_handler="resolve",
                                description="Static SASS/PTX audit of the secure kernel's compiled configurations.")
    _common(p)
    if hasattr(mod, "add_arguments"):
        mod.add_arguments(p)
    return p


def _run_sass(args) -> int:
    mod, why = _load_sass()
    if mod is None:
        print(f"flashcore audit sass: unavailable: {why}. The other gates (counters, repro, timing) still run.",
              file=sys.stderr)
        return 2
    rest = list(getattr(args, "sass_args", []) or [])
    # the sass gate has its own '--json PATH' (where to write its report). Unless given, the report goes to
    # <out>/sass.json like the other gates' reports; --out is accepted for symmetry.
    out = getattr(args, "out", None) or DEFAULT_OUT
    if "--out" in rest:
        i = rest.index("--out")
        if i + 1 < len(rest):
            out = rest[i + 1]
    from pathlib import Path

    default_json = not any(r == "--json" or r.startswith("--json=") for r in rest)
    if default_json:
        rest = ["--json", str(Path(out) / "sass.json")] + rest
    ns = sass_parser(mod).parse_args(rest)
    if getattr(ns, "json", None):
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
    return int(mod.run(ns) or 0)


def _gpu_handler(name: str):
    def handler(args) -> int:
        try:
            mod = _gate_module(name)
        except Exception as e:
            print(f"flashcore audit {name}: could not import flashcore.audit.{name}: {type(e).__name__}: {e}",
                  file=sys.stderr)
            return 2
        apply_secure_v_zeroing(getattr(args, "secure_v_zeroing", None))
        return int(mod.run(args) or 0)
    return handler


def apply_secure_v_zeroing(mode) -> None:
    """Set the variant for this process and its children (they inherit the environment)."""
    if mode:
        from ..plan import knobs

        os.environ[knobs.SECURE_V_ZEROING_ENV] = mode


def _add_gate_args(name: str, p: argparse.ArgumentParser) -> None:
    try:
        _gate_module(name).add_arguments(p)
    except Exception as e:  # keep the CLI usable; the handler reports the import error
        p.set_defaults(_import_error=f"{type(e).__name__}: {e}")


def _all(args) -> int:
    """Run every gate with its defaults. 1 if any gate failed, else 2 if any could not run, else 0."""
    codes = {}
    for gate in GATES:
        print(f"=== flashcore audit {gate} ===", flush=True)
        if gate == "sass":
            ns = argparse.Namespace(sass_args=[], out=args.out, json=args.json)
            codes[gate] = _run_sass(ns)
            continue
        p = argparse.ArgumentParser(prog=f"flashcore audit {gate}")
        _common(p)
        _add_gate_args(gate, p)
        ns = p.parse_args(["--out", args.out] + (["--json"] if args.json else []))
        try:
            codes[gate] = _gpu_handler(gate)(ns)
        except Exception as e:  # one gate crashing must not hide the others' results
            print(f"flashcore audit {gate}: crashed: {type(e).__name__}: {e}", file=sys.stderr)
            codes[gate] = 1
    print("=== summary: " + ", ".join(f"{g}={_word(c)}" for g, c in codes.items()))
    return combine_codes(codes.values())


def _word(code: int) -> str:
    return {0: "pass", 1: "FAIL", 2: "not run"}.get(code, f"exit {code}")


def combine_codes(codes) -> int:
    codes = list(codes)
    if any(c == 1 for c in codes) or any(c not in (0, 1, 2) for c in codes):
        return 1
    if any(c == 2 for c in codes):
        return 2
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``audit`` (with sass/counters/repro/timing/all) to the top-level ``flashcore`` parser."""
    audit = subparsers.add_parser("audit", help="constant-time audit gates (sass, counters, repro, timing, all)",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gates = audit.add_subparsers(dest="audit_gate", metavar="GATE")
    gates.required = True

    # sass: its options belong to audit/sass/cli.py, imported only when the gate runs; everything after
    # 'sass' is handed to that module's own parser (prefix_chars trick: argparse takes it verbatim).
    ps = gates.add_parser("sass", help="static SASS/PTX audit of the compiled secure kernels (no GPU needed)",
                          add_help=False, prefix_chars="\x00")
    ps.add_argument("sass_args", nargs=argparse.REMAINDER)
    ps.set_defaults(func=_run_sass, out=DEFAULT_OUT, json=False)

    helps = {"counters": "Nsight Compute counters identical across secret input classes (GPU + ncu)",
             "repro": "bit-identical outputs: 1000 runs and fresh processes (GPU)",
             "timing": "dudect-style timing tests of the secure kernel (GPU)"}
    for name in ("counters", "repro", "timing"):
        p = gates.add_parser(name, help=helps[name], description=helps[name])
        _common(p)
        _add_gate_args(name, p)
        p.set_defaults(func=_gpu_handler(name))

    pa = gates.add_parser("all", help="run sass, counters, repro and timing with their defaults")
    _common(pa)
    pa.set_defaults(func=_all)
    return audit

