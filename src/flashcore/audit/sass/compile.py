"""Compile a ``@triton.jit`` / ``@gluon.jit`` function for ``sm_90a`` without a GPU (:func:`compile_cubin`,
cached per process), read its shared-memory layout (:func:`smem_layout`) and disassemble the cubin with
Triton's ``nvdisasm`` (:func:`disassemble`, cached by content). Kernels decorated under
``TRITON_INTERPRET=1`` are rebuilt as JIT functions and compiled with the interpreter switched off
(:func:`_compiler_mode`)."""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

_CUBIN_CACHE: dict[Any, "_Compiled"] = {}
_DISASM_CACHE: dict[str, str] = {}


@dataclass
class _Compiled:
    cubin: bytes
    kernel: str
    tensordesc_meta: list | None
    constant_keys: set
    seconds: float
    smem: "SmemLayout | None" = None


@dataclass
class SmemLayout:
    """How a compiled kernel's shared memory splits into a data area and a control area, from the
    compiler's own allocation (Triton's shared-memory allocation pass, re-run on the kernel's TTGIR).

    Control: the mbarriers (``i64`` allocations) and, in a warp-specialised kernel, the buffer through
    which ``warp_specialize`` hands its captures to the partitions and the per-warp dispatch flags.
    Data: every other allocation (tiles). With ``control_from`` set, the analysis keeps two summaries:
    a shared access whose address immediate is at or above ``control_from`` touches the control area,
    any other the data area. So a secret tile written anywhere in the data area no longer reaches the
    partitions' dispatch flag (the one-region model reported that branch, and everything after it).

    Assumed, as for the mbarrier words themselves (module docstring): the register part of a shared
    address is a non-negative offset that keeps an access inside its allocation (Triton's buffer
    indices, e.g. ring slots, are in range by construction). Nothing is assumed about what is stored:
    a secret value stored to the control area taints it, and every read of it. ``control_from`` is None
    (one region) where the split cannot be read off safely: no control allocation, a data allocation
    reaching past the control area's start, or an allocation of unknown size (compiler scratch)."""
    control_from: int | None
    data: list  # (name, offset, bytes)
    control: list  # (what, offset)
    reason: str = ""
    #: the control area as byte ranges [lo, hi) (an mbarrier allocation's extent; warp_specialize's buffers
    #: to the end), and the data allocations' ranges: an access whose immediate falls in both (memory the
    #: compiler reuses over time) touches both areas. None: the single threshold ``control_from``.
    ranges: tuple | None = None

    @property
    def split(self):
        """What the analysis takes (``analyze_listing``'s ``smem_control_from``)."""
        return self.ranges if self.ranges is not None else self.control_from

    def describe(self) -> str:
        if self.control_from is None:
            return f"shared memory modelled as one region ({self.reason})"
        names = ", ".join(n for n, _, _ in self.data)
        if self.ranges is not None:
            ctl = ", ".join(f"[0x{lo:x}, " + ("end)" if hi >= 1 << 30 else f"0x{hi:x})") for lo, hi in self.ranges[0])
            return (f"shared memory: control area {ctl} ({', '.join(w for w, _ in self.control)}), data elsewhere "
                    f"({names}); allocations reused over time touch both")
        return (f"shared memory: data area [0, 0x{self.control_from:x}) ({names}); control area from "
                f"0x{self.control_from:x} ({', '.join(w for w, _ in self.control)})")


_ELT_BYTES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8,
              "f8E4M3FN": 1, "f8E5M2": 1}


def _ptx_version(meta, cap: int) -> int:
    """The PTX version Triton's NVIDIA backend compiled with (its make_llir computes it the same way)."""
    from triton.backends.nvidia.compiler import get_ptx_version_from_options

    return get_ptx_version_from_options(meta, cap)


