"""The abstract interpreter: a flow-sensitive forward taint / provenance analysis of a SASS listing to a
fixpoint over its CFG (:class:`_Analyzer`; static facts and memory summary :class:`_Env`, per-program-point
state :class:`_State`). The abstract domain and modelling choices are described in the package docstring."""
from __future__ import annotations

import heapq
import re
from collections import Counter
from typing import Iterable

from .cfg import _build_cfg
from .isa import WINDOW_REGS, Instr, Listing, Sem, _inner_regs, decode, parse_operand
from .report import ParamInfo, Report, Violation

_EMPTY: frozenset = frozenset()
_UNKNOWN = "?"
# The generic address of the kernel's parameter space: ``c[0x0][0x198]`` on sm_90 (what ``cvta.param`` gives).
# A host tensor descriptor (a 128-byte ``CUtensorMap`` parameter) is read by TMA through it.
PARAM_SPACE = "<params>"
_PARAM_SPACE_CBANK = (0x198, 0x1A0)
_DESC_FIELD = re.compile(r"^(.+)\.(shape|stride)\d+$")


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
        # host tensor descriptors, and those whose contents (shape or strides: the ``D.shape<k>``/``D.stride<k>``
        # scalars Triton passes beside each descriptor) are declared secret
        self.host_descs = frozenset(p.name for p in params if p.role == "tensordesc")
        self.secret_desc_contents = frozenset(
            m.group(1) for p in params if p.secret and p.role == "scalar"
            for m in [_DESC_FIELD.match(p.name)] if m and m.group(1) in self.host_descs)
        # memory summary: region -> (taint, provenance)
        self.mem: dict[str, tuple[bool, frozenset]] = {}
        for name in self.secret_ptrs:
            self.mem[f"G:{name}"] = (True, _EMPTY)
        # the parameter space read as memory holds every parameter: secret scalars and descriptor contents
        self.mem[f"G:{PARAM_SPACE}"] = (bool(self.secret_scalars or self.secret_desc_contents), _EMPTY)
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
        if off < _PARAM_SPACE_CBANK[1] and off + nbytes > _PARAM_SPACE_CBANK[0]:
            prov.add(PARAM_SPACE)
        for lo, hi, p in self.slots:
            if off < hi and off + nbytes > lo:
                if p.secret and p.role in ("scalar", "unmapped"):
                    t = True
                if p.role in ("pointer", "tensordesc", "pointer-to-pointer", "hidden", "unmapped"):
                    prov.add(p.name)
                elif p.role == "scalar" and p.size == 8 and "." not in p.name:
                    # a 64-bit scalar may be an address (a buffer's, passed as an integer): what it points to is not
                    # known (found by a review, 2026-11-28: rebased onto a public pointer, it was taken for it)
                    prov.add(_UNKNOWN)
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
    # Shared memory is CTA-local and ordered by CTA-wide barriers: a write made after the k-th barrier cannot
    # be seen by a read made before it (the writer passed barrier k only once the reader arrived there). Each
    # instruction has an epoch, the (lo, hi) range of CTA-wide barriers completed before it (hi = EPOCH_INF
    # in loops); shared-memory writes are kept per region and lowest epoch ("S@3"), and a read at (lo, hi)
    # sees the writes whose lowest epoch is at most hi. Asynchronous writes (TMA, cp.async) land after their
    # instruction, so its epoch is a lower bound for them too. Global memory is shared with other CTAs: it
    # stays one summary per region.
    epoch: tuple[int, int] = (0, 0)

    def smem_region(self, spec: tuple) -> str:
        """The shared-memory region(s) an access touches, by its address immediate: "S" (data), "S:ctl" (the
        control area of a threshold split), "S:ctl<k>" (the k-th control range of a ranges split), several
        joined by "+". An mbarrier operation (``spec[2] == "sync"``) on a range that data allocations also use
        touches the barrier only: the compiler gives overlapping allocations disjoint lifetimes, so a data
        access never meets a live barrier there, except through a view of the barrier itself, and such an
        access, having its immediate in the barrier's range, writes the barrier's region too."""
        imm = spec[1] if len(spec) > 1 else None
        split = self.smem_control_from
        if split is None or imm is None:
            return "S"
        unresolved_sync = len(spec) > 2 and spec[2] == "sync?"
        if isinstance(split, tuple):
            ctl = [f"S:ctl{k}" for k, (lo, hi) in enumerate(split[0]) if lo <= imm < hi]
            if not ctl:
                # a barrier operation whose address the analysis could not resolve: it may be any barrier
                return "S+" + self.all_control() if unresolved_sync else "S"
            if (len(spec) > 2 and spec[2] in ("sync", "sync?")) or not any(lo <= imm < hi for lo, hi in split[1]):
                return "+".join(ctl)
            return "+".join(["S"] + ctl)
        if imm >= split:
            return "S:ctl"
        return "S+S:ctl" if unresolved_sync else "S"

    def mem_get(self, region: str) -> tuple[bool, frozenset]:
        if "+" in region:
            t, p = False, _EMPTY
            for r in region.split("+"):
                rt, rp = self.mem_get(r)
                t, p = t or rt, p | rp
            return t, p
        if region[0] == "S":
            hi = self.epoch[1]
            t, p = False, _EMPTY
            for k, (et, ep) in self.mem.items():
                if k.startswith(region + "@") and int(k[len(region) + 1:]) <= hi:
                    t = t or et
                    if ep:
                        p = p | ep
            return t, p
        return self.mem.get(region, (False, _EMPTY))

    def mem_join(self, region: str, t: bool, p: frozenset) -> None:
        if "+" in region:
            for r in region.split("+"):
                self.mem_join(r, t, p)
            return
        if region[0] == "S":
            region = f"{region}@{self.epoch[0]}"
        ot, op = self.mem.get(region, (False, _EMPTY))
        nt, np_ = ot or t, op | p
        if nt != ot or len(np_) != len(op):
            self.mem[region] = (nt, np_)
            self.mem_version += 1

    def all_control(self) -> str:
        split = self.smem_control_from
        if isinstance(split, tuple):
            return "+".join(f"S:ctl{k}" for k in range(len(split[0])))
        return "S:ctl"

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
                    self.mem_join(self.all_control(), t, p)
            return
        for r in regions[:-1]:
            self.mem_join(r, t, p)


