"""Static taint analysis of the SASS that Triton emits for Hopper (sm_90a): the DHP-safe gate.

The question answered: can any *secret* input (the data behind secret pointers, or the value of a
secret scalar) influence control flow, memory addresses, or the timing of synchronisation in the
real machine code?  We compile the ``@triton.jit`` function for ``sm_90a`` without a GPU,
disassemble the cubin with the ``nvdisasm`` that ships with Triton, and run a flow-sensitive
forward data-flow analysis (a monotone fixpoint over the CFG) on the SASS.

Public API
----------
``sass_taint(fn, signature, constexprs, secret, target=(9, 0), num_warps=4, num_stages=3) -> Report``
``audit_kernels(specs, jobs=1) -> list[Report]``  (spec: dict name/fn/signature/constexprs/secret/
num_warps/num_stages; ``jobs > 1`` forks worker processes)
``main(argv) / add_arguments(parser) / run(args)``:
``flashcore audit sass [--json PATH] [--include-fast] [--jobs N] [--show N]`` (exit 0 = every
``audit_specs(secure=True)`` configuration is violation-free; 1 = violations, errors or no kernels;
2 = ``flashcore.kernels.audit_specs`` unavailable).  Lower-level: ``compile_cubin``,
``disassemble``, ``analyze_cubin``, ``analyze_listing`` (hand-written SASS).

Compilation uses ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` (no GPU or
driver needed; cached per process by (fn, signature, constexprs, target, num_warps, num_stages)).
Kernels decorated while ``TRITON_INTERPRET=1`` (``InterpretedFunction``) are rebuilt as JIT
functions and compiled with the interpret knob temporarily off.

Parameters and the constant bank
--------------------------------
On sm_90 kernel parameters live in constant bank 0 starting at ``c[0x0][0x210]``.  The exact
layout is read from the cubin: ``.nv.info.<kernel>`` holds one ``EIATTR_KPARAM_INFO`` record
(ordinal, offset, size) per parameter and ``EIATTR_PARAM_CBANK`` gives the bank offset of the block
(see :mod:`flashcore.audit.sass_elf`).  Ordinals are mapped to Triton argument names: the
non-``constexpr`` arguments in declaration order (arguments given a value in ``constexprs`` are
dropped too); a ``tensordesc<...>`` argument expands exactly like Triton's launcher does (a 128-byte
``CUtensorMap`` or a base pointer + shape/stride scalars, followed by ``ndim`` i32 shapes and
``ndim`` i64 strides); Triton 3.6 appends hidden ``global_scratch`` / ``profile_scratch`` pointers
(public).  If the record count disagrees with the signature, every unmapped parameter is treated
as secret (scalar and pointee) and a note is added.

Abstract domain
---------------
Two lattices, joined by union at CFG merges:

* taint: the value depends on a secret.  Bit-precise (a 32-bit mask) for general/uniform registers
  and local-memory slots, boolean elsewhere.  ``LOP3.LUT`` (evaluated per bit through its truth
  table), shifts (``SHF``, ``IMAD.SHL``), moves, ``SEL``, ``PRMT``, ``P2R``/``R2P`` keep bits apart;
  additions/multiplications taint from the lowest tainted bit upwards; everything else taints all
  bits.  ptxas packs predicates into GPR bits (``LOP3`` bit set/clear under a predicate, ``P2R``) and
  spills them; a register-granular analysis would smear one secret mask bit over every packed
  public predicate (this is what the secure attention kernel needs);
* provenance (set of pointer-parameter names per location): the value is an address derived from
  that parameter (``IADD3``/``IMAD.WIDE``/``LEA``/``MOV``/... propagate it; every data-flow op
  propagates the union of its sources, an over-approximation).  A global load's data is tainted when
  its address provenance contains a secret pointer (or a global region that received secret data).

Locations: ``R0..R254``, ``UR0..UR62``, ``P0..P6``, ``UP0..UP6``, ``B0..B15``, local-memory slots
(``[R1+imm]`` addresses, 4-byte granularity, plus one coarse "unknown local" slot) - all flow
sensitive; and a *flow-insensitive* memory summary: one bit (+ provenance) for all of shared memory,
one per pointer parameter's global region, and one for global writes with unknown address.  Shared
and global memory are flow-insensitive on purpose: other warps / CTAs may write them at any time
(warp specialisation, producer/consumer pipelines), so a per-program-point view would be unsound.
Whenever the summary grows, all blocks are re-analysed until nothing changes.

Modelling choices (over- / under-approximations)
------------------------------------------------
* Wide / vector destinations taint their whole range: ``.64``/``.128`` loads and stores,
  ``LDSM/STSM .x2/.x4``, ``IMAD.WIDE``, ``CS2R``, doubles, ``HMMA`` (4 dest, A 4, B 2, C 4 regs),
  ``HGMMA.64xN`` (N/2 accumulator registers for f32/s32 accumulators, N/4 for f16; A-from-registers
  4 regs; ``gdesc[URx]`` = URx..URx+3), TMA coordinate vectors (``[URx]`` = URx..URx+2+ndim).
  Unknown opcodes: destinations get 4 registers, the first operand is also read, memory operands
  are a generic read *and* write of unknown memory.  Unknown opcodes are listed in the report.
* Predicated instructions (``@P0 OP``) act as selects: destinations are tainted if the guard is
  (weak update: old value kept; for ``LOP3`` only the bits the instruction can change).  The state
  also remembers "value under guard": after ``@!P5 MOV R2, 0x4000`` a read of ``R2`` by another
  ``@!P5`` instruction (``P5`` not redefined in between) sees the guarded value, not its join with
  the old one.  ``SEL/FSEL/FMNMX/IMNMX/PLOP3/ISETP/FSETP/...`` are data flow.
* Matrix units: ``HMMA/IMMA/HGMMA`` outputs are tainted if any register input is, and ``HGMMA``
  also if shared memory holds secret data (its descriptor operands read shared memory).
* A memory access's loaded value is also tainted when its address is (and that is a violation).
  Stores propagate data taint, address taint and guard taint into the written region.
* mbarrier / synchronisation (``SYNCS.*`` e.g. ``SYNCS.PHASECHK.TRANS64.TRYWAIT``,
  ``SYNCS.ARRIVE.TRANS64``, ``SYNCS.EXCH``; ``ARRIVES.*``): they read and write barrier state in
  shared memory, not secret data.  The barrier phase / transaction count depends only on the public
  schedule, so they are modelled as NOT reading the coarse shared-memory taint and their results
  (e.g. the TRYWAIT predicate that drives the wait loop) are public - otherwise every pipelined
  Hopper kernel would be a false positive.  Their address operands are checked ("address") and
  their data operands (transaction byte counts, expected counts, phase parity) are timing inputs
  ("timing").  ``WARPGROUP.ARRIVE``, ``WARPGROUP.DEPBAR``, ``DEPBAR``, fences are not data reads.
  This is an *assumption* about the kernel: it must not store secret-dependent values into an
  mbarrier word.
* TMA (``UTMALDG``): the descriptor is read from memory; the loaded tile is secret if the
  descriptor's memory holds a pointer derived from a secret parameter (Triton builds device-side
  descriptors in shared memory and copies them to the global scratch buffer; provenance follows
  that path) or if the descriptor address has unknown provenance (host ``CUtensorMap`` parameters
  are addressed through the generic parameter-space address: any secret parameter then taints the
  tile - an over-approximation).  Coordinates, shared-memory destination, mbarrier and descriptor
  address registers are address operands.  The contents of the descriptor (shape, strides) are not
  address operands: a descriptor whose shape is secret yields tainted data, not a violation.
* Global memory reached from parameters is assumed to hold no pointers at kernel entry (Triton has
  no pointer-to-pointer loads unless an argument is typed ``**T``, which is honoured).  A global or
  generic access whose address has no provenance is treated as touching *all* memory (join of every
  region, every secret parameter, shared and local memory).
* Implicit flows are not propagated past branches: every branch whose condition is tainted is
  itself reported, so a kernel without "branch" violations has no secret-dependent control flow.
* Calls (``CALL.REL``, e.g. the IEEE division / sqrt slow paths) are analysed context-insensitively:
  edges into the callee, and from every ``RET`` to every return site (plus the direct fall-through,
  an over-approximation).  ``BRX``/``JMX`` (indirect) branches get every block as successor.
* Timing: ``BAR`` (barrier id / thread count), ``NANOSLEEP``, ``WARPSYNC`` masks, ``YIELD``,
  fences and waits with tainted operands or tainted guards are "timing" violations.  Arithmetic
  latency is assumed data-independent (true on Hopper for the opcodes Triton emits; the
  data-dependent IEEE division/sqrt slow paths appear as tainted *branches*).  Shuffles with a
  tainted lane index are data flow.
* Not modelled: cache / bank-conflict timing of accesses whose address is public (bank conflicts
  depend on the address only, which is checked), instruction-cache effects, power.

Every violation carries a ``trace``: the chain of instructions through which the secret reached it
(witnesses recorded during the fixpoint), ending at its source (a secret pointer's load, a secret
scalar's constant-bank slot, shared/local memory...).

Known limitations
-----------------
Shared memory is one coarse location: a warp-specialised kernel whose partitions read a *public*
control word from shared memory (Triton's ``warp_specialize`` dispatch flag) after secret tiles were
stored anywhere in shared memory reports that branch (its trace ends at "shared memory").  The
analysis covers the kernel's own machine code for the one target it is compiled for; it does not
prove anything about the launcher, other architectures, or code paths not in ``audit_specs``.

Violations
----------
``branch``: BRA/BRX/JMP/JMX/CALL/RET/EXIT/BREAK/BSSY/BSYNC with a tainted guard, predicate operand or
target register.  ``address``: a memory access (LD*/ST*/ATOM*/RED/LDS/STS/LDL/STL/LDSM/STSM/LDGSTS/
TMA/bulk copy/SYNCS/HGMMA descriptors/indexed LDC) with a tainted address register.
``predicated-memory``: a memory access under a tainted guard (or tainted source predicate, e.g. a
cp.async zero-fill predicate).  ``timing``: see above.  ``coverage``: code the analysis could not
follow (a call whose target is not in the disassembly) - fails the gate rather than being assumed safe.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import heapq
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from . import sass_elf
from .sass_isa import TRANSFER, Instr, Listing, Sem, _inner_regs, decode, parse_nvdisasm, parse_operand

__all__ = [
    "Violation",
    "Report",
    "ParamInfo",
    "sass_taint",
    "analyze_cubin",
    "analyze_listing",
    "compile_cubin",
    "disassemble",
    "audit_kernels",
    "add_arguments",
    "run",
    "main",
    "VIOLATION_KINDS",
]

VIOLATION_KINDS = ("branch", "address", "predicated-memory", "timing", "coverage")


# ============================================================================================
# report
# ============================================================================================


@dataclass
class Violation:
    offset: int
    opcode: str
    kind: str
    sass: str
    detail: str = ""
    trace: list[str] = field(default_factory=list)  # how the secret reached this instruction

    def to_dict(self) -> dict:
        return {"offset": self.offset, "offset_hex": f"0x{self.offset:04x}", "opcode": self.opcode,
                "kind": self.kind, "sass": self.sass, "detail": self.detail, "trace": list(self.trace)}

    def __str__(self) -> str:
        return f"/*{self.offset:04x}*/ {self.kind:<17} {self.sass}" + (f"   <- {self.detail}" if self.detail else "")


@dataclass
class ParamInfo:
    ordinal: int
    name: str
    cbank_offset: int  # absolute offset in c[0x0]
    size: int
    role: str  # pointer | scalar | tensordesc | hidden | unmapped
    secret: bool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cbank"] = f"c[0x0][0x{self.cbank_offset:x}]"
        return d


@dataclass
class Report:
    kernel: str
    violations: list[Violation] = field(default_factory=list)
    n_instructions: int = 0  # instructions in reachable blocks (analysed)
    n_blocks: int = 0  # reachable basic blocks
    total_instructions: int = 0
    iterations: int = 0  # block visits until the fixpoint
    tainted_registers: list[str] = field(default_factory=list)
    tainted_memory: list[str] = field(default_factory=list)
    unknown_opcodes: dict[str, int] = field(default_factory=dict)
    params: list[ParamInfo] = field(default_factory=list)
    secret: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    name: str | None = None  # spec / configuration label
    target: str = "sm_90a"
    num_warps: int | None = None
    num_stages: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.violations

    def counts(self) -> dict[str, int]:
        c = Counter(v.kind for v in self.violations)
        return {k: c.get(k, 0) for k in VIOLATION_KINDS if c.get(k, 0)}

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kernel": self.kernel,
            "ok": self.ok,
            "error": self.error,
            "target": self.target,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "secret": list(self.secret),
            "violation_counts": self.counts(),
            "violations": [v.to_dict() for v in self.violations],
            "n_instructions": self.n_instructions,
            "n_blocks": self.n_blocks,
            "total_instructions": self.total_instructions,
            "iterations": self.iterations,
            "tainted_registers": list(self.tainted_registers),
            "tainted_memory": list(self.tainted_memory),
            "unknown_opcodes": dict(self.unknown_opcodes),
            "params": [p.to_dict() for p in self.params],
            "notes": list(self.notes),
            "timings": dict(self.timings),
        }

    def __str__(self) -> str:
        head = f"SASS taint audit: {self.name or self.kernel}"
        if self.name and self.name != self.kernel:
            head += f" (kernel {self.kernel})"
        lines = [head]
        if self.error:
            lines.append(f"  ERROR: {self.error}")
            return "\n".join(lines)
        lines.append(f"  target {self.target}, num_warps={self.num_warps}, num_stages={self.num_stages}; "
                     f"secret={sorted(self.secret)}")
        lines.append(f"  analysed {self.n_instructions}/{self.total_instructions} instructions in {self.n_blocks} "
                     f"blocks ({self.iterations} block visits)")
        regs = self.tainted_registers
        lines.append(f"  tainted registers ({len(regs)}): " + _compress_regs(regs))
        lines.append(f"  tainted memory: {', '.join(self.tainted_memory) or '-'}")
        if self.unknown_opcodes:
            lines.append("  unrecognised opcodes (conservative rule): "
                         + ", ".join(f"{k}x{v}" for k, v in sorted(self.unknown_opcodes.items())))
        for n in self.notes:
            lines.append(f"  note: {n}")
        if self.ok:
            lines.append("  OK: no secret-dependent branches, addresses, predicated memory accesses or timing")
        else:
            lines.append(f"  {len(self.violations)} violation(s): "
                         + ", ".join(f"{k}={v}" for k, v in self.counts().items()))
            for k, v in enumerate(self.violations):
                lines.append("    " + str(v))
                if k < 5:
                    lines.extend("        " + t for t in v.trace)
        return "\n".join(lines)


def _compress_regs(regs: Iterable[str]) -> str:
    groups: dict[str, list[int]] = {}
    other = []
    for r in regs:
        m = re.fullmatch(r"(UR|R|UP|P|B)(\d+)", r)
        if m:
            groups.setdefault(m.group(1), []).append(int(m.group(2)))
        else:
            other.append(r)
    parts = []
    for prefix in ("R", "UR", "P", "UP", "B"):
        nums = sorted(set(groups.get(prefix, [])))
        i = 0
        while i < len(nums):
            j = i
            while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
                j += 1
            parts.append(f"{prefix}{nums[i]}" if i == j else f"{prefix}{nums[i]}-{prefix}{nums[j]}")
            i = j + 1
    return " ".join(parts + sorted(other)) or "-"


# ============================================================================================
# compile + disassemble (cached)
# ============================================================================================

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

    def describe(self) -> str:
        if self.control_from is None:
            return f"shared memory modelled as one region ({self.reason})"
        names = ", ".join(n for n, _, _ in self.data)
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
    data, control, unknown = [], [], []
    has_ws = False
    for line in str(mod).splitlines():
        m = re.search(r"allocation\.offset = (\d+)", line)
        if not m:
            continue
        off = int(m.group(1))
        t = line.strip()
        if "ttg.local_alloc" in t:
            mt = re.search(r"!ttg\.memdesc<([0-9x]+)x(\w+),", t)
            name = t.split("=", 1)[0].strip() if t.startswith("%") else "?"
            if mt is None or mt.group(2) not in _ELT_BYTES:
                unknown.append(name)
                continue
            n = 1
            for d in mt.group(1).split("x"):
                n *= int(d)
            if mt.group(2) == "i64":  # Triton's mbarriers are i64 memdescs
                control.append((f"mbarriers {name}", off))
            else:
                data.append((name, off, n * _ELT_BYTES[mt.group(2)]))
        elif "ttg.warp_specialize" in t:
            has_ws = True
            control.append(("warp_specialize captures", off))
        elif t.startswith("tt.func"):
            control.append(("warp_specialize dispatch flags", off))
        else:
            unknown.append(t.split("=", 1)[-1].strip().split(" ")[0])
    if any(w.startswith("warp_specialize dispatch") for w, _ in control) and not has_ws:
        return SmemLayout(None, data, control, "a function-level allocation without warp_specialize")
    if unknown:
        return SmemLayout(None, data, control, f"allocations of unknown size: {', '.join(unknown)}")
    if not control:
        return SmemLayout(None, data, control, "no control allocations")
    start = min(o for _, o in control)
    if any(o + n > start for _, o, n in data):
        return SmemLayout(None, data, control, "a data allocation reaches past the control area's start")
    return SmemLayout(start, sorted(data, key=lambda d: d[1]), sorted(control, key=lambda c: c[1]))


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
    key = (id(jfn), jfn.cache_key, _freeze(signature), _freeze(constexprs or {}), cap, num_warps, num_stages,
           _freeze(attrs or {}), maxnreg)
    hit = _CUBIN_CACHE.get(key)
    if hit is not None:
        return hit
    t0 = time.perf_counter()
    source = ASTSource
    if getattr(jfn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(jfn, signature=dict(signature), constexprs=dict(constexprs or {}), attrs=dict(attrs or {}))
    options = {"num_warps": num_warps, "num_stages": num_stages}
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


# ============================================================================================
# parameters -> constant bank
# ============================================================================================


def _expand_params(jfn, signature: dict, constant_keys: set, tensordesc_meta: list | None) -> list[tuple[str, str, str]]:
    """Kernel-parameter list in ordinal order as (name, role, arg) - mirrors Triton's launcher."""
    out: list[tuple[str, str, str]] = []
    td_idx = 0
    for i, arg in enumerate(jfn.arg_names):
        ty = signature.get(arg)
        if ty is None or ty == "constexpr" or (i,) in constant_keys:
            continue
        if isinstance(ty, str) and ty.startswith("tensordesc"):
            meta = tensordesc_meta[td_idx] if tensordesc_meta and td_idx < len(tensordesc_meta) else None
            td_idx += 1
            m = re.match(r"tensordesc<([^[>]*)\[([^]]*)\]", ty)
            ndim = m.group(2).count(",") + 1 if m else 2
            if meta is None:
                out.append((arg, "pointer", arg))
                out += [(f"{arg}.host_shape_stride{k}", "scalar", arg) for k in range(2 * ndim)]
                out.append((f"{arg}.padding", "scalar", arg))
            else:
                out.append((arg, "tensordesc", arg))
            out += [(f"{arg}.shape{k}", "scalar", arg) for k in range(ndim)]
            out += [(f"{arg}.stride{k}", "scalar", arg) for k in range(ndim)]
        elif isinstance(ty, str) and ty.startswith("**"):
            out.append((arg, "pointer-to-pointer", arg))
        elif isinstance(ty, str) and (ty.startswith("*") or ty == "nvTmaDesc"):
            out.append((arg, "pointer" if ty.startswith("*") else "tensordesc", arg))
        elif isinstance(ty, str):
            out.append((arg, "scalar", arg))
        else:  # tuples etc.: let the count check catch it
            out.append((arg, "unmapped", arg))
    return out


