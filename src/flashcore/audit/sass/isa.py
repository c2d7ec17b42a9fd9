"""SASS (sm_90 / Hopper) text parsing and per-instruction def/use semantics for the taint audit.

``parse_nvdisasm`` turns ``nvdisasm -c`` output into :class:`Instr` records (offset, guard,
opcode, operands, branch-target labels, original text).  ``decode`` turns one instruction into a
:class:`Sem`: which locations it writes, which it reads as data, which registers form a memory
address, which memory it reads/writes, and which operands are control/timing inputs.  The
abstract interpreter in :mod:`flashcore.audit.sass.taint` only ever looks at ``Sem`` objects.

Everything here is deliberately conservative where the ISA is undocumented: register widths
are over-approximated (a vector / wide destination taints the whole range it may write), an
unrecognised opcode reads all its register operands (the first one included) and taints its
destination range of 4 registers, and memory operands of unrecognised opcodes are treated as a
generic read *and* write of unknown memory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# --------------------------------------------------------------------------------------------
# parsing nvdisasm text
# --------------------------------------------------------------------------------------------

_INSTR_RE = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s+(.*?)\s*;?\s*$")
_LABEL_RE = re.compile(r"^\s*([.$A-Za-z_][\w.$@]*):\s*$")
_TARGET_RE = re.compile(r"`\(([^)`]*)\)`?")
_GUARD_RE = re.compile(r"^@(!?)(U?P(?:[0-6]|T))\s+")


@dataclass
class Instr:
    offset: int
    guard: str | None  # predicate register name ("P0", "UP1") or None
    guard_neg: bool
    opcode: str  # full opcode with modifiers, e.g. "LDG.E.128"
    operands: list[str]
    targets: list[str]  # label names referenced with `(label)`
    text: str  # instruction text as printed by nvdisasm, without the offset comment
    section_base: int = 0  # added to nvdisasm's offsets of this function's section (see parse_nvdisasm)

    @property
    def base(self) -> str:
        return self.opcode.split(".", 1)[0]

    @property
    def mods(self) -> list[str]:
        return self.opcode.split(".")[1:]


def split_operands(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    last = "".join(cur).strip()
    if last:
        out.append(last)
    return [o for o in out if o]


@dataclass
class Listing:
    instrs: list[Instr]
    labels: dict[str, int]  # label -> offset of the next instruction
    functions: dict[str, int]  # function symbol -> entry offset


def parse_nvdisasm(text: str) -> Listing:
    instrs: list[Instr] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    functions: list[str] = []
    # nvdisasm starts every function's section at offset 0: a cubin with several functions (a kernel and the device
    # functions it calls) would have instructions at the same offsets, and the control-flow graph would mix them up.
    # Each section whose offsets start again is placed after the previous one (section_base)
    base, prev_raw, last = 0, -1, -0x10
    for line in text.splitlines():
        m = _INSTR_RE.match(line)
        if m:
            raw = int(m.group(1), 16)
            if raw <= prev_raw:
                base = last + 0x10 - raw
            prev_raw = raw
            off = last = base + raw
            for lab in pending:
                labels[lab] = off
            pending = []
            body = m.group(2).strip()
            if body.endswith(";"):
                body = body[:-1].rstrip()
            guard, neg = None, False
            gm = _GUARD_RE.match(body)
            if gm:
                neg = gm.group(1) == "!"
                guard = gm.group(2)
                rest = body[gm.end() :]
            else:
                rest = body
            parts = rest.split(None, 1)
            if not parts:
                continue
            opcode = parts[0]
            opstr = parts[1] if len(parts) > 1 else ""
            targets = _TARGET_RE.findall(opstr)
            opstr = _TARGET_RE.sub(",", opstr)
            operands = split_operands(opstr)
            if guard in ("PT", "UPT") and not neg:
                guard = None
            instrs.append(Instr(off, guard, neg, opcode, operands, targets, body, base))
            continue
        m = _LABEL_RE.match(line)
        if m:
            lab = m.group(1)
            pending.append(lab)
            if not lab.startswith(".L") and not lab.startswith(".text."):
                functions.append(lab)
            continue
        s = line.strip()
        if s.startswith(".type") and "@function" in s:
            name = s.split(None, 1)[1].split(",")[0].strip()
            functions.append(name)
    func_off = {f: labels[f] for f in functions if f in labels}
    return Listing(instrs, labels, func_off)


# --------------------------------------------------------------------------------------------
# operands
# --------------------------------------------------------------------------------------------

_REG_RE = re.compile(r"(?<![\w.])(U?R(?:\d+|Z)|U?P(?:[0-6]|T|R)|B\d+|SRZ|SR_[A-Za-z0-9_]+(?:\.[XYZ])?)((?:\.[\w]+)*)")
_CBANK_RE = re.compile(r"^c\[(0x[0-9a-fA-F]+|\d+)\]\[(.*)\]$")
_HEX_RE = re.compile(r"-?0x[0-9a-fA-F]+|-?\d+")

PRED_NAMES = {f"P{i}" for i in range(7)} | {f"UP{i}" for i in range(7)} | {"PT", "UPT", "PR", "UPR"}
CONST_REGS = {"RZ", "URZ", "PT", "UPT", "SRZ"}


def is_pred(name: str) -> bool:
    return name in PRED_NAMES


@dataclass
class Opnd:
    text: str
    kind: str  # reg | pred | mem | gdesc | const | imm | other
    reg: str | None = None
    wide: int = 1  # width implied by a ".64" suffix
    negated: bool = False
    inner: list[tuple[str, int]] = field(default_factory=list)  # registers inside brackets
    cbank: tuple[int, int] | None = None  # (bank, immediate offset)
    stack_off: int | None = None  # [R1+imm] local-memory slot
    imm: int = 0  # the immediate offset inside a memory operand's brackets ([R4+UR8+0x3117c] -> 0x3117c)


def _suffix_width(suffix: str) -> int:
    parts = suffix.split(".")
    if "128" in parts:
        return 4
    if "64" in parts:
        return 2
    return 1


def _inner_regs(s: str) -> list[tuple[str, int]]:
    return [(m.group(1), _suffix_width(m.group(2))) for m in _REG_RE.finditer(s) if not m.group(1).startswith("SR")]


def parse_operand(text: str) -> Opnd:
    t = text.strip()
    if t.startswith("c[") or t.startswith("-c[") or t.startswith("|c[") or t.startswith("-|c["):
        core = t.strip("-|")
        m = _CBANK_RE.match(core)
        if m:
            bank = int(m.group(1), 0)
            idx = m.group(2)
            regs = _inner_regs(idx)
            off = 0
            nums = _HEX_RE.findall(_REG_RE.sub("", idx))
            for n in nums:
                off += int(n, 0)
            return Opnd(t, "const", inner=regs, cbank=(bank, off))
        return Opnd(t, "const", inner=_inner_regs(t))
    if t.startswith("cx["):
        return Opnd(t, "const", inner=_inner_regs(t))
    if "gdesc[" in t:
        return Opnd(t, "gdesc", inner=_inner_regs(t))
    if "[" in t:
        inner = _inner_regs(t)
        # ``desc[URx]`` (a global access's memory descriptor: its L2 cache policy among others) names a 64-bit pair,
        # URx and URx+1; the policy decides what the access evicts, so both registers are address operands (found by
        # a review, 2026-11-28: only URx was read)
        dm = re.match(r"desc\[(UR\d+)\]", t)
        if dm:
            inner = [(r, 2 if r == dm.group(1) else w) for r, w in inner]
        op = Opnd(t, "mem", inner=inner)
        inside = t[t.index("[") + 1:t.rindex("]")] if "]" in t else t
        op.imm = sum(int(n, 0) for n in _HEX_RE.findall(_REG_RE.sub("", inside).replace("+", " ").replace(" -", " -")))
        # [R1+imm] / [R1] : thread-local stack slot
        m = re.fullmatch(r"\[R1(?:\s*\+\s*(-?0x[0-9a-fA-F]+))?\]", t.replace(" ", ""))
        if m:
            op.stack_off = int(m.group(1), 16) if m.group(1) else 0
        return op
    core = t
    neg = False
    while core and core[0] in "-!~|+":
        if core[0] == "!":
            neg = True
        core = core[1:]
    core = core.rstrip("|")
    m = _REG_RE.fullmatch(core)
    if m:
        name = m.group(1)
        kind = "pred" if is_pred(name) else "reg"
        if name.startswith("SR"):
            kind = "other"
        return Opnd(t, kind, reg=name, wide=_suffix_width(m.group(2)), negated=neg)
    if _HEX_RE.fullmatch(t) or re.fullmatch(r"[-+]?(\d+\.?\d*(e[-+]?\d+)?|INF|QNAN|NAN)", t, re.I):
        return Opnd(t, "imm")
    return Opnd(t, "other", inner=_inner_regs(t))


def reg_range(name: str, width: int) -> list[str]:
    """Expand a register name to the ``width`` consecutive registers it starts (constants dropped)."""
    if name in CONST_REGS or name.startswith("SR"):
        return []
    if name == "PR":
        return [f"P{i}" for i in range(7)]
    if name == "UPR":
        return [f"UP{i}" for i in range(7)]
    m = re.fullmatch(r"(UR|R|B)(\d+)", name)
    if not m:
        return [name]
    prefix, n = m.group(1), int(m.group(2))
    limit = {"R": 255, "UR": 63, "B": 16}[prefix]
    return [f"{prefix}{i}" for i in range(n, min(n + max(width, 1), limit))]


# --------------------------------------------------------------------------------------------
# opcode families
# --------------------------------------------------------------------------------------------

BRANCH = {"BRA", "BRX", "BRXU", "JMP", "JMX", "JMXU", "CALL", "RET", "EXIT", "KILL", "BREAK", "BSSY", "BSYNC", "BPT", "RTT"}
#: transfers of control (end a basic block)
TRANSFER = {"BRA", "BRX", "BRXU", "JMP", "JMX", "JMXU", "CALL", "RET", "EXIT", "KILL", "BPT", "RTT"}
TIMING = {
    "BAR", "NANOSLEEP", "WARPSYNC", "YIELD", "MEMBAR", "FENCE", "ERRBAR", "CGAERRBAR", "DEPBAR", "LDGDEPBAR",
    "WARPGROUP", "UCGABAR_ARV", "UCGABAR_WAIT", "UCGABAR_GET", "ACQBULK", "PMTRIG", "USETMAXREG", "SETMAXREG",
    "UTMACMDFLUSH", "CCTLL", "ERRBAR",
    # griddepcontrol.launch_dependents: the next kernel of a programmatic dependent launch may start from here, so a
    # secret guard or operand would move when it starts (found by a review, 2026-11-28: it was an unknown opcode)
    "PREEXIT",
}
NOPS = {"NOP"}
SYNC_MEM = {"SYNCS", "ARRIVES"}  # mbarrier operations
ADDR_ONLY = {"CCTL", "UTMACCTL", "UTMAPF", "UBLKPF", "CCTLT"}
# special registers holding the shared-memory window's base (generic addresses of shared memory)
WINDOW_REGS = ("SR_SWINHI", "SR_SWINLO")
# the location a block-wide predicate reduction (BAR.RED) leaves its result in, for B2R.RESULT
BARRIER_RESULT = "BRES"
# texture and surface instructions (their coordinates are plain register operands)
TEXTURE = ("TEX", "TLD", "TLD4", "TXD", "TMML", "TXQ", "SULD", "SUST")
LOADS = {"LDG": "G", "LD": "GEN", "LDS": "S", "LDL": "L", "LDSM": "S", "SULD": "GEN", "TEX": "GEN", "TLD": "GEN",
         "TLD4": "GEN", "TXD": "GEN", "TXQ": "GEN", "TMML": "GEN", "LDTRAM": "GEN"}
STORES = {"STG": "G", "ST": "GEN", "STS": "S", "STL": "L", "STSM": "S", "RED": "GEN", "REDG": "G", "SUST": "GEN",
          "SURED": "GEN"}
ATOMICS = {"ATOMG": "G", "ATOM": "GEN", "ATOMS": "S", "SUATOM": "GEN"}
CONST_LOADS = {"LDC", "ULDC", "LDCU"}
ASYNC_COPIES = {"LDGSTS", "UTMALDG", "UTMASTG", "UTMAREDG", "UBLKCP", "UBLKRED"}
MMA = {"HMMA", "IMMA", "DMMA", "BMMA"}
GMMA = {"HGMMA", "IGMMA", "QGMMA", "BGMMA"}
SETP2 = {"ISETP", "UISETP", "FSETP", "DSETP", "HSETP2", "PSETP", "UPSETP", "PLOP3", "UPLOP3", "VSETP", "CSETP"}
DOUBLE = {"DADD", "DMUL", "DFMA", "DMNMX", "DSETP", "DSET"}
CONV = {"F2F", "F2I", "I2F", "I2I", "FRND", "F2IP", "I2IP", "I2FP"}
KNOWN_DATA = {
    # integer
    "IADD3", "IADD", "IADD32I", "IMAD", "IMAD32I", "IMUL", "IMUL32I", "IMNMX", "VIMNMX", "VIMNMX3", "IABS", "ISCADD",
    "ISCADD32I", "LOP3", "LOP", "LOP32I", "SHF", "SHL", "SHR", "LEA", "SEL", "SGXT", "PRMT", "POPC", "FLO", "BREV",
    "BMSK", "BFE", "BFI", "VIADD", "VIADDMNMX", "IDP", "IDP4A", "IDP2A", "VABSDIFF", "VABSDIFF4", "IMNMX3",
    "ISET", "CSET", "PSET", "FSET", "HSET2", "P2R", "R2P", "MOV", "MOV32I", "PLOP3", "SHFL", "REDUX", "MATCH",
    "VOTE", "ELECT", "S2R", "CS2R", "LEPC", "GETLMEMBASE", "SETLMEMBASE", "BMOV", "B2R", "R2B", "QSPC",
    # float
    "FADD", "FADD32I", "FMUL", "FMUL32I", "FFMA", "FFMA32I", "FMNMX", "FMNMX3", "FSEL", "FCHK", "MUFU", "FSWZADD",
    "FSETP", "F2FP", "HADD2", "HADD2_32I", "HMUL2", "HMUL2_32I", "HFMA2", "HFMA2_32I", "HMNMX2", "HSETP2", "DADD",
    "DMUL", "DFMA", "DMNMX", "DSETP", "FRND", "F2F", "F2I", "I2F", "I2I", "F2IP", "I2IP", "I2FP", "F2FP",
    # uniform datapath
    "UIADD3", "UIMAD", "ULOP3", "ULOP", "ULOP32I", "USHF", "USHL", "USHR", "ULEA", "USEL", "UISETP", "UPLOP3",
    "USGXT", "UPRMT", "UFLO", "UPOPC", "UBREV", "UBMSK", "UIMNMX", "UP2UR", "UR2UP", "UPSETP", "UMOV", "S2UR",
    "R2UR", "VOTEU", "ULDC", "UCLEA", "UF2FP", "UFADD", "UFMUL", "UFFMA",
    "ISETP", "UISETP",
}
PRED_FIRST_ONLY = {"FCHK", "R2P", "UR2UP"}


def all_known() -> set[str]:
    return (BRANCH | TIMING | NOPS | SYNC_MEM | ADDR_ONLY | set(LOADS) | set(STORES) | set(ATOMICS) | CONST_LOADS
            | ASYNC_COPIES | MMA | GMMA | SETP2 | DOUBLE | CONV | KNOWN_DATA)


# --------------------------------------------------------------------------------------------
# semantics
# --------------------------------------------------------------------------------------------


@dataclass
class Sem:
    """Abstract effect of one instruction.

    ``value`` = join over ``srcs`` registers, ``consts`` constant-bank reads, ``reads`` memory reads
    and (for memory instructions) the taint of the ``addr`` registers.  Every location in ``dests``
    receives ``value`` (strong update unless guarded); every spec in ``writes`` receives it too
    (joined with the guard and address taint).  ``public_dests`` instructions (mbarrier ops)
    write untainted values (unless the guard is tainted).
    """

    family: str
    dests: list[str] = field(default_factory=list)
    srcs: list[str] = field(default_factory=list)
    prov_srcs: list[str] | None = None  # None: same as srcs (minus predicates)
    consts: list[tuple[int, int, int]] = field(default_factory=list)  # (bank, offset, nbytes)
    const_indexed: bool = False
    addr: list[str] = field(default_factory=list)
    reads: list[tuple] = field(default_factory=list)
    writes: list[tuple] = field(default_factory=list)
    mem_preds: list[str] = field(default_factory=list)
    branch_srcs: list[str] = field(default_factory=list)
    timing_srcs: list[str] = field(default_factory=list)
    public_dests: bool = False
    is_memory: bool = False
    known: bool = True
    #: bit-precise semantics of a 32-bit integer/logic op (see ``bitop_*`` below), or None
    bitop: tuple | None = None
    #: local-memory access with known stack slots: ("ld" | "st", (offset, ...), data registers)
    local: tuple | None = None
    #: a TMA operation's descriptor-address registers: the hardware forms the global address from the
    #: descriptor's contents (base, shape, strides), so those contents are address operands too
    desc: tuple | None = None


def _mem_width(mods: list[str]) -> int:
    if "128" in mods:
        return 4
    if "64" in mods:
        return 2
    return 1


def _ldsm_width(mods: list[str]) -> int:
    if mods and mods[-1] in ("2", "4"):
        return int(mods[-1])
    return 1


def _regs_of(op: Opnd, width: int = 1) -> list[str]:
    if op.kind in ("reg", "pred"):
        return reg_range(op.reg, max(width, op.wide))
    return []


def _inner_of(op: Opnd, min_width: int = 1) -> list[str]:
    out: list[str] = []
    for name, w in op.inner:
        out += reg_range(name, max(w, min_width))
    return out


def _default_dest_idx(ops: list[Opnd]) -> list[int]:
    idx, i, n = [], 0, len(ops)
    while i < n and ops[i].kind == "pred" and not ops[i].negated:
        idx.append(i)
        i += 1
    if i < n and ops[i].kind == "reg":
        idx.append(i)
        i += 1
        while i < n and ops[i].kind == "pred" and not ops[i].negated and ops[i].reg not in ("PR", "UPR"):
            idx.append(i)
            i += 1
    return idx


def _gmma_dest_width(mods: list[str]) -> int:
    shape = mods[0] if mods else ""
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", shape)
    if not m:
        return 128  # unknown shape: over-approximate (64x256 fp32 accumulator)
    n = int(m.group(2))
    acc = mods[1] if len(mods) > 1 else "F32"
    return max(1, n // 4) if acc == "F16" else max(1, n // 2)


def _const_reads(ops: list[Opnd], nbytes_of) -> tuple[list[tuple[int, int, int]], bool, list[str]]:
    consts, indexed, idx_regs = [], False, []
    for i, op in enumerate(ops):
        if op.kind != "const":
            continue
        regs = _inner_of(op)
        if regs or op.cbank is None:
            indexed = True
            idx_regs += regs
        if op.cbank is not None:
            consts.append((op.cbank[0], op.cbank[1], nbytes_of(i)))
    return consts, indexed, idx_regs


def decode(ins: Instr) -> Sem:
    base, mods = ins.base, ins.mods
    ops = [parse_operand(o) for o in ins.operands]
    has64 = "64" in mods

    # ---------------- control flow ----------------
    if base in BRANCH:
        regs: list[str] = []
        for op in ops:
            if op.kind in ("reg", "pred"):
                if op.reg.startswith("B"):
                    continue  # convergence-barrier register
                regs += _regs_of(op, 2 if op.kind == "reg" and base in ("RET", "BRX", "JMX") else 1)
            elif op.kind in ("mem", "const", "other"):
                regs += _inner_of(op)
        return Sem("branch", branch_srcs=regs)

    if base in NOPS:
        return Sem("nop")

    if base == "BMOV" and ops and ops[0].kind == "reg" and (ops[0].reg or "").startswith("B"):
        # a convergence barrier's thread mask set from a register (BSYNC/BREAK then wait for those threads): a mask that
        # follows a secret decides which threads wait, a timing operand
        regs = [r for op in ops[1:] if op.kind in ("reg", "pred") for r in _regs_of(op) if not r.startswith("B")]
        return Sem("timing", timing_srcs=regs)

    if base in ("S2R", "S2UR") and len(ops) == 2 and ops[1].text.split(".")[0] in WINDOW_REGS:
        # the shared-memory window's base: read as a location, so that an address built from it carries the
        # provenance the analysis gives it (no pointer argument: a generic access may reach shared or local memory)
        return Sem("data", dests=_regs_of(ops[0]), srcs=[ops[1].text.split(".")[0]])

    if base == "B2R" and "RESULT" in mods:  # the last BAR.RED's result: its count, or its OR/AND into a predicate
        dests = [r for op in ops if op.kind in ("reg", "pred") for r in _regs_of(op) if r not in ("RZ", "PT")]
        return Sem("data", dests=dests, srcs=[BARRIER_RESULT])

    if base in TEXTURE:
        # texture and surface accesses name their coordinates and handles as plain registers: each is an address
        # operand (a secret coordinate picks the texels fetched: cache timing), and a fetch may write any register
        # it names (the destination vector's first register is not always the first operand: ``TLD.LZ RZ, R7, R6``)
        regs = [r for op in ops if op.kind == "reg" for r in _regs_of(op) + _inner_of(op) if r not in ("RZ", "URZ")]
        mem_preds = [r for op in ops if op.kind == "pred" for r in _regs_of(op)]
        loads = base not in STORES
        dests = [r for op in ops if op.kind == "reg" for r in _regs_of(op, 4) if r not in ("RZ", "URZ")] if loads \
            else []
        return Sem("load" if loads else "store", dests=dests, srcs=regs, addr=regs, reads=[("GEN", tuple(regs))],
                   writes=[] if loads else [("GEN", tuple(regs))], mem_preds=mem_preds, is_memory=True)

    # ---------------- barriers / waits / fences ----------------
    if base in TIMING:
        if base == "BAR" and "RED" in mods:
            # a block-wide reduction of each thread's predicate (__syncthreads_count/_or/_and): its result, read later
            # by ``B2R.RESULT``, follows every thread's predicate (BARRIER_RESULT), and so may its destination operand
            dests, srcs, timing = [BARRIER_RESULT], [], []
            for i, op in enumerate(ops):
                if i == 0 and op.kind == "reg":
                    dests += _regs_of(op)
                elif op.kind == "pred":
                    srcs += _regs_of(op)
                else:
                    timing += _regs_of(op) + _inner_of(op)
            return Sem("timing", dests=dests, srcs=srcs, timing_srcs=timing)
        timing, dests = [], []
        for i, op in enumerate(ops):
            if i == 0 and op.kind == "pred" and not op.negated:
                dests += _regs_of(op)  # e.g. USETMAXREG.TRY_ALLOC UP0: success flag (public schedule)
            else:
                timing += _regs_of(op) + _inner_of(op)
        return Sem("timing", dests=dests, timing_srcs=timing, public_dests=bool(dests))

    # ---------------- mbarrier (SYNCS.*) ----------------
    if base in SYNC_MEM:
        # The barrier word is state in shared memory: the operation reads it (a wait's predicate, an arrive's
        # token follow what was stored there) and writes it with its data operands (counts, parity). So a
        # secret stored into the barrier's area, through any view, or a secret count, taints the waits on it.
        dests, addr, timing = [], [], []
        spec: tuple = ("S", None)
        for i, op in enumerate(ops):
            if op.kind == "mem":
                addr += _inner_of(op)
                spec = ("S", op.imm, "sync")
            elif i == 0 and op.kind in ("reg", "pred") and not op.negated:
                dests += _regs_of(op, 2 if has64 and op.kind == "reg" else 1)
            else:
                timing += _regs_of(op, 2 if has64 and op.kind == "reg" else 1) + _inner_of(op)
        return Sem("sync", dests=dests, srcs=list(timing), addr=addr, timing_srcs=timing, reads=[spec],
                   writes=[spec], is_memory=True)

    if base in ADDR_ONLY:
        addr = []
        for op in ops:
            addr += _inner_of(op, 2 if base.startswith("UTMA") else 1) + _regs_of(op)
        desc = None
        if base == "UTMAPF":  # a tensor prefetch: {coordinates}, [descriptor] (or the descriptor alone)
            mem_ops = [op for op in ops if op.kind == "mem"]
            if mem_ops:
                desc = tuple(_inner_of(mem_ops[-1], 2))
        return Sem("memctl", addr=addr, is_memory=True, desc=desc)

    # ---------------- constant-bank loads ----------------
    if base in CONST_LOADS:
        w = _mem_width(mods)
        dests = _regs_of(ops[0], w) if ops else []
        consts, indexed, idx_regs = _const_reads(ops, lambda i: 4 * w)
        return Sem("const", dests=dests, consts=consts, const_indexed=indexed, addr=idx_regs,
                   is_memory=indexed)

    # ---------------- loads / stores / atomics ----------------
    if base in LOADS or base in STORES or base in ATOMICS:
        space = LOADS.get(base) or STORES.get(base) or ATOMICS.get(base)
        if base in ("LDSM", "STSM"):
            w = _ldsm_width(mods)
        else:
            w = _mem_width(mods)
        mem_ops = [op for op in ops if op.kind == "mem"]
        addr: list[str] = []
        for op in mem_ops:
            addr += _inner_of(op)
        dests, srcs, mem_preds = [], [], []
        if base in STORES:
            first_mem = next((i for i, op in enumerate(ops) if op.kind == "mem"), 0)
            for op in ops[first_mem + 1 :]:
                if op.kind == "reg":
                    srcs += _regs_of(op, w)
                elif op.kind == "pred":
                    mem_preds += _regs_of(op)
        else:
            didx = [i for i in _default_dest_idx(ops)]
            for i in didx:
                dests += _regs_of(ops[i], w if ops[i].kind == "reg" else 1)
            for i, op in enumerate(ops):
                if i in didx or op.kind == "mem":
                    continue
                if op.kind == "reg":
                    srcs += _regs_of(op, w)
                elif op.kind == "pred":
                    mem_preds += _regs_of(op)
                elif op.kind in ("const", "other"):
                    srcs += _inner_of(op)
        slots = None
        if space == "L":
            so = mem_ops[0].stack_off if mem_ops else None
            if so is not None:
                slots = tuple(so + 4 * k for k in range(w))
        if space == "L":
            spec = ("L", slots)
        elif space in ("G", "GEN"):
            spec = (space, tuple(addr))
        else:  # shared: the immediate offset picks the area (data or control, see sass.py)
            spec = ("S", mem_ops[0].imm if mem_ops else None)
        reads = [spec] if (base in LOADS or base in ATOMICS) else []
        writes = [spec] if (base in STORES or base in ATOMICS) else []
        consts, indexed, idx_regs = _const_reads(ops, lambda i: 8 if has64 else 4)
        fam = "load" if base in LOADS else ("store" if base in STORES else "atomic")
        local = None
        if base in ("LDL", "STL") and slots is not None:
            data = dests if base == "LDL" else srcs
            if len(data) == len(slots):
                local = ("ld" if base == "LDL" else "st", slots, tuple(data))
        return Sem(fam, dests=dests, srcs=srcs, consts=consts, addr=addr + idx_regs, reads=reads, writes=writes,
                   mem_preds=mem_preds, is_memory=True, local=local)

    # ---------------- async copies (cp.async, TMA, bulk copies) ----------------
    if base in ASYNC_COPIES:
        mem_ops = [op for op in ops if op.kind == "mem"]
        other_regs, mem_preds = [], []
        for op in ops:
            if op.kind == "reg":
                other_regs += _regs_of(op)
            elif op.kind == "pred":
                mem_preds += _regs_of(op)
        if base == "LDGSTS":
            dst = _inner_of(mem_ops[0]) if mem_ops else []
            src = _inner_of(mem_ops[1]) if len(mem_ops) > 1 else []
            # (the destination's immediate, so that an address resolved to the barriers' range lands in the control
            # area: _resolve_shared_offsets; a cp.async into an mbarrier word makes its waits follow the data)
            return Sem("copy", srcs=[], addr=dst + src + other_regs, reads=[("G", tuple(src))],
                       writes=[("S", mem_ops[0].imm if mem_ops else 0)], mem_preds=mem_preds, is_memory=True)
        ndim = 5
        for m in mods:
            mm = re.fullmatch(r"([1-5])D", m)
            if mm:
                ndim = int(mm.group(1))
        if base in ("UTMALDG", "UTMASTG", "UTMAREDG"):
            # first operand: a register vector; second: the descriptor's address. A load's vector is {shared address,
            # mbarrier, ndim coordinates}, a plain store's or reduction's {shared address, ndim coordinates} (read off
            # ptxas's output: the secure Gluon kernel's O store sets exactly those, and keeps an unrelated value in
            # the register after them; its secure chunked-prefill form computes a key length into the register after
            # a plain 4D load's vector in the instruction before the load, 2026-11-27). Copies with other modifiers
            # (im2col, multicast, a reduction op) keep one register of margin.
            plain = all(re.fullmatch(r"[1-5]D", m) for m in mods)
            width = (2 if base == "UTMALDG" else 1) + ndim + (0 if plain else 1)
            vec = _inner_of(mem_ops[0], width) if mem_ops else []
            desc = _inner_of(mem_ops[1], 2) if len(mem_ops) > 1 else []
            addr = vec + desc + other_regs
            if base == "UTMALDG":  # (the destination's immediate: as LDGSTS's)
                dst_imm = mem_ops[0].imm if mem_ops else 0
                return Sem("copy", addr=addr, reads=[("TMA", tuple(desc))], writes=[("S", dst_imm)],
                           mem_preds=mem_preds, is_memory=True, desc=tuple(desc))
            return Sem("copy", addr=addr, reads=[("S",)], writes=[("TMA", tuple(desc))], mem_preds=mem_preds,
                       is_memory=True, desc=tuple(desc))
        # UBLKCP.S.G [smem], [global], size  /  UBLKCP.G.S [global], [smem], size  /  UBLKRED.G.S ...
        a0 = _inner_of(mem_ops[0], 2) if mem_ops else []
        a1 = _inner_of(mem_ops[1], 2) if len(mem_ops) > 1 else []
        addr = a0 + a1 + other_regs
        to_shared = len(mods) >= 2 and mods[0] == "S"
        if base == "UBLKCP" and to_shared:
            return Sem("copy", addr=addr, reads=[("G", tuple(a1))], writes=[("S", mem_ops[0].imm if mem_ops else 0)],
                       mem_preds=mem_preds, is_memory=True)
        return Sem("copy", addr=addr, reads=[("S",)], writes=[("G", tuple(a0))], mem_preds=mem_preds,
                   is_memory=True)

    # ---------------- warpgroup MMA (reads shared memory through descriptors) ----------------
    if base in GMMA:
        dw = _gmma_dest_width(mods)
        dests = _regs_of(ops[0], dw) if ops else []
        srcs, addr = [], []
        seen_desc = False
        dest_name = ops[0].reg if ops else None
        a_in_regs = len(ops) > 2 and ops[1].kind == "reg" and ops[2].kind == "gdesc"
        for op in ops[1:]:
            if op.kind == "gdesc":
                seen_desc = True
                # gdesc[URa] = {A descriptor URa..URa+1, B descriptor URa+2..URa+3}; with A in
                # registers only the B half is read.
                regs = _inner_of(op, 4)
                addr += regs[2:] if a_in_regs and len(regs) == 4 else regs
            elif op.kind == "reg":
                if op.reg == dest_name or op.reg == "RZ" or seen_desc:
                    srcs += _regs_of(op, dw)
                else:
                    srcs += _regs_of(op, 4)  # A fragment in registers
            elif op.kind == "pred":
                srcs += _regs_of(op)  # scale-d: a select, data flow
        return Sem("gmma", dests=dests, srcs=srcs, addr=addr, reads=[("S",)], is_memory=True)

    if base in MMA:
        widths = [4, 4, 2, 4]
        dests = _regs_of(ops[0], 4) if ops else []
        srcs = []
        for i, op in enumerate(ops[1:], start=1):
            srcs += _regs_of(op, widths[i] if i < 4 else 1) + _inner_of(op)
        return Sem("mma", dests=dests, srcs=srcs)

    # ---------------- plain data-flow instructions ----------------
    known = base in KNOWN_DATA or base in SETP2 or base in DOUBLE or base in CONV
    if base in SETP2:
        didx = [i for i in range(min(2, len(ops))) if ops[i].kind == "pred"]
    elif base in ("VOTE", "VOTEU"):
        didx = list(range(max(0, len(ops) - 1)))
    elif base == "ELECT":
        didx = list(range(min(2, len(ops))))
    elif base in PRED_FIRST_ONLY:
        didx = [0] if ops else []
    else:
        didx = _default_dest_idx(ops)
    r2p_dests = None
    if base in ("R2P", "UR2UP") and len(ops) >= 3 and ops[2].kind == "imm" and _is_int(ops[2].text):
        m = int(ops[2].text, 0)
        pfx = "UP" if base == "UR2UP" or ops[0].reg == "UPR" else "P"
        r2p_dests = [f"{pfx}{i}" for i in range(7) if (m >> i) & 1]

    conv64 = base in CONV and any(m in ("F64", "S64", "U64") for m in mods)
    dbl = base in DOUBLE
    wide_all = has64 or "128" in mods or dbl or conv64

    def dest_width(i: int) -> int:
        if ops[i].kind != "reg":
            return 1
        if not known:
            return 4
        if "128" in mods:
            return 4
        if has64 or dbl or conv64:
            return 2
        if base in ("IMAD", "UIMAD") and "WIDE" in mods:
            return 2
        if base == "CS2R" and "32" not in mods:
            return 2
        if base == "LEPC":
            return 2
        return 1

    def src_width(i: int) -> int:
        if ops[i].kind != "reg":
            return 1
        if "128" in mods and not known:
            return 4
        if wide_all:
            return 2
        if base in ("IMAD", "UIMAD") and "WIDE" in mods and i == 3:
            return 2
        return 1

    dests, srcs, mem_addr = [], [], []
    mem_ops = []
    for i in didx:
        dests += _regs_of(ops[i], dest_width(i))
    if r2p_dests is not None:
        dests = r2p_dests
    for i, op in enumerate(ops):
        if i in didx and known:
            continue
        if op.kind in ("reg", "pred"):
            srcs += _regs_of(op, src_width(i))
        elif op.kind in ("mem", "gdesc"):
            mem_ops.append(op)
            mem_addr += _inner_of(op)
        elif op.kind == "other":
            srcs += _inner_of(op)

    def cbytes(i: int) -> int:
        if wide_all or (base in ("IMAD", "UIMAD") and "WIDE" in mods and i == 3):
            return 8
        return 4

    consts, indexed, idx_regs = _const_reads(ops, cbytes)
    sem = Sem("data" if known else "unknown", dests=dests, srcs=srcs, consts=consts, const_indexed=indexed,
              addr=idx_regs, known=known, is_memory=indexed)
    if known and not wide_all and not indexed and not mem_ops:
        sem.bitop = _bitop(base, mods, ops, didx)
    if mem_ops:  # an unrecognised memory instruction: generic read and write of unknown memory
        sem.addr += mem_addr
        sem.reads.append(("GEN", tuple(mem_addr)))
        sem.writes.append(("GEN", tuple(mem_addr)))
        sem.is_memory = True
    return sem


# --------------------------------------------------------------------------------------------
# bit-precise semantics for 32-bit logic / shift / move / add ops
# --------------------------------------------------------------------------------------------
# Taint of a 32-bit register is a bit mask.  Compilers pack predicates into GPR bits (LOP3 set/clear
# of single bits, P2R/R2P) and spill those words to local memory; a register-granular analysis would
# smear one secret mask bit over every packed public predicate.  Operand descriptors:
#   ("r", name)            register (its taint mask is looked up)
#   ("k", value)           known constant (RZ = 0, immediates)
#   ("c", bank, off, n)    constant-bank operand (secret scalar => fully tainted)
#   ("x",)                 untainted operand of unknown value (float immediates, special registers)


def _is_int(t: str) -> bool:
    try:
        int(t, 0)
        return True
    except ValueError:
        return False


def _bit_operand(op: Opnd):
    if op.negated or op.text.startswith(("-", "~", "|")):
        return None
    if op.kind == "reg":
        if op.reg in ("RZ", "URZ"):
            return ("k", 0)
        if op.wide != 1:
            return None
        return ("r", op.reg)
    if op.kind == "imm":
        if _is_int(op.text):
            return ("k", int(op.text, 0) & 0xFFFFFFFF)
        return ("x",)
    if op.kind == "const" and op.cbank is not None and not op.inner:
        return ("c", op.cbank[0], op.cbank[1], 4)
    if op.kind == "other" and not op.inner:
        return ("x",)
    return None


def _operand_suffixes(op: Opnd) -> list[str]:
    """The dotted suffixes of a register operand (``R7.B1`` -> ["B1"])."""
    m = _REG_RE.search(op.text)
    return [x for x in m.group(2).split(".") if x] if m else []


def _bitop(base: str, mods: list[str], ops: list[Opnd], didx: list[int]):
    """Describe a bit-precise op, or None (then any tainted source taints every destination bit)."""
    reg_dests = [i for i in didx if ops[i].kind == "reg"]
    if len(reg_dests) != 1:
        if base in ("R2P", "UR2UP") and len(ops) >= 3 and ops[2].kind == "imm" and _is_int(ops[2].text):
            src = _bit_operand(ops[1])
            shift = 0
            # the byte selector: on the opcode (R2P.B1) or, as ptxas writes it, on the operand (R2P PR, R7.B1, 0x7f)
            for m in mods + _operand_suffixes(ops[1]):
                if m in ("B1", "B2", "B3"):
                    shift = 8 * int(m[1])
            return ("r2p", src, int(ops[2].text, 0), shift) if src else None
        if not (base in ("LOP3", "ULOP3") and len(reg_dests) == 0):
            return None
    d = reg_dests[0] if reg_dests else None
    dest = ops[d].reg if d is not None else None
    rest = [op for i, op in enumerate(ops) if i not in didx]
    if base in ("LOP3", "ULOP3") and "LUT" in mods:
        if len(rest) < 4:
            return None
        src = [_bit_operand(o) for o in rest[:3]]
        if any(x is None for x in src) or rest[3].kind != "imm" or not _is_int(rest[3].text):
            return None
        pin = [o.reg for o in rest[4:] if o.kind == "pred"]
        return ("lop3", dest, tuple(src), int(rest[3].text, 0) & 0xFF, tuple(pin))
    if dest is None:
        return None
    if base in ("MOV", "UMOV", "MOV32I", "R2UR") and len(rest) >= 1 and not mods:
        src = _bit_operand(rest[0])
        return ("copy", dest, src) if src else None
    if base == "IMAD" and mods in (["MOV", "U32"], ["MOV"], ["U32"]) and len(rest) == 3:
        if rest[0].reg in ("RZ", "URZ") and rest[1].reg in ("RZ", "URZ"):
            src = _bit_operand(rest[2])
            if src is not None:
                return ("copy", dest, src)
            core = Opnd(rest[2].text.lstrip("-"), rest[2].kind, rest[2].reg, rest[2].wide, False, rest[2].inner,
                        rest[2].cbank)
            src = _bit_operand(core)
            return ("arith", dest, (src,), 0, ()) if src else None
        return None
    if base in ("SHF", "USHF") and len(rest) == 3 and rest[1].kind == "imm" and _is_int(rest[1].text):
        a, b = _bit_operand(rest[0]), _bit_operand(rest[2])
        if a is None or b is None:
            return None
        left = "L" in mods
        hi = "HI" in mods
        signed = "S32" in mods or "S64" in mods
        return ("shf", dest, a, b, int(rest[1].text, 0) & 0xFFFFFFFF, left, hi, signed)
    if base == "IMAD" and mods in (["SHL", "U32"], ["SHL"]) and len(rest) == 3 and rest[1].kind == "imm":
        a = _bit_operand(rest[0])
        m = int(rest[1].text, 0) if _is_int(rest[1].text) else 0
        if a is not None and m > 0 and (m & (m - 1)) == 0 and rest[2].reg in ("RZ", "URZ"):
            return ("shf", dest, a, ("k", 0), m.bit_length() - 1, True, False, False)
        return None
    if base in ("SEL", "USEL", "FSEL") and len(rest) == 3:
        a, b = _bit_operand(rest[0]), _bit_operand(rest[1])
        if a is None or b is None or rest[2].kind != "pred":
            return None
        return ("sel", dest, a, b, rest[2].reg)
    if base in ("PRMT", "UPRMT") and not mods and len(rest) == 3 and rest[1].kind == "imm" and _is_int(rest[1].text):
        a, b = _bit_operand(rest[0]), _bit_operand(rest[2])
        if a is None or b is None:
            return None
        return ("prmt", dest, a, int(rest[1].text, 0), b)
    if base in ("P2R", "UP2UR") and len(rest) == 3 and rest[0].reg in ("PR", "UPR") and rest[2].kind == "imm" \
            and _is_int(rest[2].text):
        a = _bit_operand(rest[1])
        shift = 0
        for m in mods:
            if m in ("B1", "B2", "B3"):
                shift = 8 * int(m[1])
        pfx = "UP" if rest[0].reg == "UPR" else "P"
        return ("p2r", dest, a, int(rest[2].text, 0), shift, pfx) if a else None
    if base in ("IADD3", "UIADD3", "VIADD", "IMAD", "UIMAD", "LEA", "ULEA", "IADD", "IADD32I") and \
            not ({"WIDE", "HI", "X"} & set(mods)):
        srcs = []
        shift = 0
        regs_rest = [o for o in rest if o.kind != "pred"]
        preds = [o.reg for o in rest if o.kind == "pred"]
        if base in ("LEA", "ULEA"):
            if len(regs_rest) != 3 or regs_rest[2].kind != "imm" or not _is_int(regs_rest[2].text):
                return None
            shift = int(regs_rest[2].text, 0)
            regs_rest = regs_rest[:2]
        for o in regs_rest:
            core = Opnd(o.text.lstrip("-"), o.kind, o.reg, o.wide, False, o.inner, o.cbank)
            x = _bit_operand(core)
            if x is None:
                return None
            srcs.append(x)
        return ("arith", dest, tuple(srcs), shift, tuple(preds))
    return None
