"""Entry points: :func:`analyze_listing` (a parsed listing + parameter table), :func:`analyze_cubin`
(a cubin), :func:`sass_taint` (compile a kernel, then analyse it) and :func:`audit_kernels` (many launch
specs, optionally in forked worker processes)."""
from __future__ import annotations

import re
import sys
import time
from typing import Callable, Iterable

from .compile import _unwrap_jit, compile_cubin, disassemble
from .elf import kernel_info, kernel_names
from .isa import Listing, parse_nvdisasm
from .params import _expand_params, map_params
from .report import ParamInfo, Report, Violation
from .taint import _Analyzer


def analyze_listing(listing: Listing, params: list[ParamInfo], kernel: str, notes: list[str] | None = None,
                    smem_control_from: int | None = None) -> Report:
    """Run the taint analysis on a parsed listing with an explicit parameter table. ``smem_control_from``:
    where shared memory's control area starts, or ``(control ranges, data ranges)`` (:class:`SmemLayout`);
    None models shared memory as one region."""
    notes = notes if notes is not None else []
    entry_off = listing.functions.get(kernel, listing.instrs[0].offset if listing.instrs else 0)
    an = _Analyzer(listing, params, entry_off, notes, smem_control_from)
    rep = an.run()
    rep.kernel = kernel
    rep.params = params
    rep.notes = notes
    return rep


def analyze_cubin(cubin: bytes, kernel: str | None, expected_params: list[tuple[str, str, str]] | None,
                  secret: Iterable[str], smem_control_from: int | None = None) -> Report:
    """Analyse a cubin.  ``expected_params``: (name, role, arg) per ordinal, or None = all unmapped."""
    secret = set(secret)
    t0 = time.perf_counter()
    names = kernel_names(cubin)
    if kernel is None:
        if len(names) != 1:
            raise ValueError(f"cubin has several functions, name the kernel: {names}")
        kernel = names[0]
    kinfo = kernel_info(cubin, kernel)
    notes: list[str] = []
    if expected_params is None:
        expected_params = [(f"<param{i}>", "unmapped", f"<param{i}>") for i in range(len(kinfo.params))]
    params = map_params(kinfo, expected_params, secret, notes)
    text = disassemble(cubin)
    t1 = time.perf_counter()
    listing = parse_nvdisasm(text)
    if not listing.instrs:
        raise RuntimeError("nvdisasm produced no instructions")
    rep = analyze_listing(listing, params, kernel, notes, smem_control_from)
    rep.secret = sorted(secret)
    rep.timings = {"disassemble_s": round(t1 - t0, 4), "analyse_s": round(time.perf_counter() - t1, 4)}
    return rep


def sass_taint(fn, signature: dict, constexprs: dict | None, secret: Iterable[str], target=(9, 0),
               num_warps: int = 4, num_stages: int = 3, attrs: dict | None = None,
               maxnreg: int | None = None) -> Report:
    """Compile ``fn`` for ``sm_90a`` (no GPU needed) and prove/disprove secret independence of its SASS.

    ``secret``: argument names whose *pointee data* (pointers / tensor descriptors) or *value*
    (scalars) is secret.  Returns a :class:`Report`; ``report.ok`` means no violation.
    """
    secret = set(secret or ())
    wrapper_violations = launcher_choice_violations(fn, secret)
    jfn = _unwrap_jit(fn)
    check_secret_names(jfn, signature, secret)
    comp = compile_cubin(jfn, signature, constexprs, target, num_warps, num_stages, attrs, maxnreg)
    expected = _expand_params(jfn, signature, comp.constant_keys, comp.tensordesc_meta)
    layout = comp.smem
    rep = analyze_cubin(comp.cubin, comp.kernel, expected, secret, layout.split if layout else None)
    rep.violations[:0] = wrapper_violations + specialisation_violations(jfn, signature, constexprs or {}, secret)
    if layout is not None and (layout.control_from is not None or layout.control):
        rep.notes.append(layout.describe())  # the split in use, or why a kernel with barriers has none
    cap = target if isinstance(target, int) else int(target[0]) * 10 + int(target[1])
    rep.target = f"sm_{cap}" + ("a" if cap == 90 else "")
    rep.num_warps, rep.num_stages = num_warps, num_stages
    rep.timings = {"compile_s": round(comp.seconds, 4), **rep.timings}
    return rep