def map_params(kinfo: sass_elf.KernelInfo, expected: list[tuple[str, str, str]], secret: set[str],
               notes: list[str]) -> list[ParamInfo]:
    params: list[ParamInfo] = []
    n_exp = len(expected)
    hidden_names = ["<global_scratch>", "<profile_scratch>"]
    mismatch = len(kinfo.params) < n_exp or any(r == "unmapped" for _, r, _ in expected)
    if mismatch:
        notes.append(f"parameter mapping uncertain: cubin has {len(kinfo.params)} parameters, signature implies "
                     f"{n_exp} (+hidden); unmapped parameters are treated as secret")
    for kp in kinfo.params:
        off = kinfo.param_base + kp.offset
        if kp.ordinal < n_exp and not mismatch:
            name, role, arg = expected[kp.ordinal]
            is_secret = arg in secret and (role in ("pointer", "tensordesc", "pointer-to-pointer") or name == arg)
            params.append(ParamInfo(kp.ordinal, name, off, kp.size, role, is_secret))
        elif kp.ordinal >= n_exp and not mismatch:
            k = kp.ordinal - n_exp
            name = hidden_names[k] if k < len(hidden_names) else f"<hidden{k}>"
            params.append(ParamInfo(kp.ordinal, name, off, kp.size, "hidden", False))
        else:
            name = expected[kp.ordinal][0] if kp.ordinal < n_exp else f"<param{kp.ordinal}>"
            params.append(ParamInfo(kp.ordinal, name, off, kp.size, "unmapped", True))
    unknown = secret - {p.name for p in params} - {a for _, _, a in expected}
    if unknown:
        notes.append(f"secret names not among the kernel's runtime arguments (constexpr or misspelt?): {sorted(unknown)}")
    return params


