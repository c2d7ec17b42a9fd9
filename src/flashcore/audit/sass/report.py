"""What the SASS taint analysis reports: :class:`Violation` (one finding), :class:`ParamInfo` (a kernel
parameter's constant-bank slot and role) and :class:`Report` (one kernel's result)."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterable

VIOLATION_KINDS = ("branch", "address", "predicated-memory", "timing", "coverage", "specialisation")


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
    #: the content key of the machine-code analysis behind this report (:func:`.memo.analysis_key`), and how many
    #: of ``notes`` that analysis wrote (the rest are the launch checks' and the shared-memory split's)
    analysis_key: str | None = None
    analysis_notes: int = 0
    #: the analysis was not run here but taken from a committed report for the same key (``audit sass --reuse``)
    reused: bool = False

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
            "analysis_key": self.analysis_key,
            "analysis_notes": self.analysis_notes,
            "reused": self.reused,
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