_INT_TYPES = re.compile(r"^(i|u)(8|16|32|64)$")


def check_secret_names(jfn, signature: dict, secret: set[str]) -> None:
    """Every secret names an argument, or a field of a tensor-descriptor argument: ``D.shape``, ``D.shape<k>``,
    ``D.strides``, ``D.stride<k>`` or ``D.desc`` (all of its contents) declare what the descriptor's address
    computation reads as secret (see :func:`flashcore.audit.sass.params.map_params`)."""
    bad = []
    for s in secret:
        arg, _, fld = s.partition(".")
        if arg not in jfn.arg_names:
            bad.append(s)
        elif fld:
            ty = signature.get(arg)
            if not (isinstance(ty, str) and (ty.startswith("tensordesc") or ty == "nvTmaDesc")) or \
                    not re.fullmatch(r"shape\d*|strides|stride\d+|desc", fld):
                bad.append(s)
    if bad:
        raise ValueError(f"secret names are not arguments of {jfn.__name__} (or fields D.shape, D.shape<k>, "
                         f"D.strides, D.stride<k>, D.desc of a tensor-descriptor argument D): {sorted(bad)}")


def _code_names(code) -> set[str]:
    """Every string constant and name a function's code (and the code nested in it) mentions."""
    out = set(code.co_names) | set(code.co_varnames)
    for c in code.co_consts:
        if isinstance(c, str):
            out.add(c)
        elif hasattr(c, "co_consts"):
            out |= _code_names(c)
    return out


def launcher_choice_violations(fn, secret: set[str]) -> list[Violation]:
    """Wrappers that choose the binary from the call's arguments, outside the kernel: ``triton.heuristics`` computes
    constexprs from them (a heuristic that reads a secret makes the secret choose the machine code), and
    ``triton.autotune`` benchmarks and picks a configuration per value of its ``key`` arguments (a secret key: the
    binary, and a benchmarking run at each new value). A heuristic whose code cannot be read counts as reading every
    argument."""
    out, seen = [], 0
    while seen < 8 and type(fn).__name__ in ("Heuristics", "Autotuner"):
        kind = type(fn).__name__
        if kind == "Heuristics":
            for name, rule in getattr(fn, "values", {}).items():
                code = getattr(rule, "__code__", None)
                read = (_code_names(code) & secret) if code is not None else set(secret)
                if read:
                    out.append(Violation(-1, "LAUNCH", "specialisation", f"heuristic {name}: reads {sorted(read)}",
                                         "triton.heuristics computes this constexpr from the arguments: a secret "
                                         "argument chooses the binary that runs"))
        elif kind == "Autotuner":
            keys = set(getattr(fn, "keys", None) or getattr(fn, "key", None) or ())
            if keys & secret:
                out.append(Violation(-1, "LAUNCH", "specialisation", f"autotune key {sorted(keys & secret)}",
                                     "triton.autotune picks (and benchmarks) a configuration per value of its key "
                                     "arguments: a secret key chooses the binary"))
        fn = getattr(fn, "fn", None)
        seen += 1
    return out