# ============================================================================================
# CFG
# ============================================================================================


@dataclass
class _Block:
    idx: int
    start: int  # index into the instruction list
    end: int  # exclusive
    succs: list[int] = field(default_factory=list)


def _is_conditional(ins: Instr) -> bool:
    """May control fall through to the next instruction (guard, predicate operand, BRA.DIV...)?"""
    if ins.guard is not None:
        return True
    for o in ins.operands:
        op = parse_operand(o)
        if op.kind == "pred" and not (op.reg in ("PT", "UPT") and not op.negated):
            return True
        if op.kind == "reg" and op.reg not in ("RZ", "URZ") and ins.base in ("BRA", "JMP"):
            return True  # BRA.DIV URx: taken depending on a (divergence) mask
    return ins.base == "BRA" and any(m in ("DIV", "CONV") for m in ins.mods)


def _declared_indirect_targets(x: Instr, resolve) -> list[int]:
    """Targets of an indirect branch from nvdisasm's ``BRANCH_TARGETS`` annotation (the cubin's own list of
    the jump table's entries, e.g. the dispatch of ``warp_specialize`` partitions); [] when absent or when
    any label does not resolve (the caller then makes every block a successor)."""
    m = re.search(r'BRANCH_TARGETS\s+([^"]*)"', x.text)
    if not m:
        return []
    labels = [lab.strip() for lab in m.group(1).split(",") if lab.strip()]
    ts = [resolve(lab) for lab in labels]
    return ts if labels and all(t is not None for t in ts) else []


