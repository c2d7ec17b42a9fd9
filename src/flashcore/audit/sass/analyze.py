"""Entry points: :func:`analyze_listing` (a parsed listing + parameter table), :func:`analyze_cubin`
(a cubin), :func:`sass_taint` (compile a kernel, then analyse it) and :func:`audit_kernels` (many launch
specs, optionally in forked worker processes)."""
from __future__ import annotations

import builtins
import dis
import inspect
import re
import sys
import time
import types
from typing import Callable, Iterable

from .compile import _unwrap_jit, compile_cubin, disassemble
from .elf import kernel_info, kernel_names
from .isa import Listing, parse_nvdisasm
from . import memo
from .params import _expand_params, leaf_name, map_params, tuple_leaves
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
    key = memo.analysis_key(cubin, kernel, expected_params, secret, smem_control_from)
    taken = memo.lookup(key)
    if taken is not None:  # the same bytes, inputs and analyser as a committed clean analysis (memo.py)
        taken.secret = sorted(secret)
        taken.timings = {"reuse_s": round(time.perf_counter() - t0, 4)}
        return taken
    params = map_params(kinfo, expected_params, secret, notes)
    text = disassemble(cubin)
    t1 = time.perf_counter()
    listing = parse_nvdisasm(text)
    if not listing.instrs:
        raise RuntimeError("nvdisasm produced no instructions")
    rep = analyze_listing(listing, params, kernel, notes, smem_control_from)
    rep.secret = sorted(secret)
    rep.analysis_key, rep.analysis_notes = key, len(rep.notes)
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


_ALL = "*every argument*"


def _mapping_reads(fn, params: tuple[str, ...]) -> set[str]:
    """The keys a function reads from the mappings it receives as ``params`` (the arguments dict a heuristic or an
    autotuner's pruning rule is called with): the constant keys of ``m["k"]`` and ``m.get("k")``, or ``{_ALL}`` when
    a mapping is used any other way (iterated, passed on, indexed by a computed key, captured by a closure) or the
    code cannot be read. Reading keys off the bytecode, not names off the code (found by a review, 2026-11-28: a
    key in a closure cell or a default value, a helper that reads it, and ``a.values()`` all passed the name scan)."""
    if not _readable(fn) or any(p in fn.__code__.co_cellvars for p in params):
        return {_ALL}  # not a plain function reading only what it is given, or a mapping captured by a closure
    ins = [x for x in dis.get_instructions(fn.__code__) if x.opname not in ("CACHE", "EXTENDED_ARG", "NOP")]
    out: set[str] = set()
    for i, x in enumerate(ins):
        if not (x.opname.startswith("LOAD_FAST") and x.argval in params):
            continue
        nxt = ins[i + 1] if i + 1 < len(ins) else None
        nxt2 = ins[i + 2] if i + 2 < len(ins) else None
        if nxt is not None and nxt.opname == "LOAD_CONST" and isinstance(nxt.argval, str) and nxt2 is not None \
                and nxt2.opname == "BINARY_SUBSCR":
            out.add(nxt.argval)
        elif nxt is not None and nxt.opname in ("LOAD_METHOD", "LOAD_ATTR") and nxt.argval == "get" \
                and nxt2 is not None and nxt2.opname == "LOAD_CONST" and isinstance(nxt2.argval, str):
            out.add(nxt2.argval)
        else:
            return {_ALL}
    return out


_FRAME_NAMES = frozenset({"_getframe", "currentframe", "f_back", "f_locals", "f_globals", "stack", "getouterframes",
                          "get_referrers", "get_referents", "locals", "vars", "globals", "eval", "exec", "compile",
                          "getattr", "__getattribute__", "__traceback__", "tb_frame", "tb_next", "gi_frame",
                          "cr_frame", "ag_frame", "exc_info", "exception", "settrace", "setprofile", "__dict__",
                          "__globals__", "__closure__", "__code__", "__self__", "__func__", "__builtins__",
                          "modules", "import_module", "__import__"})
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range)


def _public_defaults(fn) -> bool:
    """Default values are state too (``lambda a, s=STASH: s["n"]``, a dict a pre-run hook fills): immutable only."""
    vals = list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    return all(isinstance(v, _IMMUTABLE) or (isinstance(v, (tuple, frozenset)) and all(isinstance(u, _IMMUTABLE)
                                                                                        for u in v)) for v in vals)