def specialisation_violations(jfn, signature: dict, constexprs: dict, secret: set[str]) -> list[Violation]:
    """The binary that runs must not depend on a secret. Triton's launcher compiles a separate binary for an
    integer argument equal to 1 (a constant) and adds a divisibility hint for multiples of 16, unless the
    argument is listed in the kernel's ``do_not_specialize``; a constexpr is part of the binary itself. So a
    secret integer scalar without ``do_not_specialize``, or a secret constexpr, selects the machine code: the
    audited binary is only one of those that run. (Still a launcher choice with ``do_not_specialize``: an
    integer of 2**31 or more is passed as i64, another binary; a secret must have a public range below it.)"""
    dns = set(getattr(jfn, "do_not_specialize", None) or ())
    out = []
    for i, name in enumerate(jfn.arg_names):
        if name not in secret:
            continue
        ty = signature.get(name)
        if ty == "constexpr" or name in constexprs or getattr(jfn.params[i], "is_constexpr", False):
            if name in constexprs and constexprs[name] is None:
                continue  # an argument left out (None): that it is absent is public, and it has no data
            out.append(Violation(-1, "LAUNCH", "specialisation", f"{name}: constexpr",
                                 "a secret constexpr is compiled into the binary: each value is another kernel"))
        elif isinstance(ty, str) and _INT_TYPES.match(ty) and i not in dns and name not in dns:
            out.append(Violation(-1, "LAUNCH", "specialisation", f"{name}: {ty}",
                                 "the launcher specialises integer arguments by value (== 1 becomes a constant, "
                                 "multiples of 16 get a divisibility hint): list it in do_not_specialize"))
    return out


def _audit_one(spec: dict, on_error: str) -> Report:
    fn = spec["fn"]
    name = spec.get("name") or getattr(_safe_unwrap(fn), "__name__", str(fn))
    nw, ns = int(spec.get("num_warps", 4)), int(spec.get("num_stages", 3))
    try:
        rep = sass_taint(fn, spec["signature"], spec.get("constexprs") or {}, spec.get("secret") or (),
                         target=spec.get("target", (9, 0)), num_warps=nw, num_stages=ns,
                         attrs=spec.get("attrs"), maxnreg=spec.get("maxnreg"))
    except Exception as e:  # noqa: BLE001 - a kernel we cannot audit fails the gate
        if on_error == "raise":
            raise
        rep = Report(kernel=getattr(_safe_unwrap(fn), "__name__", "?"), error=f"{type(e).__name__}: {e}",
                     num_warps=nw, num_stages=ns, secret=sorted(spec.get("secret") or ()))
    rep.name = name
    return rep


_POOL_SPECS: list[dict] = []


def _pool_worker(i: int) -> Report:
    return _audit_one(_POOL_SPECS[i], "report")


def _pool_worker_indexed(i: int) -> tuple[int, Report]:
    return i, _pool_worker(i)


def audit_kernels(specs: Iterable[dict], on_error: str = "report", jobs: int = 1,
                  progress: Callable[[int, int, Report], None] | None = None) -> list[Report]:
    """Run :func:`sass_taint` over launch specs ``{name, fn, signature, constexprs, secret, num_warps, num_stages}``.

    ``on_error="report"`` turns a failure to compile/analyse into a failed :class:`Report` (``error``
    set, ``ok`` False); ``"raise"`` re-raises.  ``jobs > 1`` compiles/analyses in forked worker
    processes (POSIX only; falls back to serial); results keep the order of ``specs``.
    ``progress(done, total, report)`` is called in this process as each kernel finishes (in completion
    order with ``jobs > 1``; a fallback to serial starts the count again).
    """
    specs = list(specs)
    total = len(specs)
    if jobs > 1 and len(specs) > 1 and on_error != "raise":
        import multiprocessing as mp

        global _POOL_SPECS
        try:
            ctx = mp.get_context("fork")
        except ValueError:
            ctx = None
        if ctx is not None:
            _POOL_SPECS = specs
            try:
                with ctx.Pool(min(jobs, len(specs))) as pool:
                    reports: list[Report | None] = [None] * total
                    for done, (i, rep) in enumerate(
                            pool.imap_unordered(_pool_worker_indexed, range(total), chunksize=1), 1):
                        reports[i] = rep
                        if progress is not None:
                            progress(done, total, rep)
                    return reports
            except Exception as e:  # noqa: BLE001 - e.g. unpicklable results: do it serially
                print(f"flashcore audit sass: parallel audit failed ({type(e).__name__}: {e}); running serially",
                      file=sys.stderr)
            finally:
                _POOL_SPECS = []
    reports = []
    for spec in specs:
        reports.append(_audit_one(spec, on_error))
        if progress is not None:
            progress(len(reports), total, reports[-1])
    return reports


def _safe_unwrap(fn):
    try:
        return _unwrap_jit(fn)
    except Exception:
        return fn