def _build_cfg(listing: Listing, entry_off: int, notes: list[str],
               unresolved: set[int] | None = None) -> tuple[list[_Block], int]:
    ins = listing.instrs
    n = len(ins)
    pos = {x.offset: i for i, x in enumerate(ins)}

    def resolve(label: str) -> int | None:
        if label in listing.labels:
            return pos.get(listing.labels[label])
        try:
            return pos.get(int(label, 16))
        except ValueError:
            return None

    targets: dict[int, list[int]] = {}
    call_returns: list[int] = []
    leaders = {0, pos.get(entry_off, 0)}
    leaders.update(pos[o] for o in listing.functions.values() if o in pos)
    for i, x in enumerate(ins):
        b = x.base
        if b in ("BRA", "JMP", "CALL", "BSSY"):
            ts = [t for t in (resolve(lab) for lab in x.targets) if t is not None]
            if not ts and b in ("BRA", "JMP"):
                for o in x.operands:  # "BRA 0x1f0" style
                    if re.fullmatch(r"0x[0-9a-fA-F]+", o.strip()):
                        t = pos.get(int(o, 16))
                        if t is not None:
                            ts.append(t)
            targets[i] = ts
            leaders.update(ts)
        if b in ("BRX", "BRXU", "JMX", "JMXU"):
            ts = _declared_indirect_targets(x, resolve)
            if ts:
                targets[i] = ts
                leaders.update(ts)
        if b in TRANSFER and i + 1 < n:
            leaders.add(i + 1)
        if b == "CALL" and i + 1 < n:
            call_returns.append(i + 1)
    starts = sorted(leaders)
    blocks: list[_Block] = []
    block_of: dict[int, int] = {}
    for k, s in enumerate(starts):
        e = starts[k + 1] if k + 1 < len(starts) else n
        blocks.append(_Block(k, s, e))
        block_of[s] = k
    for blk in blocks:
        last = ins[blk.end - 1]
        b = last.base
        fall = [block_of[blk.end]] if blk.end < n else []
        cond = _is_conditional(last)
        if b in ("BRA", "JMP"):
            ts = targets.get(blk.end - 1, [])
            if not ts:
                notes.append(f"unresolved branch target at 0x{last.offset:04x}: every block is a successor")
                succ = [bb.idx for bb in blocks]
            else:
                succ = [block_of[t] for t in ts]
            blk.succs = succ + (fall if cond else [])
        elif b in ("BRX", "BRXU", "JMX", "JMXU"):
            ts = targets.get(blk.end - 1, [])
            if ts:  # the jump table's targets, as the cubin declares them
                blk.succs = [block_of[t] for t in ts] + (fall if cond else [])
            else:
                notes.append(f"indirect branch at 0x{last.offset:04x}: every block is a successor")
                blk.succs = [bb.idx for bb in blocks] + fall
        elif b == "CALL":
            ts = targets.get(blk.end - 1, [])
            if not ts:
                notes.append(f"call target outside the listing at 0x{last.offset:04x} ({last.text}); not analysed")
                if unresolved is not None:
                    unresolved.add(last.offset)
            blk.succs = [block_of[t] for t in ts] + fall
        elif b == "RET":
            blk.succs = [block_of[r] for r in call_returns if r in block_of] + (fall if cond else [])
        elif b in ("EXIT", "KILL", "RTT") or (b == "BPT" and "TRAP" in last.mods):
            blk.succs = fall if cond else []
        else:
            blk.succs = fall
        blk.succs = list(dict.fromkeys(blk.succs))
    return blocks, block_of.get(pos.get(entry_off, 0), 0)


# ============================================================================================
# the abstract interpreter
# ============================================================================================

_EMPTY: frozenset = frozenset()
_UNKNOWN = "?"


class _Env:
    """Static facts: parameters, secrets, and the flow-insensitive memory summary."""

    def __init__(self, params: list[ParamInfo], smem_control_from: int | None = None):
        self.params = params
        # shared memory: one region ("S"), or with ``smem_control_from`` two: the data area ("S") and the
        # control area ("S:ctl", accesses whose address immediate is at or above it; see SmemLayout)
        self.smem_control_from = smem_control_from
        self.slots: list[tuple[int, int, ParamInfo]] = [(p.cbank_offset, p.cbank_offset + p.size, p) for p in params]
        self.ptr_names = frozenset(p.name for p in params
                                   if p.role in ("pointer", "tensordesc", "pointer-to-pointer", "hidden", "unmapped"))
        self.secret_ptrs = frozenset(p.name for p in params if p.secret and
                                     p.role in ("pointer", "tensordesc", "pointer-to-pointer", "unmapped"))
        self.secret_scalars = [p for p in params if p.secret and p.role in ("scalar", "unmapped")]
        self.any_secret = bool(self.secret_ptrs or self.secret_scalars)
        # memory summary: region -> (taint, provenance)
        self.mem: dict[str, tuple[bool, frozenset]] = {}
        for name in self.secret_ptrs:
            self.mem[f"G:{name}"] = (True, _EMPTY)
        for p in params:
            if p.role == "pointer-to-pointer":
                t, pr = self.mem.get(f"G:{p.name}", (False, _EMPTY))
                self.mem[f"G:{p.name}"] = (t, pr | {_UNKNOWN})
        self.mem_version = 0
        self._const_cache: dict[tuple[int, int], tuple[bool, frozenset]] = {}

    # ---- constant bank
    def const(self, bank: int, off: int, nbytes: int) -> tuple[bool, frozenset]:
        if bank != 0:
            return False, _EMPTY
        key = (off, nbytes)
        hit = self._const_cache.get(key)
        if hit is not None:
            return hit
        t, prov = False, set()
        for lo, hi, p in self.slots:
            if off < hi and off + nbytes > lo:
                if p.secret and p.role in ("scalar", "unmapped"):
                    t = True
                if p.role in ("pointer", "tensordesc", "pointer-to-pointer", "hidden", "unmapped"):
                    prov.add(p.name)
        res = (t, frozenset(prov))
        self._const_cache[key] = res
        return res

    def const_secret_name(self, bank: int, off: int, nbytes: int) -> str | None:
        if bank != 0:
            return None
        for lo, hi, p in self.slots:
            if off < hi and off + nbytes > lo and p.secret and p.role in ("scalar", "unmapped"):
                return p.name
        return None

    # ---- memory summary
    def smem_region(self, spec: tuple) -> str:
        imm = spec[1] if len(spec) > 1 else None
        if self.smem_control_from is not None and imm is not None and imm >= self.smem_control_from:
            return "S:ctl"
        return "S"

    def mem_get(self, region: str) -> tuple[bool, frozenset]:
        return self.mem.get(region, (False, _EMPTY))

    def mem_join(self, region: str, t: bool, p: frozenset) -> None:
        ot, op = self.mem.get(region, (False, _EMPTY))
        nt, np_ = ot or t, op | p
        if nt != ot or len(np_) != len(op):
            self.mem[region] = (nt, np_)
            self.mem_version += 1

    def everything(self, state_t: set | None = None) -> tuple[bool, frozenset]:
        """Join over every memory region (an access with unknown address)."""
        t = self.any_secret or any(v[0] for v in self.mem.values())
        if state_t is not None and not t:
            t = any(k.startswith("L") for k in state_t)
        prov = set(self.ptr_names) | {_UNKNOWN}
        for v in self.mem.values():
            prov |= v[1]
        return t, frozenset(prov)

    def global_regions(self, prov: frozenset) -> list[str] | None:
        """Regions an address with provenance ``prov`` may point to; None = unknown."""
        if not prov or _UNKNOWN in prov:
            return None
        return [f"G:{p}" for p in sorted(prov)] + ["G?"]

    def read_global(self, prov: frozenset) -> tuple[bool, frozenset]:
        regions = self.global_regions(prov)
        if regions is None:
            return self.everything()
        t, p = False, set()
        for r in regions:
            rt, rp = self.mem_get(r)
            t = t or rt
            p |= rp
        return t, frozenset(p)

    def write_global(self, prov: frozenset, t: bool, p: frozenset, generic: bool) -> None:
        regions = self.global_regions(prov)
        if regions is None:
            self.mem_join("G?", t, p)
            if generic:
                self.mem_join("S", t, p)
                if self.smem_control_from is not None:
                    self.mem_join("S:ctl", t, p)
            return
        for r in regions[:-1]:
            self.mem_join(r, t, p)


FULL = 0xFFFFFFFF


def _smear_up(m: int) -> int:
    """Bits an addition/multiplication result may take from operand bits ``m`` (carries go up)."""
    if not m:
        return 0
    return FULL & ~((m & -m) - 1)


_LOP3_CACHE: dict[tuple, tuple[bool, bool]] = {}


def _lop3_bit(lut: int, states: tuple, alias: int | None) -> tuple[bool, bool]:
    """(output depends on a tainted input, output may differ from the aliased input) for one bit.

    ``states[i]``: "0"/"1" known constant bit, "t" tainted unknown bit, "f" untainted unknown bit.
    """
    key = (lut, states, alias)
    hit = _LOP3_CACHE.get(key)
    if hit is not None:
        return hit
    free = [i for i, st in enumerate(states) if st in "tf"]
    tainted = [i for i in free if states[i] == "t"]
    clean = [i for i in free if states[i] == "f"]
    depends = False
    may_change = alias is None
    for cu in range(1 << len(clean)):
        outs = set()
        for ct in range(1 << len(tainted)):
            v = [0, 0, 0]
            for i, st in enumerate(states):
                if st in "01":
                    v[i] = int(st)
            for k, i in enumerate(clean):
                v[i] = (cu >> k) & 1
            for k, i in enumerate(tainted):
                v[i] = (ct >> k) & 1
            out = (lut >> ((v[0] << 2) | (v[1] << 1) | v[2])) & 1
            outs.add(out)
            if alias is not None and out != v[alias]:
                may_change = True
        if len(outs) > 1:
            depends = True
    _LOP3_CACHE[key] = (depends, may_change)
    return depends, may_change