def _public_state(code, glb: dict, cells: tuple, depth: int = 0) -> bool:
    """Whether code reads nothing but its arguments, immutable constants, modules, classes and functions (themselves
    reading no more, to a depth of 4) from outside: a rule that reads a mutable global or closure (a dict that a
    pre-run hook or a ``Config.pre_hook`` fills with the call's arguments, or an autotuner's ``nargs``) reads what it
    was given there."""
    if depth > 4:
        return False

    def ok(obj) -> bool:
        if isinstance(obj, _IMMUTABLE) or isinstance(obj, (types.ModuleType, type, types.BuiltinFunctionType)):
            return True
        if isinstance(obj, (tuple, frozenset)):
            return all(ok(o) for o in obj)
        if type(obj).__name__ == "constexpr":
            return ok(getattr(obj, "value", None))
        if isinstance(obj, types.FunctionType):
            return _public_state(obj.__code__, obj.__globals__, obj.__closure__ or (), depth + 1)
        return False

    ins = [x for x in dis.get_instructions(code) if x.opname not in ("CACHE", "EXTENDED_ARG", "NOP")]
    for i, x in enumerate(ins):
        if x.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            name = x.argval
            if name in glb:
                obj = glb[name]
            elif hasattr(builtins, name):
                obj = getattr(builtins, name)
            else:
                return False
        elif x.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF") and x.argval in code.co_freevars:
            k = code.co_freevars.index(x.argval)
            try:
                obj = cells[k].cell_contents
            except (IndexError, ValueError):
                return False
        else:
            continue
        for y in ins[i + 1:]:  # an attribute chain off it: what it names must be as public
            if y.opname not in ("LOAD_ATTR", "LOAD_METHOD") or not isinstance(obj, (types.ModuleType, type)):
                break
            try:
                obj = getattr(obj, y.argval)
            except AttributeError:
                return False
        if not ok(obj):
            return False
    for c in code.co_consts:
        if hasattr(c, "co_code") and not _public_state(c, glb, (), depth + 1):
            return False
    return True


def _all_names(code):
    yield from code.co_names
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            yield from _all_names(c)


def _reads_secret(read: set[str], secret: set[str]) -> list[str]:
    return sorted(secret) if _ALL in read else sorted(read & secret)


def _readable(fn) -> bool:
    """Whether what ``fn`` reads can be read off its code: a plain function (not a bound method, a callable object or
    a partial, whose arguments are not where they seem) that names no frame, traceback or ``getattr`` (the caller's
    frame holds the call's arguments) and reads no mutable state (:func:`_public_state`, :func:`_public_defaults`)."""
    if not isinstance(fn, types.FunctionType):
        return False
    code = fn.__code__
    return not (_FRAME_NAMES & set(_all_names(code))) and _public_state(code, fn.__globals__, fn.__closure__ or ()) \
        and _public_defaults(fn)


def _varkw_name(code) -> tuple[str, ...]:
    """The name of a code object's ``**kwargs`` parameter, as a 1-tuple, or ()."""
    if not code.co_flags & inspect.CO_VARKEYWORDS:
        return ()
    n = code.co_argcount + code.co_kwonlyargcount + (1 if code.co_flags & inspect.CO_VARARGS else 0)
    return (code.co_varnames[n],)


def _keyword_reads(fn) -> set[str]:
    """What a function called with the arguments as keywords (an autotuner's ``perf_model``) reads: its named
    parameters, and from a ``**kwargs`` what :func:`_mapping_reads` finds."""
    if not _readable(fn):
        return {_ALL}
    code = fn.__code__
    read = set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    kw = _varkw_name(code)
    return read | _mapping_reads(fn, kw) if kw else read


def launcher_choice_violations(fn, secret: set[str]) -> list[Violation]:
    """Wrappers that choose the binary from the call's arguments, outside the kernel: ``triton.heuristics`` computes
    constexprs from them (a heuristic that reads a secret makes the secret choose the machine code), and
    ``triton.autotune`` picks a configuration per value of its ``key`` arguments, after pruning them by
    ``early_config_prune`` and ``perf_model`` (which see every argument), by timing each one on the call's own
    arguments: with a secret among them and more than one configuration, the timing of the secret data chooses the
    binary. What a rule reads is read off its bytecode (:func:`_mapping_reads`); a rule whose use of the arguments
    cannot be read counts as reading every argument."""
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    try:
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:  # pragma: no cover
        InterpretedFunction = JITFunction
    out, seen = [], 0
    while seen < 8 and hasattr(fn, "fn") and not isinstance(fn, (JITFunction, InterpretedFunction)):
        kind = "Heuristics" if isinstance(fn, Heuristics) else "Autotuner" if isinstance(fn, Autotuner) else None
        if kind is None or type(fn) not in (Heuristics, Autotuner):
            # a wrapper of another kind (or a subclass, which may run anything at launch): what it does with the
            # arguments before the kernel runs is not read here (found by a review, 2026-11-28: a Heuristics subclass
            # of another name was skipped, and the kernel under it audited)
            if secret:
                out.append(Violation(-1, "LAUNCH", "specialisation", f"wrapper {type(fn).__name__}",
                                     "an unrecognised wrapper chooses how the kernel is launched from the call's "
                                     "arguments; it is not audited"))
            if kind is None:
                fn = getattr(fn, "fn", None)
                seen += 1
                continue
        if kind == "Heuristics":
            for name, rule in getattr(fn, "values", {}).items():
                code = getattr(rule, "__code__", None)
                params = code.co_varnames[:1] if code is not None and code.co_argcount >= 1 else ()
                # (a bound method's first parameter is ``self``: _mapping_reads takes plain functions only)
                read = _reads_secret(_mapping_reads(rule, params) if params else {_ALL}, secret)
                if read:
                    out.append(Violation(-1, "LAUNCH", "specialisation", f"heuristic {name}: reads {read}",
                                         "triton.heuristics computes this constexpr from the arguments: a secret "
                                         "argument chooses the binary that runs"))
        elif kind == "Autotuner":
            keys = set(getattr(fn, "keys", None) or getattr(fn, "key", None) or ())
            if keys & secret:
                out.append(Violation(-1, "LAUNCH", "specialisation", f"autotune key {sorted(keys & secret)}",
                                     "triton.autotune picks (and benchmarks) a configuration per value of its key "
                                     "arguments: a secret key chooses the binary"))
            prune = getattr(fn, "early_config_prune", None)
            if prune is not None:
                code = getattr(prune, "__code__", None)  # called as (configs, named_args, **kwargs)
                params = (code.co_varnames[1],) + _varkw_name(code) if code is not None and code.co_argcount >= 2 \
                    else ()
                read = _reads_secret(_mapping_reads(prune, params) if params else {_ALL}, secret)
                if read:
                    out.append(Violation(-1, "LAUNCH", "specialisation", f"autotune early_config_prune reads {read}",
                                         "the configurations left to choose from follow a secret argument"))
            model = getattr(fn, "perf_model", None)
            if model is not None:
                read = _reads_secret(_keyword_reads(model), secret)
                if read:
                    out.append(Violation(-1, "LAUNCH", "specialisation", f"autotune perf_model reads {read}",
                                         "the configurations kept follow a secret argument's estimated time"))
            configs = getattr(fn, "configs", None) or ()
            if secret and len(configs) > 1:
                out.append(Violation(-1, "LAUNCH", "specialisation",
                                     f"autotune times {len(configs)} configurations on secret arguments",
                                     "triton.autotune runs each configuration on the call's own arguments and keeps "
                                     "the fastest: the timing of the secret inputs chooses the binary (one "
                                     "configuration, or tuning on public inputs ahead of time, does not)"))
        fn = getattr(fn, "fn", None)
        seen += 1
    return out