FULL = 0xFFFFFFFF
EPOCH_INF = 1 << 30


def _is_cta_barrier(x: Instr) -> bool:
    """``BAR.SYNC 0x0`` (also ``.DEFER_BLOCKING``): barrier 0 with no thread count, i.e. every thread of the CTA."""
    mods = x.mods
    return (x.base == "BAR" and "SYNC" in mods and "ARV" not in mods and len(x.operands) == 1
            and x.operands[0].strip() in ("0x0", "0"))


def barrier_epochs(listing: Listing, blocks, entry: int) -> list[tuple[int, int]]:
    """Per instruction: the (lo, hi) range of CTA-wide barriers every thread has completed before it (see
    _Env.epoch). A guarded barrier may be skipped (counts 0 or 1). Cluster kernels (another CTA may write this
    CTA's shared memory) and kernels without CTA-wide barriers get (0, EPOCH_INF) everywhere."""
    ins = listing.instrs
    n = len(ins)
    bars = [_is_cta_barrier(x) for x in ins]
    cluster = any(x.base in ("UCGABAR_ARV", "UCGABAR_WAIT", "STAS", "ATOMS_CLUSTER") or "CLUSTER" in x.opcode.split(".")
                  for x in ins)
    if cluster or not any(bars):
        return [(0, EPOCH_INF)] * n
    cap = sum(bars)

    def after(i: int, lo: int, hi: int) -> tuple[int, int]:  # the epoch after instruction i
        if not bars[i]:
            return lo, hi
        lo, hi = (lo if ins[i].guard is not None else lo + 1), hi + 1
        return lo, (EPOCH_INF if hi > cap else hi)

    ein: dict[int, tuple[int, int]] = {entry: (0, 0)}
    work = [entry]
    while work:
        b = work.pop()
        lo, hi = ein[b]
        blk = blocks[b]
        for i in range(blk.start, blk.end):
            lo, hi = after(i, lo, hi)
        for sb in blk.succs:
            old = ein.get(sb)
            new = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
            if new != old:
                ein[sb] = new
                work.append(sb)
    out: list[tuple[int, int]] = [(0, EPOCH_INF)] * n
    for b, (lo, hi) in ein.items():
        blk = blocks[b]
        for i in range(blk.start, blk.end):
            out[i] = (lo, hi)
            lo, hi = after(i, lo, hi)
    return out


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