class _State:
    """Flow-sensitive abstract state.

    ``T``: taint per location as a bit mask (32-bit registers and local slots are tracked per bit,
    predicates and everything else use ``FULL``); ``P``: provenance per location (absent = empty);
    ``G``: guarded values, ``loc -> (guard_key, mask, prov)`` = "the last write to ``loc`` happened
    under ``guard_key`` (predicate, negated) and, whenever that predicate still holds, ``loc`` has
    this value".  ``G`` makes ``@!P5 MOV R2, 0x4000 ... @!P5 SYNCS.ARRIVE ..., R2`` precise: reads
    under the same guard see the guarded value instead of the join with the old one.  Entries die
    when the location is rewritten or the predicate register is redefined; joins keep only entries
    with the same guard on both sides.  ``W`` (witness: which instruction tainted a location) only
    feeds the explanatory traces of violations.
    """

    __slots__ = ("T", "P", "G", "W", "key", "pc", "D", "C")

    def __init__(self, T=None, P=None, G=None, W=None):
        self.T: dict = T if T is not None else {}
        self.P: dict = P if P is not None else {}
        self.G: dict = G if G is not None else {}
        self.W: dict = W if W is not None else {}
        self.key = None  # guard key of the instruction being executed
        self.pc = -1  # offset of the instruction being executed
        # Predicate aliases, within one basic block only (never copied or joined): ``D`` = predicate ->
        # (its defining instruction's opcode and sources, the registers it read); ``C`` = predicate -> an
        # earlier predicate defined by the same instruction from the same, unchanged sources. A guard is
        # keyed by its alias, so ``@UP1 UMOV UR9, URZ`` then ``@UP0 UTMASTG [UR8]`` (UP0 and UP1 both
        # ``VOTEU.ANY`` of P1) reads the guarded UR9. Block-local because a vote's result also depends
        # on which threads are active, which only a branch changes.
        self.D: dict = {}
        self.C: dict = {}

    def canon(self, pred: str) -> str:
        return self.C.get(pred, pred)

    def kill(self, loc: str) -> None:
        """``loc`` is written: aliases that read it or name it are no longer valid."""
        if self.D:
            for k in [k for k, (_, regs) in self.D.items() if k == loc or loc in regs]:
                del self.D[k]
        if self.C:
            for k in [k for k, v in self.C.items() if k == loc or v == loc]:
                del self.C[k]

    def define_pred(self, pred: str, sig: tuple, regs: frozenset) -> None:
        for other, (osig, _) in self.D.items():
            if osig == sig and other != pred:
                self.C[pred] = self.C.get(other, other)
                break
        self.D[pred] = (sig, regs)

    def copy(self) -> "_State":
        return _State(dict(self.T), dict(self.P), dict(self.G), dict(self.W))

    def m(self, r: str) -> int:
        if self.key is not None and self.G:
            e = self.G.get(r)
            if e is not None and e[0] == self.key:
                return e[1]
        return self.T.get(r, 0)

    def t(self, r: str) -> bool:
        return self.m(r) != 0

    def p(self, r: str) -> frozenset:
        if self.key is not None and self.G:
            e = self.G.get(r)
            if e is not None and e[0] == self.key:
                return e[2]
        return self.P.get(r, _EMPTY)

    def any_t(self, regs: Iterable[str]) -> bool:
        for r in regs:
            if self.m(r):
                return True
        return False

    def which_t(self, regs: Iterable[str]) -> list[str]:
        return [r for r in regs if self.m(r)]

    def prov(self, regs: Iterable[str]) -> frozenset:
        out = _EMPTY
        for r in regs:
            v = self.p(r)
            if v:
                out = out | v
        return out

    def set(self, loc: str, mask: int, p: frozenset, guard_key, extra: int = 0) -> None:
        """Write ``loc``: value taint ``mask``; ``extra`` = bits tainted only through a tainted guard."""
        T, P, G = self.T, self.P, self.G
        self.kill(loc)
        total = mask | extra
        if total:
            self.W[loc] = self.pc
        if guard_key is None:
            if total:
                T[loc] = total
            else:
                T.pop(loc, None)
            if p:
                P[loc] = p
            else:
                P.pop(loc, None)
            if G:
                G.pop(loc, None)
        else:
            if total:
                T[loc] = T.get(loc, 0) | total
            if p:
                P[loc] = P.get(loc, _EMPTY) | p
            G[loc] = (guard_key, mask, p)
        if G and (loc[0] == "P" or loc.startswith("UP")):
            dead = [k for k, e in G.items() if e[0][0] == loc]
            for k in dead:
                del G[k]

    def weak(self, loc: str, mask: int, p: frozenset) -> None:
        self.kill(loc)
        if mask:
            self.W[loc] = self.pc
            self.T[loc] = self.T.get(loc, 0) | mask
        if p:
            self.P[loc] = self.P.get(loc, _EMPTY) | p
        if self.G:
            self.G.pop(loc, None)

    def join_into(self, other: "_State") -> bool:
        """other := other |_| self; returns True if other changed."""
        changed = False
        ot = other.T
        for k, v in self.T.items():
            ov = ot.get(k, 0)
            if v & ~ov:
                if not ov:
                    other.W[k] = self.W.get(k, -1)
                ot[k] = ov | v
                changed = True
        op = other.P
        for k, v in self.P.items():
            ov = op.get(k)
            if ov is None:
                op[k] = v
                changed = True
            elif not v <= ov:
                op[k] = ov | v
                changed = True
        og = other.G
        if og:
            sg = self.G
            for k in list(og):
                e = og[k]
                f = sg.get(k)
                if f is None or f[0] != e[0]:
                    del og[k]
                    changed = True
                elif (f[1] & ~e[1]) or not f[2] <= e[2]:
                    og[k] = (e[0], e[1] | f[1], e[2] | f[2])
                    changed = True
        return changed