def specialisation_violations(jfn, signature: dict, constexprs: dict, secret: set[str]) -> list[Violation]:
    """The binary that runs must not depend on a secret. Triton's launcher compiles a separate binary for an
    integer argument equal to 1 (a constant) and adds a divisibility hint for multiples of 16, unless the
    argument is listed in the kernel's ``do_not_specialize``; a constexpr is part of the binary itself. So a
    secret integer scalar without ``do_not_specialize``, or a secret constexpr, selects the machine code: the
    audited binary is only one of those that run. (Still a launcher choice with ``do_not_specialize``: an
    integer of 2**31 or more is passed as i64, another binary; a secret must have a public range below it.)
    A tuple argument's elements are specialised and typed one by one as scalars are (``do_not_specialize`` names
    the tuple), so every element of a secret tuple is held to the same rules (found by a review of the gate,
    2026-11-29: a secret integer inside a tuple was not checked)."""
    dns = set(getattr(jfn, "do_not_specialize", None) or ())
    out = []
    for i, name in enumerate(jfn.arg_names):
        if name not in secret:
            continue
        ty = signature.get(name)
        listed = i in dns or name in dns
        if isinstance(ty, (tuple, list)):
            for path, ety in tuple_leaves(ty, (i,)):
                out += _specialisation(leaf_name(name, path), ety, ety == "constexpr", listed)
            continue
        if name in constexprs and constexprs[name] is None:
            continue  # an argument left out (None): that it is absent is public, and it has no data
        constant = ty == "constexpr" or name in constexprs or getattr(jfn.params[i], "is_constexpr", False)
        out += _specialisation(name, ty, constant, listed)
    return out


def _specialisation(name: str, ty, constant: bool, listed: bool) -> list[Violation]:
    """The violation (none or one) of a secret argument, or tuple element, ``name`` of type ``ty``: compiled in
    (``constant``), or an integer the launcher specialises (not ``listed`` in ``do_not_specialize``) or types by
    its value (wider than i32)."""
    if constant:
        return [Violation(-1, "LAUNCH", "specialisation", f"{name}: constexpr",
                          "a secret constexpr is compiled into the binary: each value is another kernel")]
    if not (isinstance(ty, str) and _INT_TYPES.match(ty)):
        return []
    if not listed:
        return [Violation(-1, "LAUNCH", "specialisation", f"{name}: {ty}",
                          "the launcher specialises integer arguments by value (== 1 becomes a constant, "
                          "multiples of 16 get a divisibility hint): list it in do_not_specialize")]
    if ty != "i32":
        # do_not_specialize keeps the value out of the key, not its type: the launcher passes an integer below
        # 2**31 as i32, one below 2**63 as i64, a larger one as u64, each a binary of its own. A secret declared
        # i32 is audited as the one binary its (promised) range runs; any other type is not the only binary
        # (found by a review, 2026-11-28)
        return [Violation(-1, "LAUNCH", "specialisation", f"{name}: {ty}",
                          "the launcher types an integer by its value (i32 below 2**31, i64, u64): a secret "
                          f"declared {ty} is not the binary that runs for every value (i32 for small ones)")]
    return []


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