def smem_layout(ttgir: str | None, cap: int, ptx_version: int) -> SmemLayout | None:
    """The shared-memory allocation of a compiled kernel (see :class:`SmemLayout`), or None when there
    is no TTGIR. Re-runs the first passes of Triton 3.6's ``make_llir`` (NVIDIA backend) up to and
    including shared-memory allocation and reads the ``allocation.offset`` attributes."""
    if not ttgir:
        return None
    import tempfile

    from triton._C.libtriton import ir, nvidia, passes

    ctx = ir.context()
    ir.load_dialects(ctx)
    nvidia.load_dialects(ctx)
    with tempfile.NamedTemporaryFile("w", suffix=".ttgir", delete=False) as f:
        f.write(ttgir)
        path = f.name
    try:
        mod = ir.parse_mlir_module(path, ctx)
    finally:
        os.unlink(path)
    pm = ir.pass_manager(ctx)
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    passes.ttgpuir.add_allocate_warp_groups(pm)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, cap, ptx_version)
    pm.run(mod, "flashcore_smem_layout")
    data, control, unknown, extents = [], [], [], []
    has_ws = False
    text = str(mod)
    viewed = barriers_viewed_as_data(text)
    if viewed:
        # the split assumes that only barrier operations touch a barrier's words; a view of them as other data (a
        # copy or a store through it, at an address the analysis may not resolve: a register index) breaks that, so
        # shared memory is one area, read by every wait (found by a review, 2026-11-28: a TMA copy of a secret tile
        # into a reinterpreted barrier allocation, at a public register index, was placed in the data area)
        return SmemLayout(None, [], [("mbarriers", 0)], f"an mbarrier allocation is viewed as other data ({viewed})")
    lines = text.splitlines()
    for at, line in enumerate(lines):
        m = re.search(r"allocation\.offset = (\d+)", line)
        if not m:
            continue
        off = int(m.group(1))
        t = line.strip()
        if "ttg.local_alloc" in t:
            mt = re.search(r"!ttg\.memdesc<([0-9x]+)x(\w+),", t)
            name = t.split("=", 1)[0].strip() if t.startswith("%") else "?"
            if mt is None or mt.group(2) not in _ELT_BYTES:
                unknown.append((name, off))
                continue
            n = 1
            for d in mt.group(1).split("x"):
                n *= int(d)
            if mt.group(2) == "i64":  # Triton's mbarriers are i64 memdescs
                control.append((f"mbarriers {name}", off))
                extents.append((off, off + n * 8))
            else:
                data.append((name, off, n * _ELT_BYTES[mt.group(2)]))
        elif "ttng.tensormap_create" in t:  # a device-side descriptor is built in a 128-byte scratch buffer
            data.append(("tensormap", off, 128))
        elif "ttg.warp_specialize" in t:
            has_ws = True
            control.append(("warp_specialize captures", off))
            size = warp_specialize_capture_bytes(lines, at)
            extents.append((off, off + size if size is not None else 1 << 30))
        elif t.startswith("tt.func"):
            control.append(("warp_specialize dispatch flags", off))
            extents.append((off, 1 << 30))
        else:  # compiler scratch (layout conversions, reductions, scans): data of a size not written down here
            unknown.append((t.split("=", 1)[-1].strip().split(" ")[0], off))
    if any(w.startswith("warp_specialize dispatch") for w, _ in control) and not has_ws:
        return SmemLayout(None, data, control, "a function-level allocation without warp_specialize")
    if not control:
        return SmemLayout(None, data, control, "no control allocations")
    start = min(o for _, o in control)
    # scratch of unknown size is data from its offset on, as far as the control area allows (the allocator
    # never overlaps it with a live barrier; where it may reach a barrier's range, accesses there touch both)
    data = sorted(data + [(name, off, (1 << 30) - off) for name, off in unknown], key=lambda d: d[1])
    control = sorted(control, key=lambda c: c[1])
    if any(o + n > start for _, o, n in data):  # memory reused over time: classify by ranges
        ranges = (tuple(sorted(extents)), tuple((o, o + n) for _, o, n in data))
        return SmemLayout(start, data, control, "", ranges)
    return SmemLayout(start, data, control)