class _Analyzer:
    def __init__(self, listing: Listing, params: list[ParamInfo], entry_off: int, notes: list[str],
                 smem_control_from: int | None = None):
        self.listing = listing
        self.ins = listing.instrs
        self.sems: list[Sem] = [decode(x) for x in self.ins]
        self.env = _Env(params, smem_control_from)
        self.notes = notes
        self.unresolved: set[int] = set()
        self.blocks, self.entry = _build_cfg(listing, entry_off, notes, self.unresolved)
        self.iterations = 0
        self.why: dict[int, list[tuple]] = {}
        self.by_offset = {x.offset: x for x in self.ins}
        self.pred_defs = [self._pred_def(x) for x in self.ins]  # decoded once, not on every fixpoint visit

    def _read(self, spec: tuple, S: _State) -> tuple[bool, frozenset]:
        env = self.env
        kind = spec[0]
        if kind == "S":
            return env.mem_get(env.smem_region(spec))
        if kind in ("G", "GEN"):
            prov = S.prov(spec[1])
            if kind == "GEN" and env.global_regions(prov) is None:
                return env.everything(S.T)
            return env.read_global(prov)
        if kind == "L":
            slots = spec[1]
            t = S.t("L*")
            p = S.p("L*")
            if slots is None:
                t = t or any(k.startswith("L:") for k in S.T)
                for k, v in S.P.items():
                    if k.startswith("L:"):
                        p = p | v
            else:
                for s in slots:
                    key = f"L:{s}"
                    t = t or S.t(key)
                    p = p | S.p(key)
            return t, p
        if kind == "TMA":
            prov = S.prov(spec[1])
            if env.global_regions(prov) is None:
                return env.everything()
            dt, dp = env.read_global(prov)  # the descriptor's memory
            if not dp or _UNKNOWN in dp:
                return env.everything()
            t = dt or bool(dp & env.secret_ptrs)
            data_t, data_p = env.read_global(dp)
            return t or data_t, data_p
        raise AssertionError(kind)

    def _write(self, spec: tuple, S: _State, t: bool, p: frozenset, guard_key) -> None:
        env = self.env
        kind = spec[0]
        if kind == "S":
            env.mem_join(env.smem_region(spec), t, p)
        elif kind in ("G", "GEN"):
            prov = S.prov(spec[1])
            env.write_global(prov, t, p, kind == "GEN")
            if kind == "GEN" and env.global_regions(prov) is None:
                S.weak("L*", FULL if t else 0, p)
        elif kind == "L":
            slots = spec[1]
            if slots is None:
                S.weak("L*", FULL if t else 0, p)
            else:
                for s in slots:
                    S.set(f"L:{s}", FULL if t else 0, p, guard_key)
        elif kind == "TMA":
            prov = S.prov(spec[1])
            if env.global_regions(prov) is None:
                dp = frozenset({_UNKNOWN})
            else:
                dp = env.read_global(prov)[1] or frozenset({_UNKNOWN})
            env.write_global(dp, t, p, False)

    _PRED_DEFS = ("ISETP", "UISETP", "FSETP", "PLOP3", "UPLOP3", "VOTEU", "VOTE")

    @classmethod
    def _pred_def(cls, x: Instr):
        """(predicate, signature, registers read) of an unguarded predicate definition whose result is a
        function of its operands alone (see _State.D), else None."""
        if x.guard is not None or x.base not in cls._PRED_DEFS or not x.operands:
            return None
        dest = parse_operand(x.operands[0])
        if dest.kind != "pred" or dest.negated or dest.reg in ("PT", "UPT"):
            return None
        regs = frozenset(r for o in x.operands[1:] for r, _ in _inner_regs(o))
        return dest.reg, (x.opcode, tuple(o.replace(".reuse", "") for o in x.operands[1:])), regs

    def _step(self, i: int, S: _State, sink: list | None) -> None:
        self._step_effects(i, S, sink)
        d = self.pred_defs[i]
        if d is not None:
            S.define_pred(*d)

    def _step_effects(self, i: int, S: _State, sink: list | None) -> None:
        x = self.ins[i]
        s = self.sems[i]
        env = self.env
        key = (S.canon(x.guard), x.guard_neg) if x.guard is not None else None
        S.pc = x.offset
        S.key = None
        gt = x.guard is not None and S.t(x.guard)
        S.key = key
        at_regs = S.which_t(s.addr) if s.addr else []
        at = bool(at_regs)

        if sink is not None:
            self._check(x, s, S, gt, at_regs, sink)
            self._record_why(x, s, S, gt, at_regs)

        fam = s.family
        if fam in ("branch", "nop") or (fam == "timing" and not s.dests):
            S.key = None
            return
        if s.local is not None:
            self._local(s, S, key, gt, at)
            S.key = None
            return
        if s.bitop is not None:
            self._bitop_step(s, S, key, gt)
            S.key = None
            return
        vt = S.any_t(s.srcs)
        vp = S.prov(s.srcs)
        for bank, off, nb in s.consts:
            ct, cp = env.const(bank, off, nb)
            vt = vt or ct
            if cp:
                vp = vp | cp
        if s.const_indexed:
            vt = vt or bool(env.secret_scalars)
            vp = vp | env.ptr_names
        for spec in s.reads:
            rt, rp = self._read(spec, S)
            vt = vt or rt
            if rp:
                vp = vp | rp
        if s.is_memory:
            vt = vt or at
        if s.public_dests:
            dt, dp = gt, _EMPTY
        else:
            dt, dp = vt or gt, vp
        wt = vt or gt or at
        writes = s.writes
        S.key = None
        mask = FULL if (dt and not s.public_dests) else 0
        extra = FULL if gt else 0
        for d in s.dests:
            S.set(d, mask, _EMPTY if (d[0] == "P" or d.startswith("UP")) else dp, key, extra)
        for spec in writes:
            self._write(spec, S, wt, vp, key)

    def _local(self, s: Sem, S: _State, key, gt: bool, at: bool) -> None:
        """LDL/STL with known [R1+imm] slots: per-slot, bit-precise (predicate words get spilled)."""
        op, slots, regs = s.local
        extra = FULL if gt else 0
        if op == "ld":
            star_m, star_p = S.m("L*"), S.p("L*")
            vals = []
            for off, r in zip(slots, regs):
                loc = f"L:{off}"
                m = S.m(loc) | star_m | (FULL if at else 0)
                vals.append((r, m, S.p(loc) | star_p))
            S.key = None
            for r, m, p in vals:
                S.set(r, m, p, key, extra)
        else:
            vals = [(f"L:{off}", S.m(r) | (FULL if at else 0), S.p(r)) for off, r in zip(slots, regs)]
            S.key = None
            for loc, m, p in vals:
                S.set(loc, m, p, key, extra)

    def _opmask(self, S: _State, op: tuple) -> tuple[int, int | None]:
        kind = op[0]
        if kind == "r":
            return S.m(op[1]), None
        if kind == "k":
            return 0, op[1]
        if kind == "c":
            return (FULL if self.env.const(op[1], op[2], op[3])[0] else 0), None
        return 0, None

    def _bitop_step(self, s: Sem, S: _State, key, gt: bool) -> None:
        bop = s.bitop
        kind = bop[0]
        prov = S.prov(s.srcs)
        for bank, off, nb in s.consts:
            prov = prov | self.env.const(bank, off, nb)[1]
        change = FULL
        pred_t = False
        r2p = None
        if kind == "lop3":
            _, dest, ops, lut, pins = bop
            ms = [self._opmask(S, o) for o in ops]
            alias = next((i for i, o in enumerate(ops) if o[0] == "r" and o[1] == dest), None)
            mask = 0
            change = 0
            for bit in range(32):
                b = 1 << bit
                states = tuple(("1" if (c >> bit) & 1 else "0") if c is not None else ("t" if m & b else "f")
                               for m, c in ms)
                dep, chg = _lop3_bit(lut, states, alias)
                if dep:
                    mask |= b
                if chg:
                    change |= b
            pred_t = bool(mask) or S.any_t(pins)
        elif kind == "copy":
            mask = self._opmask(S, bop[2])[0]
        elif kind == "shf":
            _, dest, a, b, sh, left, hi, signed = bop
            ma, mb = self._opmask(S, a)[0], self._opmask(S, b)[0]
            if sh == 0:
                mask = mb if (hi and not left) else ma
            elif sh >= 32:
                mask = FULL if (ma or mb) else 0
            elif left and not hi:
                mask = (ma << sh) & FULL
            elif left and hi:
                mask = ((mb << sh) | (ma >> (32 - sh))) & FULL
            elif hi:  # right, high word: b >> sh
                mask = mb >> sh
                if signed and mb & 0x80000000:
                    mask |= FULL & ~(FULL >> sh)
            else:  # right, low word of {b:a} >> sh
                mask = ((ma >> sh) | (mb << (32 - sh))) & FULL
        elif kind == "sel":
            _, dest, a, b, p = bop
            mask = self._opmask(S, a)[0] | self._opmask(S, b)[0] | (FULL if S.t(p) else 0)
        elif kind == "prmt":
            _, dest, a, sel, b = bop
            src = self._opmask(S, a)[0] | (self._opmask(S, b)[0] << 32)
            mask = 0
            for j in range(4):
                nib = (sel >> (4 * j)) & 0xF
                byte = (src >> (8 * (nib & 7))) & 0xFF
                if nib & 8:
                    byte = 0xFF if byte & 0x80 else 0
                mask |= byte << (8 * j)
        elif kind == "p2r":
            _, dest, a, m, shift, pfx = bop
            ma = self._opmask(S, a)[0]
            mask = ma & ~((m << shift) & FULL)
            for i in range(7):
                if (m >> i) & 1 and S.t(f"{pfx}{i}"):
                    mask |= 1 << (i + shift)
            mask &= FULL
        elif kind == "r2p":
            _, a, m, shift = bop
            ma = self._opmask(S, a)[0]
            r2p = {}
            for d in s.dests:
                i = int(d.lstrip("UP"))
                r2p[d] = bool((ma >> (i + shift)) & 1)
            mask = 0
        elif kind == "arith":
            _, dest, ops, shift, pins = bop
            m = 0
            for i, o in enumerate(ops):
                om = self._opmask(S, o)[0]
                m |= ((om << shift) & FULL) if (i == 0 and shift) else om
            mask = FULL if S.any_t(pins) else _smear_up(m)
            pred_t = bool(mask)
        else:  # pragma: no cover
            mask = FULL
        S.key = None
        for d in s.dests:
            if d[0] == "P" or d.startswith("UP"):
                t = r2p[d] if r2p is not None else pred_t
                S.set(d, FULL if t else 0, _EMPTY, key, FULL if gt else 0)
            else:
                S.set(d, mask, prov, key, change if gt else 0)

    def _record_why(self, x: Instr, s: Sem, S: _State, gt: bool, at_regs: list[str]) -> None:
        """Final pass only: remember why this instruction's results are tainted (for traces)."""
        env = self.env
        why: list[tuple] = []
        key = S.key
        if gt:
            S.key = None
            why.append(("loc", x.guard, S.W.get(x.guard, -1)))
            S.key = key
        for r in s.srcs:
            if S.t(r):
                why.append(("loc", r, S.W.get(r, -1)))
        for bank, off, nb in s.consts:
            name = env.const_secret_name(bank, off, nb)
            if name:
                why.append(("src", f"c[0x{bank:x}][0x{off:x}] = secret scalar {name}"))
        if s.const_indexed and env.secret_scalars:
            why.append(("src", "indexed constant-bank read (secret scalars present)"))
        if s.local is not None and s.local[0] == "ld":
            for off in s.local[1]:
                if S.t(f"L:{off}"):
                    why.append(("loc", f"L:{off}", S.W.get(f"L:{off}", -1)))
        elif s.local is not None:
            for r in s.local[2]:
                if S.t(r):
                    why.append(("loc", r, S.W.get(r, -1)))
        for spec in s.reads:
            if self._read(spec, S)[0] and not (s.local is not None and spec[0] == "L" and not S.t("L*")):
                why.append(("src", self._read_reason(spec, S)))
        if s.is_memory:
            for r in at_regs:
                why.append(("loc", r, S.W.get(r, -1)))
        S.key = key
        self.why[x.offset] = why

    def _read_reason(self, spec: tuple, S: _State) -> str:
        env = self.env
        kind = spec[0]
        if kind == "S":
            if env.smem_region(spec) == "S:ctl":
                return "shared memory, control area (received secret data)"
            if env.smem_control_from is not None:
                return "shared memory, data area (holds secret data)"
            return "shared memory (holds secret data: coarse model)"
        if kind == "L":
            return "local memory (spilled secret)"
        prov = S.prov(spec[1])
        if kind == "TMA":
            if env.global_regions(prov) is None:
                return "TMA load through a descriptor of unknown provenance (secret arguments present)"
            dp = env.read_global(prov)[1]
            names = sorted(dp & env.secret_ptrs)
            return f"TMA load through a descriptor built from secret {', '.join(names) or 'data'}"
        regions = env.global_regions(prov)
        if regions is None:
            return "global/generic load from an address of unknown provenance (secret arguments present)"
        secret = sorted(p for p in prov if p in env.secret_ptrs)
        if secret:
            return f"global load of data behind secret pointer {', '.join(secret)}"
        return "global load from a region that received secret data (" + ", ".join(
            r[2:] if r != "G?" else "<unknown>" for r in regions if env.mem_get(r)[0]) + ")"

    def trace(self, loc: str, w: int, limit: int = 10) -> list[str]:
        """Follow witnesses back from a tainted location to a secret source."""
        out: list[str] = []
        seen = set()
        by_off = self.by_offset
        while len(out) < limit:
            if w is None or w < 0 or (loc, w) in seen:
                out.append(f"{loc} (tainted on entry to a block; origin not recorded)" if w is not None and w < 0
                           else f"{loc}")
                break
            seen.add((loc, w))
            ins = by_off.get(w)
            why = self.why.get(w, [])
            shown = f"local[0x{int(loc[2:]):x}]" if loc.startswith("L:") else loc
            out.append(f"{shown} <- /*{w:04x}*/ {ins.text if ins else '?'}")
            srcs = [r for r in why if r[0] == "src"]
            if srcs:
                out.append("   " + srcs[0][1])
                break
            locs = [r for r in why if r[0] == "loc"]
            if not locs:
                break
            _, loc, w = locs[0]
        return out

    def _check(self, x: Instr, s: Sem, S: _State, gt: bool, at_regs: list[str], sink: list) -> None:
        def add(kind: str, detail: str) -> None:
            v = Violation(x.offset, x.opcode, kind, x.text, detail)
            key = S.key
            S.key = None
            first = x.guard if gt else None
            S.key = key
            if first is None:
                cand = (at_regs if kind == "address" else
                        S.which_t(s.branch_srcs) if kind == "branch" else
                        S.which_t(s.mem_preds) if kind == "predicated-memory" else S.which_t(s.timing_srcs))
                first = cand[0] if cand else None
            if first is not None:
                v._seed = (first, S.W.get(first, -1))
            sink.append(v)

        g = f"guard {'!' if x.guard_neg else ''}{x.guard} tainted" if gt else ""
        fam = s.family
        if fam == "branch":
            if x.offset in self.unresolved:
                add("coverage", "call into code outside the disassembly: callee not analysed")
            regs = S.which_t(s.branch_srcs)
            if gt or regs:
                add("branch", "; ".join(filter(None, [g, f"operand {','.join(regs)} tainted" if regs else ""])))
            return
        if fam == "timing":
            regs = S.which_t(s.timing_srcs)
            if gt or regs:
                add("timing", "; ".join(filter(None, [g, f"operand {','.join(regs)} tainted" if regs else ""])))
            return
        if s.is_memory:
            if gt:
                add("predicated-memory", g)
            mp = S.which_t(s.mem_preds)
            if mp:
                add("predicated-memory", f"predicate operand {','.join(mp)} tainted")
            if at_regs:
                add("address", f"address register {','.join(at_regs)} tainted")
            tr = S.which_t(s.timing_srcs)
            if tr:
                add("timing", f"synchronisation operand {','.join(tr)} tainted")

    # ---- fixpoint
    def run(self) -> Report:
        blocks = self.blocks
        nb = len(blocks)
        ins_state: list[_State | None] = [None] * nb
        ins_state[self.entry] = _State()
        visits = 0
        limit = 500 * max(nb, 1) + 10000
        while True:
            version = self.env.mem_version
            heap = [b for b in range(nb) if ins_state[b] is not None]
            heapq.heapify(heap)
            queued = set(heap)
            while heap:
                b = heapq.heappop(heap)
                queued.discard(b)
                visits += 1
                if visits > limit:  # pragma: no cover - the lattice is finite; this is a safety net
                    raise RuntimeError("SASS taint fixpoint did not converge")
                S = ins_state[b].copy()
                blk = blocks[b]
                for i in range(blk.start, blk.end):
                    self._step(i, S, None)
                for sb in blk.succs:
                    if ins_state[sb] is None:
                        ins_state[sb] = S.copy()
                        changed = True
                    else:
                        changed = S.join_into(ins_state[sb])
                    if changed and sb not in queued:
                        heapq.heappush(heap, sb)
                        queued.add(sb)
            if self.env.mem_version == version:
                break
        self.iterations = visits

        # final pass: collect violations and the tainted-location summary
        sink: list[Violation] = []
        tainted: set[str] = set()
        n_ins = 0
        reachable = [b for b in range(nb) if ins_state[b] is not None]
        for b in reachable:
            S = ins_state[b].copy()
            tainted.update(S.T)
            blk = blocks[b]
            n_ins += blk.end - blk.start
            for i in range(blk.start, blk.end):
                self._step(i, S, sink)
                tainted.update(S.T)
        seen = set()
        violations = []
        for v in sorted(sink, key=lambda v: (v.offset, v.kind)):
            k = (v.offset, v.kind)
            if k not in seen:
                seen.add(k)
                seed = v.__dict__.pop("_seed", None)
                if seed is not None and len(violations) < 50:  # keep reports small: traces for the first 50
                    v.trace = self.trace(*seed)
                violations.append(v)
        unknown: Counter = Counter()
        for b in reachable:
            blk = blocks[b]
            for i in range(blk.start, blk.end):
                if not self.sems[i].known:
                    unknown[self.ins[i].opcode] += 1
        regs = sorted((t for t in tainted if not t.startswith("L")), key=_reg_sort_key)
        mem = sorted(k for k, v in self.env.mem.items() if v[0])
        names = {"S": "shared", "S:ctl": "shared:control", "G?": "global:<unknown>"}
        mem = [names.get(m) or "global:" + m[2:] for m in mem]
        mem += sorted({"local" + (f"[0x{int(t[2:]):x}]" if t.startswith("L:") else "[*]") for t in tainted
                       if t.startswith("L")})
        return Report(kernel="", violations=violations, n_instructions=n_ins, n_blocks=len(reachable),
                      total_instructions=len(self.ins), iterations=visits, tainted_registers=regs,
                      tainted_memory=mem, unknown_opcodes=dict(sorted(unknown.items())))