def _local_overlaps(S, off: int) -> list:
    """Local slots (``L:<offset>``, 4 bytes from their offset) other than ``off`` that share bytes with it: a spill
    read back at another width or offset (``STL [R1+0x4]``, then ``LDL.U8 [R1+0x5]``)."""
    return [k for k in _local_slots(S) if k != f"L:{off}" and int(k[2:]) < off + 4 and off < int(k[2:]) + 4]


def _local_slots(S) -> list:
    """The local-memory slots (``L:<offset>``) that hold a value in state ``S``."""
    return [k for k in set(S.T) | set(S.P) if k.startswith("L:")]


_ANY = "any:"  # guard key prefix: "some active thread has this predicate" (_State._guarded)


def _any_vote_source(sig: tuple) -> str | None:
    """The thread predicate that a ``VOTEU.ANY UPx, Py`` definition (``sig``: its opcode and source operands) votes
    on, when it is one plain (not negated) thread predicate register; else None."""
    opcode, srcs = sig
    if not opcode.startswith("VOTEU.ANY") or len(srcs) != 1:
        return None
    src = srcs[0].strip()
    if not src.startswith("P") or src == "PT":
        return None
    return src


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

    __slots__ = ("T", "P", "G", "W", "key", "pc", "D", "C", "V")

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
        # ``V``: uniform predicate -> the thread predicate it is the ``VOTEU.ANY`` of, in this block (see _guarded)
        self.V: dict = {}

    def canon(self, pred: str) -> str:
        return self.C.get(pred, pred)

    def kill(self, loc: str) -> None:
        """``loc`` is written: aliases that read it or name it are no longer valid."""
        if self.V:
            for k in [k for k, v in self.V.items() if k == loc or v == loc]:
                del self.V[k]
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
        vote = _any_vote_source(sig)
        if vote is not None and vote != pred:
            self.V[pred] = vote

    def copy(self) -> "_State":
        return _State(dict(self.T), dict(self.P), dict(self.G), dict(self.W))

    def _guarded(self, r: str):
        """The guarded value of ``r`` that the current guard sees, or None. Besides a write under the same guard:
        ``@P3 R2UR UR22, R4`` (keyed ``any_key(P3)``) writes UR22 exactly when some active thread has P3, which is
        when a thread with P3 runs, and when ``UP0`` of ``VOTEU.ANY UP0, P3`` (same block, neither redefined since)
        holds; ptxas issues an elected TMA copy that way (``@P3 R2UR`` of its operands, then ``@UP0 UTMALDG``)."""
        e = self.G.get(r)
        if e is None:
            return None
        k = self.key
        if e[0] == k:
            return e
        if k[1] or e[0][1]:
            return None
        if k[0].startswith(_ANY):  # ``@P3 R2UR`` reads its source in the threads that have P3
            return e if e[0][0] == k[0][len(_ANY):] else None
        if not e[0][0].startswith(_ANY):
            return None
        pred = e[0][0][len(_ANY):]
        if k[0] == pred or self.V.get(k[0]) == pred:
            return e
        return None

    def m(self, r: str) -> int:
        if self.key is not None and self.G:
            e = self._guarded(r)
            if e is not None:
                return e[1]
        return self.T.get(r, 0)

    def t(self, r: str) -> bool:
        return self.m(r) != 0

    def p(self, r: str) -> frozenset:
        if self.key is not None and self.G:
            e = self._guarded(r)
            if e is not None:
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
        if G and (loc[0] == "P" or loc.startswith("UP")):
            self._hand_over(loc)
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
            dead = [k for k, e in G.items() if e[0][0] in (loc, _ANY + loc)]
            for k in dead:
                del G[k]

    def _hand_over(self, pred: str) -> None:
        """Predicate ``pred`` is about to be redefined: values guarded by it stay guarded by a predicate that still
        holds the same value. An alias (``C``: defined by the same instruction from the same, unchanged sources:
        ``VOTEU.ANY UP1, P0`` ... ``VOTEU.ANY UP3, P0``) takes over its guards; and a value written under
        ``any_key(pred)`` (``@pred R2UR``) becomes guarded by a uniform predicate voted from ``pred`` (``V``:
        ``VOTEU.ANY UPx, pred``, neither changed since), which holds exactly when that write happened."""
        G = self.G
        heirs = sorted(k for k, v in self.C.items() if v == pred and k != pred)
        if heirs:
            heir = heirs[0]
            for k in heirs[1:]:
                self.C[k] = heir
            del self.C[heir]
            for k, e in list(G.items()):
                if e[0][0] == pred:
                    G[k] = ((heir, e[0][1]), e[1], e[2])
        elif pred in self.V:
            # ``pred`` is ``VOTEU.ANY pred, Py`` (this block, neither changed since): "pred holds" is "some active
            # thread has Py", which outlives pred's redefinition until Py's own (``@UP0 UMOV UR27, URZ``, then
            # ``VOTEU.ANY UP0, P3``, then ``VOTEU.ANY UP1, P1`` and ``@UP1 UTMALDG`` reading UR27, UP0 the vote of P1)
            voted = (_ANY + self.V[pred], False)
            for k, e in list(G.items()):
                if e[0] == (pred, False):
                    G[k] = (voted, e[1], e[2])
        ups = sorted(u for u, v in self.V.items() if v == pred)
        if ups:
            # (equal votes are aliases: the earliest, which the others name in ``C``, so that redefining a later one
            # leaves the guard with it: ``VOTEU.ANY UP1, P1``, ``VOTEU.ANY UP0, P1``, P1 and then UP0 redefined)
            old = (_ANY + pred, False)
            heir = self.canon(ups[0])
            for k, e in list(G.items()):
                if e[0] == old:
                    G[k] = ((heir, False), e[1], e[2])

    def weak(self, loc: str, mask: int, p: frozenset) -> None:
        self.kill(loc)
        if mask:
            self.W[loc] = self.pc
            self.T[loc] = self.T.get(loc, 0) | mask
        if p:
            self.P[loc] = self.P.get(loc, _EMPTY) | p
        if self.G:
            self.G.pop(loc, None)

    def drop_thread_set_guards(self) -> None:
        """Entering a block where paths join: drop the guarded values whose guard speaks of the threads that were
        active where it was taken, which differ between the joining paths (divergent threads run them one after the
        other). "Some thread has P" (``any:``) held for the threads of one path; and a value written under a vote
        (``@UP0 MOV R5, ...``) holds in the threads that ran that write: in a thread register, after the join, a thread
        from the other path may read it under a vote taken on either path. A uniform register or predicate under a
        uniform guard keeps its entry: it belongs to the warp, and the last path to write it wrote it under the value
        of the guard that the join sees."""
        G = self.G
        for loc in [k for k, e in G.items()
                    if e[0][0].startswith(_ANY) or (e[0][0].startswith("UP") and not k.startswith(("UR", "UP")))]:
            del G[loc]

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
        self.epochs = barrier_epochs(listing, self.blocks, self.entry)
        _resolve_shared_offsets(self.ins, self.sems, self.blocks, self.entry)

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
                    for key in (f"L:{s}", *_local_overlaps(S, s)):
                        t = t or S.t(key)
                        p = p | S.p(key)
            return t, p
        if kind == "TMA":
            prov = S.prov(spec[1])
            if prov == {PARAM_SPACE} and env.host_descs:  # a host descriptor: the tile is its tensor's data
                return env.read_global(env.host_descs)
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
                    for other in _local_overlaps(S, s):
                        S.weak(other, FULL if t else 0, p)
        elif kind == "TMA":
            prov = S.prov(spec[1])
            if prov == {PARAM_SPACE} and env.host_descs:
                # a host descriptor: the tile lands in its tensor's memory, as a load through one reads it (_read);
                # the regions of every host descriptor's tensor, as the analysis cannot tell which one it is
                env.write_global(env.host_descs, t, p, False)
                return
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
        self.env.epoch = self.epochs[i]
        self._step_effects(i, S, sink)
        if "R1" in self.sems[i].dests:
            # the stack pointer moved (a callee's frame, or the prologue's MOV R1, c[0x0][0x28]): [R1+imm] no longer
            # names the bytes it named, so every slot stored so far may be read back at any offset (L*)
            m, p = 0, _EMPTY
            for k in _local_slots(S):
                m |= FULL if S.T.get(k) else 0
                p = p | S.P.get(k, _EMPTY)
            if m or p:
                S.weak("L*", m, p)
        d = self.pred_defs[i]
        if d is not None:
            S.define_pred(*d)

    def _step_effects(self, i: int, S: _State, sink: list | None) -> None:
        x = self.ins[i]
        s = self.sems[i]
        env = self.env
        key = (S.canon(x.guard), x.guard_neg) if x.guard is not None else None
        if key is not None and not x.guard_neg and x.base == "R2UR" and x.guard.startswith("P"):
            key = (_ANY + key[0], False)  # a uniform register, written when some active thread has the guard
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
        if fam == "sync":
            # a barrier operation writes its word from its operands (counts, parity); the word's own value stays
            # where it is, so what it read is not written back (into every area an unresolved address may be)
            wt = S.any_t(s.srcs) or gt or at
        # where a write goes: its address operands as the instruction reads them, before its destinations change
        # (``ATOMG ... R8, [R8.64], R4`` writes where R8 pointed, not where the value it returns points), and under its
        # guard, as the address checks read them (``@UP0 UTMASTG [UR8], [UR6]`` whose UR6 is a host descriptor's address
        # under UP0 and another pointer otherwise writes that descriptor's tensor)
        for spec in s.writes:
            self._write(spec, S, wt, vp, key)
        S.key = None
        mask = FULL if (dt and not s.public_dests) else 0
        extra = FULL if gt else 0
        for d in s.dests:
            S.set(d, mask, _EMPTY if (d[0] == "P" or d.startswith("UP")) else dp, key, extra)

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
                p = S.p(loc) | star_p
                for other in _local_overlaps(S, off):  # a slot stored at another offset that shares bytes with it
                    if S.T.get(other):
                        m = FULL
                    p = p | S.P.get(other, _EMPTY)
                vals.append((r, m, p))
            S.key = None
            for r, m, p in vals:
                S.set(r, m, p, key, extra)
        else:
            vals = [(f"L:{off}", S.m(r) | (FULL if at else 0), S.p(r)) for off, r in zip(slots, regs)]
            S.key = None
            for (loc, m, p), off in zip(vals, slots):
                S.set(loc, m, p, key, extra)
                for other in _local_overlaps(S, off):  # bytes of a slot stored at another offset: joined
                    S.weak(other, FULL if (m or extra) else 0, p)

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
            if sh == 0:  # the high word of {b:a} is b, the low word a, shifted left or right
                mask = mb if hi else ma
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
        if kind == "copy" and key is None:
            self._copy_guarded(S, bop[1], bop[2])

    @staticmethod
    def _copy_guarded(S: _State, dest: str, op: tuple) -> None:
        """An unguarded copy ``dest = src`` (MOV, IMAD.U32 from RZ, RZ, UMOV, R2UR) also copies what is known of
        ``src`` under a guard: whenever that guard holds, ``dest`` equals ``src``'s guarded value. ptxas moves an
        elected TMA copy's operands through such copies (``@P4 R2UR UR9, R24``; ``IMAD.U32 R5, RZ, RZ, UR9``;
        ``@P4 R2UR UR23, R5``; ``@UP4 UTMALDG``), and a copy that forgets the guard joins in the value the register
        held before (a secret, where ptxas shares it). Not from a thread's guard into a uniform register (R2UR):
        the uniform value may come from a thread where that guard does not hold."""
        if op[0] != "r" or op[1] == dest or dest is None:
            return
        e = S.G.get(op[1])
        if e is None:
            return
        pred = e[0][0]
        per_thread_guard = not pred.startswith(_ANY) and not pred.startswith("UP")
        if per_thread_guard and dest.startswith("UR") and not op[1].startswith("UR"):
            return
        S.G[dest] = e

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
            region = env.smem_region(spec)
            if "ctl" in region and not (region.startswith("S+") and env.mem_get("S")[0]):
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
        if not s.known:
            # an opcode outside the tables: what it does besides its data flow (start a dependent grid, wait, signal)
            # is not modelled, so whether it runs (its guard) and its operands count as control and timing (found by a
            # review, 2026-11-28: ``@!P0 PREEXIT`` under a secret predicate passed as an unknown opcode)
            regs = S.which_t(s.srcs)
            if gt:
                add("branch", f"{g}: unmodelled opcode {x.base} runs or not by a secret")
            if regs:
                add("timing", f"unmodelled opcode {x.base}: operand {','.join(regs)} tainted")
        if s.desc is not None:
            why = self.desc_contents_secret(s.desc, S)
            if why:
                add("address", f"TMA descriptor contents depend on a secret: {why}")
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

    def desc_contents_secret(self, desc: tuple, S: _State) -> str | None:
        """Why the descriptor that a TMA operation reads may hold secret-dependent contents (its base, shape,
        strides form the global addresses and decide which rows are read or zero-filled), or None."""
        env = self.env
        prov = S.prov(desc)
        if prov == {PARAM_SPACE} and env.host_descs:
            if env.secret_desc_contents:
                return "host descriptor " + ", ".join(sorted(env.secret_desc_contents)) + " declared secret"
            return None
        if env.global_regions(prov) is None:
            if env.any_secret or any(v[0] for v in env.mem.values()):
                return "a descriptor at an address of unknown provenance (secret inputs present)"
            return None
        t, _ = env.read_global(prov)
        if t:
            return "the descriptor's memory (" + ", ".join(sorted(p for p in prov if p != _UNKNOWN)) + \
                ") received secret-dependent data"
        return None

    # ---- fixpoint
    def run(self) -> Report:
        blocks = self.blocks
        nb = len(blocks)
        ins_state: list[_State | None] = [None] * nb
        # the shared-memory window's base (generic addresses of shared memory: ``S2R R7, SR_SWINHI``) is no pointer
        # argument: a generic access through an address built from it may touch shared or local memory
        ins_state[self.entry] = _State(P={r: frozenset({_UNKNOWN}) for r in WINDOW_REGS})
        # blocks where paths join (the entry counts its own start): _State.drop_thread_set_guards on the way in
        joins = [0] * nb
        joins[self.entry] = 1
        for blk in blocks:
            for sb in blk.succs:
                joins[sb] += 1
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
                    out = S
                    if joins[sb] > 1 and S.G:
                        out = S.copy()
                        out.drop_thread_set_guards()
                    if ins_state[sb] is None:
                        ins_state[sb] = out.copy()
                        changed = True
                    else:
                        changed = out.join_into(ins_state[sb])
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
        mem = sorted({("S:ctl" if k.startswith("S:ctl") else "S") if k[0] == "S" else k
                      for k, v in self.env.mem.items() if v[0]})
        names = {"S": "shared", "S:ctl": "shared:control", "G?": "global:<unknown>"}
        mem = [names.get(m) or "global:" + m[2:] for m in mem]
        mem += sorted({"local" + (f"[0x{int(t[2:]):x}]" if t.startswith("L:") else "[*]") for t in tainted
                       if t.startswith("L")})
        return Report(kernel="", violations=violations, n_instructions=n_ins, n_blocks=len(reachable),
                      total_instructions=len(self.ins), iterations=visits, tainted_registers=regs,
                      tainted_memory=mem, unknown_opcodes=dict(sorted(unknown.items())))


