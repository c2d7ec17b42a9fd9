"""Static taint analysis of the SASS that Triton emits for Hopper (sm_90a): the DHP-safe gate.

The question answered: can any *secret* input (the data behind secret pointers, or the value of a
secret scalar) influence control flow, memory addresses, or the timing of synchronisation in the
real machine code?  We compile the ``@triton.jit`` function for ``sm_90a`` without a GPU,
disassemble the cubin with the ``nvdisasm`` that ships with Triton, and run a flow-sensitive
forward data-flow analysis (a monotone fixpoint over the CFG) on the SASS.

Public API
----------
``sass_taint(fn, signature, constexprs, secret, target=(9, 0), num_warps=4, num_stages=3) -> Report``
``audit_kernels(specs, jobs=1, progress=None) -> list[Report]``  (spec: dict name/fn/signature/constexprs/secret/
num_warps/num_stages; ``jobs > 1`` forks worker processes)
``main(argv) / add_arguments(parser) / run(args)``:
``flashcore audit sass [--out DIR] [--json PATH] [--include-fast] [--jobs N] [--show N] [--no-progress]`` (exit 0 = every
``audit_specs(secure=True)`` configuration is violation-free; 1 = violations, errors or no kernels;
2 = ``flashcore.audit.specs.audit_specs`` unavailable).  Lower-level: ``compile_cubin``,
``disassemble``, ``analyze_cubin``, ``analyze_listing`` (hand-written SASS).

Modules: :mod:`.report` (``Violation``, ``ParamInfo``, ``Report``), :mod:`.compile` (compile for
sm_90a, shared-memory layout, disassemble; per-process caches), :mod:`.elf` (cubin reader),
:mod:`.isa` (SASS parser and per-instruction semantics), :mod:`.params` (parameters -> constant
bank), :mod:`.cfg` (control-flow graph), :mod:`.taint` (the abstract interpreter), :mod:`.memo` (a committed
analysis taken for the same machine code: ``--reuse``), :mod:`.analyze`
(the entry points above), :mod:`.cli` (the command line). Each imports only the ones before it.

Compilation uses ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` (no GPU or
driver needed; cached per process by (fn, signature, constexprs, target, num_warps, num_stages)).
Kernels decorated while ``TRITON_INTERPRET=1`` (``InterpretedFunction``) are rebuilt as JIT
functions and compiled with the interpret knob temporarily off.

Parameters and the constant bank
--------------------------------
On sm_90 kernel parameters live in constant bank 0 starting at ``c[0x0][0x210]``.  The exact
layout is read from the cubin: ``.nv.info.<kernel>`` holds one ``EIATTR_KPARAM_INFO`` record
(ordinal, offset, size) per parameter and ``EIATTR_PARAM_CBANK`` gives the bank offset of the block
(see :mod:`flashcore.audit.sass.elf`).  Ordinals are mapped to Triton argument names: the
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
  are a generic read *and* write of unknown memory; a secret guard (``branch``) or operand (``timing``)
  is reported, as their other effects are not modelled.  Unknown opcodes are listed in the report.
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
  no pointer-to-pointer loads unless an argument is typed ``**T``, which is honoured, as are ``*i64``, ``*u64`` and
  ``*fp64`` arguments, whose 64-bit values may be addresses; a 64-bit scalar argument is an address of unknown
  provenance).  A global or
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

from .analyze import analyze_cubin, analyze_listing, audit_kernels, sass_taint
from .cli import add_arguments, main, run
from .compile import SmemLayout, compile_cubin, disassemble, smem_layout
from .params import map_params
from .report import VIOLATION_KINDS, ParamInfo, Report, Violation

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
    "SmemLayout",
    "smem_layout",
    "map_params",
]