def _reg_sort_key(r: str):
    m = re.fullmatch(r"([A-Z]+?)(\d+)", r)
    order = {"R": 0, "UR": 1, "P": 2, "UP": 3, "B": 4}
    if m:
        return (order.get(m.group(1), 9), int(m.group(2)), r)
    return (9, 0, r)


# ============================================================================================
# public entry points
# ============================================================================================


def analyze_listing(listing: Listing, params: list[ParamInfo], kernel: str, notes: list[str] | None = None,
                    smem_control_from: int | None = None) -> Report:
    """Run the taint analysis on a parsed listing with an explicit parameter table. ``smem_control_from``:
    where shared memory's control area starts (:class:`SmemLayout`); None models shared memory as one region."""
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
    names = sass_elf.kernel_names(cubin)
    if kernel is None:
        if len(names) != 1:
            raise ValueError(f"cubin has several functions, name the kernel: {names}")
        kernel = names[0]
    kinfo = sass_elf.kernel_info(cubin, kernel)
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
    jfn = _unwrap_jit(fn)
    missing = [s for s in secret if s not in jfn.arg_names]
    if missing:
        raise ValueError(f"secret names are not arguments of {jfn.__name__}: {missing}")
    comp = compile_cubin(jfn, signature, constexprs, target, num_warps, num_stages, attrs, maxnreg)
    expected = _expand_params(jfn, signature, comp.constant_keys, comp.tensordesc_meta)
    layout = comp.smem
    rep = analyze_cubin(comp.cubin, comp.kernel, expected, secret, layout.control_from if layout else None)
    if layout is not None and (layout.control_from is not None or layout.control):
        rep.notes.append(layout.describe())  # the split in use, or why a kernel with barriers has none
    cap = target if isinstance(target, int) else int(target[0]) * 10 + int(target[1])
    rep.target = f"sm_{cap}" + ("a" if cap == 90 else "")
    rep.num_warps, rep.num_stages = num_warps, num_stages
    rep.timings = {"compile_s": round(comp.seconds, 4), **rep.timings}
    return rep


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