def _top_level_split(text: str) -> list[str]:
    """``text`` split at the commas outside ``<>``, ``()``, ``[]`` and ``{}``."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def _capture_bytes(ty: str) -> int | None:
    """Bytes of one ``ttg.warp_specialize`` capture in its shared-memory buffer, as Triton's allocator counts them
    (``WarpSpecializeOp::getCaptureSizeAlign``: integers and floats their width, pointers and descriptors 8, a
    shared-memory descriptor 8 plus 4 per dimension, any other memory descriptor 8); None for a type not known."""
    m = re.fullmatch(r"([if])(\d+)|bf16|index", ty)
    if m:
        return 8 if ty == "index" else 2 if ty == "bf16" else -(-int(m.group(2)) // 8)
    if ty.startswith(("!tt.ptr<", "!tt.tensordesc<")):
        return 8
    md = re.fullmatch(r"!ttg\.memdesc<((?:\d+x)*)\w+,(.*)>", ty)  # dims "AxBx", then the element type
    if md:
        return 8 + 4 * md.group(1).count("x") if "#smem" in md.group(2) else 8
    return None


def warp_specialize_capture_bytes(lines: list[str], at: int) -> int | None:
    """The size of the captures buffer of the ``ttg.warp_specialize`` op on ``lines[at]``, from its operand types
    (the ``} : (types) -> ...`` line closing it at the op's indentation), rounded up to 8; None where the types
    cannot be read (the caller then keeps the buffer's range open to the end of shared memory). Before 2026-11-29 the
    range was always open, and a small kernel whose buffer sits at offset 0 had every shared access in the control
    area (a false finding of the fourth review)."""
    indent = len(lines[at]) - len(lines[at].lstrip())
    for line in lines[at + 1:]:
        if len(line) - len(line.lstrip()) == indent and line.lstrip().startswith("} : ("):
            m = re.match(r"\s*\} : \((.*)\) ->", line)
            if m is None:
                return None
            sizes = [_capture_bytes(t) for t in _top_level_split(m.group(1))]
            if any(n is None for n in sizes):
                return None
            return -(-sum(sizes) // 8) * 8
    return None


_I64_MEMDESC = re.compile(r"<[0-9x]*i64,")
# operations that write data into shared memory: the memdesc they write is the type after their last "->"
_SMEM_WRITERS = ("ttg.local_store", "ttg.async_copy_global_to_local", "ttng.async_tma_copy_global_to_local",
                 "ttng.async_tma_gather", "ttg.local_alloc %", "ttng.async_copy_global_to_local")


def barriers_viewed_as_data(ttgir: str) -> str | None:
    """The first operation of the TTGIR that treats mbarrier memory (Triton's ``i64`` memdescs, and the views and
    partition arguments derived from them) as data, or None: a reinterpretation of it (``ttg.memdesc_reinterpret``
    from an ``i64`` memdesc, to another element type or shape: through it the words can be indexed as data), or a
    store or copy whose destination is an ``i64`` memdesc (an ``i64`` to ``i64`` view of the same layout folds away,
    leaving the copy's destination a barrier). Read by types, not by names: a ``warp_specialize`` partition is a
    region of its own, whose values are printed with names that other regions reuse."""
    for line in ttgir.splitlines():
        t = line.strip()
        if ":" not in t:
            continue
        if "ttg.memdesc_reinterpret" in t:
            if _I64_MEMDESC.search(t.split(":", 1)[1].split("->", 1)[0]):
                return t.split(" loc(", 1)[0][:160]
        elif any(w in t for w in _SMEM_WRITERS) and "->" in t:
            if _I64_MEMDESC.search(t.split(" loc(", 1)[0].rsplit("->", 1)[1]):
                return t.split(" loc(", 1)[0][:160]
    return None


_JIT_FROM_INTERP: dict[int, tuple[Any, Any]] = {}
_GLOBALS_FROM_INTERP: dict[int, dict] = {}


def _interp_to_jit(ifn):
    """A compilable ``JITFunction`` for a kernel decorated while ``TRITON_INTERPRET=1``.

    Under the interpreter ``@triton.jit`` returns ``InterpretedFunction`` objects (the kernel *and*
    the helpers it calls through module globals).  We rebuild the Python functions over a copy of
    their module globals in which every interpreted function is replaced by its JIT twin.
    """
    import types

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    hit = _JIT_FROM_INTERP.get(id(ifn))
    if hit is not None and hit[0] is ifn:
        return hit[1]
    pyfn = ifn.fn
    gid = id(pyfn.__globals__)
    g = _GLOBALS_FROM_INTERP.get(gid)
    if g is None:
        g = dict(pyfn.__globals__)
        _GLOBALS_FROM_INTERP[gid] = g
        for name, v in list(g.items()):
            if isinstance(v, InterpretedFunction):
                g[name] = _interp_to_jit(v)
    nf = types.FunctionType(pyfn.__code__, g, pyfn.__name__, pyfn.__defaults__, pyfn.__closure__)
    for attr in ("__qualname__", "__module__", "__doc__", "__annotations__", "__kwdefaults__"):
        setattr(nf, attr, getattr(pyfn, attr, None))
    jit = JITFunction(nf, **dict(getattr(ifn, "kwargs", {}) or {}))
    _JIT_FROM_INTERP[id(ifn)] = (ifn, jit)
    return jit


def _unwrap_jit(fn):
    from triton.runtime.jit import JITFunction

    try:
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:  # pragma: no cover
        InterpretedFunction = ()  # type: ignore[assignment]
    seen = 0
    while not isinstance(fn, JITFunction) and seen < 8:
        if InterpretedFunction and isinstance(fn, InterpretedFunction):
            return _interp_to_jit(fn)
        if not hasattr(fn, "fn"):
            break
        fn = fn.fn  # autotuner / heuristics wrappers
        seen += 1
    if not isinstance(fn, JITFunction):
        raise TypeError(f"expected a @triton.jit function, got {type(fn).__name__}")
    return fn


def _freeze(x):
    if isinstance(x, dict):
        return tuple(sorted((repr(k), _freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    try:
        hash(x)
        return (type(x).__name__, x)
    except TypeError:
        return repr(x)


@contextlib.contextmanager
def _compiler_mode():
    """Compile as on a GPU machine even when ``TRITON_INTERPRET=1`` (CPU test suites set it).

    Under the interpreter every ``@triton.jit`` function - the kernel, its helpers and Triton's own
    standard library (``tl.sum``, ``tl.max``, tensor member functions...) - was created as an
    ``InterpretedFunction``.  For the duration of the compile we switch the knob off and swap the
    standard-library objects for JIT twins, restoring everything afterwards.
    """
    try:
        from triton import knobs
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:  # pragma: no cover - older Triton
        yield
        return
    if not knobs.runtime.interpret:
        yield
        return
    patches: list[tuple[Any, str, Any]] = []
    try:
        for modname, mod in list(sys.modules.items()):
            if mod is None or not (modname == "triton.language" or modname.startswith("triton.language.")):
                continue
            for name, v in list(vars(mod).items()):
                if isinstance(v, InterpretedFunction):
                    patches.append((mod, name, v))
                elif isinstance(v, type) and getattr(v, "__module__", "").startswith("triton.language"):
                    for cname, cv in list(vars(v).items()):
                        if isinstance(cv, InterpretedFunction):
                            patches.append((v, cname, cv))
        seen = set()
        for owner, name, v in patches:
            if (id(owner), name) in seen:
                continue
            seen.add((id(owner), name))
            setattr(owner, name, _interp_to_jit(v))
        with knobs.runtime.scope():
            knobs.runtime.interpret = False
            yield
    finally:
        for owner, name, v in patches:
            setattr(owner, name, v)


def launch_debug(fn) -> bool:
    """Whether Triton's launcher builds ``fn`` in debug mode (``@triton.jit(debug=True)``, or the knob
    ``triton.knobs.runtime.debug``, ``TRITON_DEBUG=1``): a launch without a ``debug=`` keyword compiles with
    ``fn.debug or knobs.runtime.debug`` (Triton 3.6-3.9), and that binary keeps ``device_assert`` and checks integer
    arithmetic for overflow, each a branch on the operands' values. The audit compiles the same (a launch's own
    ``debug=True`` keyword, which flashcore never passes, is not visible here)."""
    from triton import knobs

    return bool(getattr(_unwrap_jit(fn), "debug", False)) or bool(knobs.runtime.debug)


def compile_cubin(fn, signature: dict, constexprs: dict | None = None, target=(9, 0), num_warps: int = 4,
                  num_stages: int = 3, attrs: dict | None = None, maxnreg: int | None = None) -> _Compiled:
    """Compile ``fn`` for ``sm_<target>`` (``a`` variant on 9.0) without a GPU; cached per process.

    ``attrs``: per-argument attributes as Triton's launcher attaches them (``{(i,): [["tt.divisibility",
    16]]}``). Without them pointers are assumed unaligned and the compiler emits a different kernel
    (scalar loads, no cp.async) from the one that runs. Gluon kernels (``@gluon.jit``) compile
    through Gluon's front end; ``maxnreg`` is the register cap a warp-specialised one launches with."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jfn = _unwrap_jit(fn)
    cap = target if isinstance(target, int) else int(target[0]) * 10 + int(target[1])
    debug = launch_debug(jfn)
    key = (id(jfn), jfn.cache_key, _freeze(signature), _freeze(constexprs or {}), cap, num_warps, num_stages,
           _freeze(attrs or {}), maxnreg, debug)
    hit = _CUBIN_CACHE.get(key)
    if hit is not None:
        return hit
    t0 = time.perf_counter()
    source = ASTSource
    if getattr(jfn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(jfn, signature=dict(signature), constexprs=dict(constexprs or {}), attrs=dict(attrs or {}))
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if debug:  # the binary a launch runs: device_assert kept, integer overflow checks added (branches on values)
        options["debug"] = True
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    with _compiler_mode():
        compiled = triton.compile(src, target=GPUTarget("cuda", cap, 32), options=options)
    meta = compiled.metadata
    out = _Compiled(
        cubin=compiled.asm["cubin"],
        kernel=getattr(meta, "name", jfn.__name__),
        tensordesc_meta=getattr(meta, "tensordesc_meta", None),
        constant_keys=set(src.constants.keys()),
        seconds=time.perf_counter() - t0,
        smem=smem_layout(compiled.asm.get("ttgir"), cap, _ptx_version(meta, cap)),
    )
    _CUBIN_CACHE[key] = out
    return out


def _tool(name: str) -> str:
    env = os.environ.get(f"TRITON_{name.upper()}_PATH")
    if env and os.path.exists(env):
        return env
    try:
        import triton

        p = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        if os.path.exists(p):
            return p
    except Exception:  # pragma: no cover
        pass
    p = shutil.which(name)
    if p:
        return p
    raise FileNotFoundError(f"{name} not found (looked in triton/backends/nvidia/bin, $TRITON_{name.upper()}_PATH, PATH)")


def disassemble(cubin: bytes) -> str:
    """``nvdisasm -c`` text of a cubin (cached by content)."""
    h = hashlib.sha256(cubin).hexdigest()
    if h in _DISASM_CACHE:
        return _DISASM_CACHE[h]
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        res = subprocess.run([_tool("nvdisasm"), "-c", path], capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(path)
    if res.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {res.stderr.strip()[:500]}")
    _DISASM_CACHE[h] = res.stdout
    return res.stdout