def _imm(text: str) -> int | None:
    try:
        return int(text, 0)
    except ValueError:
        return None


_UNDEF = ("undefined",)  # _resolve_shared_offsets: a register written on no path from the kernel's entry


def _resolve_shared_offsets(ins: list[Instr], sems: list[Sem], blocks, entry: int) -> None:
    """Shared-memory addresses formed in a register: Triton computes the CTA's shared window base once
    (``S2UR URa, SR_CgaCtaId; UMOV URb, 0x400; ULEA URc, URa, URb, 0x18``) and often adds an allocation's
    offset in a register (``UIADD3 UR4, URc, 0x21990, URZ``; ``SYNCS... [UR4]``) instead of the address
    immediate. Where the address registers resolve to "window base + constant" (through adds and moves, each
    register's definition the nearest before it in its basic block, or else every definition that reaches the
    block, all giving the same value on every path from the kernel's entry), that constant is added to the access's immediate, so the access is classified by its real offset. An mbarrier operation
    whose address does not resolve is marked ("sync?"): it may be any barrier (see _Env.smem_region)."""
    block_of = [0] * len(ins)
    for b, blk in enumerate(blocks):
        for i in range(blk.start, blk.end):
            block_of[i] = b

    preds: list[list[int]] = [[] for _ in blocks]
    for blk in blocks:
        for s in blk.succs:
            preds[s].append(blk.idx)
    reaching_cache: dict[str, list[frozenset]] = {}

    def reaching(reg: str) -> list[frozenset]:
        """Per block, the definitions of ``reg`` that reach its entry (-1: the kernel's entry, no definition;
        a guarded definition adds itself to what reaches it instead of replacing it): a forward fixpoint."""
        hit = reaching_cache.get(reg)
        if hit is not None:
            return hit
        ins_of = [frozenset() for _ in blocks]
        ins_of[entry] = frozenset({-1})
        out_of: list[frozenset | None] = [None] * len(blocks)
        work = [entry]
        while work:
            b = work.pop()
            cur = ins_of[b]
            for j in defs_in_block.get((reg, b), ()):
                cur = cur | {j} if ins[j].guard is not None else frozenset({j})
            if cur == out_of[b]:
                continue
            out_of[b] = cur
            for s in blocks[b].succs:
                new = ins_of[s] | cur
                if new != ins_of[s] or out_of[s] is None:
                    ins_of[s] = new
                    work.append(s)
        reaching_cache[reg] = ins_of
        return ins_of

    defs_in_block: dict[tuple[str, int], list[int]] = {}
    for i, sm in enumerate(sems):
        for d in sm.dests:
            defs_in_block.setdefault((d, block_of[i]), []).append(i)

    def one_value(vals: set):
        """The value of a register after a guarded definition, which gives one of ``vals``: the common one, or None.
        ``_UNDEF`` (no path from the kernel's entry wrote the register before the definition) drops out: the guarded
        value is the only one the register ever holds, and a compiler does not address memory through a register it
        never wrote (ptxas issues an elected copy's address as ``@UP0 UIADD3 UR12, ...`` and the copy as ``@UP6
        UTMALDG [UR12]``, UP6 implying UP0). A register written on some paths only stays unresolved."""
        vals = vals - {_UNDEF}
        return vals.pop() if len(vals) == 1 else None

    def value(reg: str, i: int, depth: int):  # (is window-base-relative, constant) or None
        v = value_or_undef(reg, i, depth)
        return None if v is _UNDEF else v

    def value_or_undef(reg: str, i: int, depth: int):
        if reg in ("RZ", "URZ"):
            return False, 0
        if depth > 8:
            return None
        blk = blocks[block_of[i]]
        j = i - 1
        while j >= blk.start and reg not in sems[j].dests:
            j -= 1
        if j < blk.start:
            # every definition that reaches this block must give the same value (a guarded one beside those it
            # may leave in place, see reaching)
            ds = reaching(reg)[block_of[i]]
            if ds == {-1}:
                return _UNDEF  # never written on any path to here
            if not ds or -1 in ds:
                return None  # written on some paths only: unresolved (any value)
            vals = {definition(reg, d, depth) for d in ds}
            return vals.pop() if len(vals) == 1 else None
        v = definition(reg, j, depth)
        if ins[j].guard is None or v is None:
            return v
        # a guarded definition: its value, or (guard false) what the register held before it (found by a review,
        # 2026-11-28: a TMA copy into an mbarrier's words, its address written under the elect predicate, was
        # placed at its immediate, in the data area)
        return one_value({v, value_or_undef(reg, j, depth + 1)})

    def definition(reg: str, j: int, depth: int):  # the value instruction j gives ``reg`` (its guard aside), or None
        x = ins[j]
        if sems[j].dests and sems[j].dests[0] != reg:
            return None
        ops = [parse_operand(o) for o in x.operands]
        if x.base == "S2UR" and len(ops) == 2 and ops[1].text == "SR_CgaCtaId":
            return False, None  # the CTA id in the cluster: part of the window base below
        if x.base in ("UMOV", "MOV") and len(ops) == 2:
            k = _imm(ops[1].text)
            return (False, k) if k is not None else (value(ops[1].reg, j, depth + 1) if ops[1].reg else None)
        if x.base == "ULEA" and len(ops) == 4 and _imm(ops[3].text) == 0x18 and ops[1].reg and ops[2].reg:
            a, b = value(ops[1].reg, j, depth + 1), value(ops[2].reg, j, depth + 1)
            if a == (False, None) and b == (False, 0x400):
                return True, 0  # the shared window base
            return None
        if x.base in ("UIADD3", "IADD3") and len(ops) == 4 and not any(o.negated for o in ops[1:]):
            base, total = False, 0
            for o in ops[1:]:
                k = _imm(o.text)
                v = (False, k) if k is not None else (value(o.reg, j, depth + 1) if o.reg else None)
                if v is None or v[1] is None or (v[0] and base):
                    return None
                base, total = base or v[0], total + v[1]
            return base, total
        return None

    for i, sm in enumerate(sems):
        if not any(sp[0] == "S" and len(sp) > 1 for sp in sm.reads + sm.writes):
            continue
        mem = next((parse_operand(o) for o in ins[i].operands if o.strip().startswith("[")), None)
        if mem is None:
            continue
        extra, resolved = 0, False
        for r, _ in mem.inner:
            v = value(r, i, 0)
            if v is not None and v[0]:
                extra, resolved = extra + v[1], True
        def fix(sp: tuple) -> tuple:
            if sp[0] != "S" or len(sp) < 2 or sp[1] is None:
                return sp
            if resolved:
                return ("S", sp[1] + extra) + tuple(sp[2:])
            return ("S", sp[1], "sync?") if sm.family == "sync" else sp
        sm.reads = [fix(sp) for sp in sm.reads]
        sm.writes = [fix(sp) for sp in sm.writes]


def _reg_sort_key(r: str):
    m = re.fullmatch(r"([A-Z]+?)(\d+)", r)
    order = {"R": 0, "UR": 1, "P": 2, "UP": 3, "B": 4}
    if m:
        return (order.get(m.group(1), 9), int(m.group(2)), r)
    return (9, 0, r)