def audit_kernels(specs: Iterable[dict], on_error: str = "report", jobs: int = 1) -> list[Report]:
    """Run :func:`sass_taint` over launch specs ``{name, fn, signature, constexprs, secret, num_warps, num_stages}``.

    ``on_error="report"`` turns a failure to compile/analyse into a failed :class:`Report` (``error``
    set, ``ok`` False); ``"raise"`` re-raises.  ``jobs > 1`` compiles/analyses in forked worker
    processes (POSIX only; falls back to serial); results keep the order of ``specs``.
    """
    specs = list(specs)
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
                    return pool.map(_pool_worker, range(len(specs)), chunksize=1)
            except Exception as e:  # noqa: BLE001 - e.g. unpicklable results: do it serially
                print(f"flashcore audit sass: parallel audit failed ({type(e).__name__}: {e}); running serially",
                      file=sys.stderr)
            finally:
                _POOL_SPECS = []
    return [_audit_one(spec, on_error) for spec in specs]


def _safe_unwrap(fn):
    try:
        return _unwrap_jit(fn)
    except Exception:
        return fn


# ============================================================================================
# command line: flashcore audit sass [--json PATH] [--include-fast]
# ============================================================================================


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--json", metavar="PATH", default=None, help="write the full reports as JSON to PATH")
    parser.add_argument("--include-fast", action="store_true",
                        help="also audit the fast (non-DHP) kernels; their findings are reported, never fatal")
    parser.add_argument("--jobs", "-j", type=int, default=min(8, os.cpu_count() or 1), metavar="N",
                        help="parallel compile/analysis processes (default: CPU count, at most 8)")
    parser.add_argument("--show", type=int, default=8, metavar="N",
                        help="violations to print per kernel (default 8; 0 = none)")
    return parser


def _table(title: str, reports: list[Report], console, informational: bool = False) -> None:
    if console is not None:
        from rich.table import Table

        t = Table(title=title, show_lines=False, pad_edge=False, box=None, header_style="bold")
        t.add_column("config", no_wrap=True)
        t.add_column("w/s", no_wrap=True)
        t.add_column("instrs", justify="right", no_wrap=True)
        t.add_column("blocks", justify="right", no_wrap=True)
        t.add_column("violations", no_wrap=True)
        t.add_column("unk", justify="right", no_wrap=True)
        t.add_column("status", no_wrap=True)
        for r in reports:
            status = "[green]OK[/]" if r.ok else ("[red]ERROR[/]" if r.error else
                                                  ("[yellow]findings[/]" if informational else "[red]FAIL[/]"))
            viol = ", ".join(f"{k}={v}" for k, v in r.counts().items()) or "-"
            label = r.name or r.kernel
            if r.name and r.kernel and r.kernel not in r.name:
                label += f" ({r.kernel})"
            t.add_row(label, f"{r.num_warps}/{r.num_stages}", str(r.n_instructions), str(r.n_blocks), viol,
                      str(sum(r.unknown_opcodes.values())), status)
        console.print(t)
    else:
        print(title)
        for r in reports:
            status = "OK" if r.ok else ("ERROR" if r.error else ("findings" if informational else "FAIL"))
            viol = ", ".join(f"{k}={v}" for k, v in r.counts().items()) or "-"
            print(f"  {status:<5} {(r.name or r.kernel):<40} w{r.num_warps}/s{r.num_stages} "
                  f"{r.n_instructions:>6} instrs {r.n_blocks:>4} blocks  {viol}")


def _details(reports: list[Report], show: int, out) -> None:
    for r in reports:
        if r.error:
            print(f"{r.name or r.kernel}: ERROR {r.error}", file=out)
            continue
        if not r.violations or show <= 0:
            continue
        print(f"{r.name or r.kernel}: {len(r.violations)} violation(s)", file=out)
        for k, v in enumerate(r.violations[:show]):
            print(f"    {v}", file=out)
            if k == 0:
                for t in v.trace:
                    print(f"        {t}", file=out)
        if len(r.violations) > show:
            print(f"    ... {len(r.violations) - show} more (see --json)", file=out)


def run(args: argparse.Namespace) -> int:
    try:
        from flashcore.kernels import audit_specs  # lazy: the kernel package may not define it yet
    except Exception as e:  # noqa: BLE001
        print(f"flashcore audit sass: cannot import flashcore.kernels.audit_specs: {e}", file=sys.stderr)
        return 2
    try:
        from rich.console import Console

        console = Console()
        if not console.is_terminal:
            console = Console(width=200)
    except Exception:  # pragma: no cover
        console = None
    t0 = time.perf_counter()
    try:
        secure_specs = list(audit_specs(secure=True))
        fast_specs = list(audit_specs(secure=False)) if getattr(args, "include_fast", False) else []
    except Exception as e:  # noqa: BLE001
        print(f"flashcore audit sass: audit_specs() failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    jobs = max(1, int(getattr(args, "jobs", 1) or 1))
    secure = audit_kernels(secure_specs, jobs=jobs)
    fast: list[Report] = audit_kernels(fast_specs, jobs=jobs) if fast_specs else []
    show = getattr(args, "show", 8)
    _table("DHP-safe (secure) kernels - must be violation-free", secure, console)
    _details(secure, show, sys.stdout)
    if fast:
        _table("fast kernels - informational (secret-dependent behaviour expected)", fast, console, informational=True)
        _details(fast, min(show, 3), sys.stdout)
    gate_ok = bool(secure) and all(r.ok for r in secure)
    if not secure:
        print("flashcore audit sass: audit_specs(secure=True) returned no kernels - refusing to pass an empty gate",
              file=sys.stderr)
    elapsed = time.perf_counter() - t0
    summary = (f"secure: {sum(r.ok for r in secure)}/{len(secure)} clean"
               + (f"; fast: {sum(not r.ok for r in fast)}/{len(fast)} with findings" if fast else "")
               + f" ({elapsed:.1f}s)")
    print(("PASS " if gate_ok else "FAIL ") + summary)
    if getattr(args, "json", None):
        doc = {"ok": gate_ok, "secure": [r.to_dict() for r in secure], "fast": [r.to_dict() for r in fast],
               "elapsed_s": round(elapsed, 3)}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0 if gate_ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashcore audit sass",
                                     description="Static SASS taint audit of the DHP-safe kernels (sm_90a, no GPU).")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
