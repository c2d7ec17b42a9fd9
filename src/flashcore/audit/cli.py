"""``flashcore audit``: the constant-time gates.

    flashcore audit sass      static SASS/PTX audit of every compiled secure configuration (audit/sass/)
    flashcore audit counters  Nsight Compute counters identical across secret input classes
    flashcore audit repro     bit-identical outputs over 1000 runs and across processes
    flashcore audit timing    dudect-style timing tests (Welch t with cropping, paired t)
    flashcore audit all       all four, in that order

Options every gate takes:
    --out DIR   the gate writes its JSON report to <out>/<gate>.json (sass: <out>/sass.json; default
                ./flashcore-audit; committed reports go to audit/results by an explicit --out)
    --secure-v-zeroing {auto,prepass,in_loop}
                the secure Triton kernel's V-padding zeroing variant that the GPU gates run and the sass
                gate compiles (default: as flashcore chooses by size)
--json differs between the gates:
    counters, repro, timing, all:  --json (a flag) prints the JSON report on stdout instead of the
                table; <out>/<gate>.json is written either way
    sass:       --json PATH writes the JSON report to the file PATH instead of <out>/sass.json; the table
                is printed either way (under ``all --json`` the sass step writes <out>/sass.json)
sass also takes --include-fast, --jobs N, --show N, --no-progress, --progress-every N, --reuse REPORT,
--verify N: see
``flashcore audit sass --help``. Exit codes: 0 pass, 1 a gate failed, 2 a gate could not run (no CUDA
GPU, no ncu, module missing). GPU gates on a machine without CUDA print why and exit 2.
"""
from __future__ import annotations

import argparse
import os
import importlib
import sys

GATES = ("sass", "counters", "repro", "timing")
# A working directory: committing a report under audit/results is a deliberate --out, never a side effect.
DEFAULT_OUT = "flashcore-audit"


def _common(p: argparse.ArgumentParser, gate: str = "<gate>") -> None:
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"directory for the JSON report: writes DIR/{gate}.json (default {DEFAULT_OUT})")
    p.add_argument("--json", action="store_true",
                   help=f"print the JSON report on stdout instead of the table (DIR/{gate}.json is written either way)")
    p.add_argument("--secure-v-zeroing", choices=("auto", "prepass", "in_loop"), default=None,
                   help="force the secure Triton kernel's V-padding zeroing variant (default: as flashcore "
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


def sass_parser(mod, out: str = DEFAULT_OUT) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashcore audit sass", conflict_handler="resolve",
                                description="Static SASS/PTX audit of the secure kernel's compiled configurations "
                                            "(no GPU needed). The table goes to stdout, the JSON report to "
                                            "DIR/sass.json (--out DIR) or to --json PATH, progress to stderr.")
    _common(p, "sass")
    p.add_argument("--out", default=out, metavar="DIR",
                   help=f"directory for the JSON report: writes DIR/sass.json unless --json PATH is given "
                        f"(default {DEFAULT_OUT})")
    if hasattr(mod, "add_arguments"):
        mod.add_arguments(p)  # its --json PATH replaces the flag
    p.add_argument("--secure-v-zeroing", choices=("auto", "prepass", "in_loop"), default=None,
                   help="compile the secure Triton kernel with this V-padding zeroing variant (default: as "
                        "flashcore chooses by size)")
    return p


def _run_sass(args) -> int:
    mod, why = _load_sass()
    if mod is None:
        print(f"flashcore audit sass: unavailable: {why}. The other gates (counters, repro, timing) still run.",
              file=sys.stderr)
        return 2
    from pathlib import Path

    rest = list(getattr(args, "sass_args", []) or [])
    ns = sass_parser(mod, getattr(args, "out", None) or DEFAULT_OUT).parse_args(rest)
    # the sass gate's '--json PATH' says where its report goes; without it, <out>/sass.json like the other
    # gates' reports
    if not isinstance(getattr(ns, "json", None), str):
        ns.json = str(Path(ns.out) / "sass.json")
    Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
    apply_secure_v_zeroing(getattr(ns, "secure_v_zeroing", None))  # read when audit_specs plans the kernels
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
    vz = ["--secure-v-zeroing", args.secure_v_zeroing] if getattr(args, "secure_v_zeroing", None) else []
    for gate in GATES:
        print(f"=== flashcore audit {gate} ===", flush=True)
        if gate == "sass":
            ns = argparse.Namespace(sass_args=vz, out=args.out)
            codes[gate] = _run_sass(ns)
            continue
        p = argparse.ArgumentParser(prog=f"flashcore audit {gate}")
        _common(p, gate)
        _add_gate_args(gate, p)
        ns = p.parse_args(["--out", args.out] + (["--json"] if args.json else []) + vz)
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
        _common(p, name)
        _add_gate_args(name, p)
        p.set_defaults(func=_gpu_handler(name))

    pa = gates.add_parser("all", help="run sass, counters, repro and timing with their defaults",
                          description="Run sass, counters, repro and timing with their defaults; each writes "
                                      "DIR/<gate>.json. --json prints the GPU gates' JSON reports instead of their "
                                      "tables (the sass step prints its table).")
    _common(pa)
    pa.set_defaults(func=_all)
    return audit

