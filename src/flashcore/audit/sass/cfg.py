"""The control-flow graph of a SASS listing: basic blocks and their successors (direct, indirect
through ``BRANCH_TARGETS``, calls and returns context-insensitively)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .isa import TRANSFER, Instr, Listing, parse_operand


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
                        t = pos.get(x.section_base + int(o, 16))  # (an offset inside this function's section)
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
