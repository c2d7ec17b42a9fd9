"""Gate 2, per instruction: execution counts of every SASS instruction (Nsight Compute's
SourceCounters, exported as its source page) compared across secret input classes.

Why per instruction: a warp-specialised kernel hands tiles between warps through waits that compile
to retry loops (``SYNCS.PHASECHK.TRANS64.TRYWAIT`` + a branch back while the phase is incomplete; the
register reallocation at partition entry, ``USETMAXREG.TRY_ALLOC`` + branch). How often such a loop
retries follows how long the other warps took, so the kernel's total instruction and branch counts
move between repetitions of the same input. The aggregate counters cannot tell that from a
data-dependent path; per instruction address it is visible: the gate requires every instruction outside
a retry loop to execute the same number of times (and touch the same number of sectors and
wavefronts) for every class and repetition, and reports each retry loop's counts with a test of
whether the class explains them (one-way ANOVA across classes, repetitions as the noise).

What this adds to the threat model (docs/security.md): a retry count is a function of elapsed time
only, so it reveals nothing beyond what the wall time already does, and gate 4 measures that.

Pure functions (unit-tested on CPU with synthetic CSV): :func:`parse_source_csv`, :func:`retry_loops`,
:func:`compare_launches`.
"""
from __future__ import annotations

import csv
import io
import re
from typing import Optional

from .stats import class_effect_pvalue

# Instrumented, per-address counters that must not depend on the class. (The page's sampling columns,
# "Warp Stall Sampling", "# Samples", stall_*, are statistical and ignored.)
COUNTED_COLUMNS = (
    "Instructions Executed",
    "Thread Instructions Executed",
    "Divergent Branches",
    "L1 Tag Requests Global",
    "L1 Wavefronts Shared",
    "L1 Wavefronts Shared Ideal",
    "L2 Theoretical Sectors Global",
    "L2 Theoretical Sectors Global Ideal",
)
# Reported, not required: a select compiled to a predicated instruction (``@!P2 PRMT``) issues for
# every thread whatever the predicate, and only its predicated-on count follows the data; the aggregate
# gate treats smsp__thread_inst_executed_pred_on the same way. (A predicated memory access would change
# the sector and wavefront columns above, which are required.)
INFO_COLUMNS = ("Predicated-On Thread Instructions Executed",)
# The instructions whose result a retry loop spins on (the loop's exit predicate).
RETRY_OPCODES = ("SYNCS.PHASECHK", "USETMAXREG.TRY_ALLOC")
_BRANCH = re.compile(r"^(?:@!?U?P\w+\s+)?BRA(?:\.\S+)?\s+(?:!?U?P\w+,\s*)?(0x[0-9a-fA-F]+)")


def _num(s: str) -> Optional[float]:
    s = (s or "").strip().replace(",", "")
    if not s:
        return None
    try:
        return float(s)
    except ValueError:
        return None


def parse_source_csv(text: str) -> list:
    """``ncu --import R --csv --page source --print-source sass`` -> one dict per profiled kernel launch,
    in the report's order: {"kernel": name, "rows": {address: {"sass": text, column: number}},
    "order": [addresses in listing order]}."""
    blocks = []
    cur = None
    header = None
    for rec in csv.reader(io.StringIO(text)):
        if not rec:
            continue
        if rec[0] == "Kernel Name":
            cur = {"kernel": rec[1] if len(rec) > 1 else "?", "rows": {}, "order": []}
            blocks.append(cur)
            header = None
            continue
        if cur is None:
            continue
        if rec[0] == "Address" and "Source" in rec:
            header = {name: i for i, name in enumerate(rec)}
            continue
        if header is None or len(rec) <= header["Source"]:
            continue
        addr = rec[header["Address"]].strip()
        if not addr:
            continue
        row = {"sass": rec[header["Source"]].strip()}
        for col in COUNTED_COLUMNS + INFO_COLUMNS:
            i = header.get(col)
            if i is not None and i < len(rec):
                row[col] = _num(rec[i])
        cur["rows"][addr] = row
        cur["order"].append(addr)
    if not blocks:
        raise ValueError("no ncu source page in the text (no line starting with \"Kernel Name\")")
    return blocks


def retry_loops(block: dict) -> dict:
    """{address: loop head} of every instruction in a retry loop. ptxas emits a wait as a first try in
    line (``TRYWAIT P0`` + ``@!P0 BRA retry``, executed once per wait whatever the timing) and an out of
    line retry block: ``TRYWAIT P0; @!P0 BRA <itself>; BRA <back>``. A retry loop here is a predicated
    branch back to an address at or before it, with no other branch in between and a RETRY_OPCODES
    instruction in that span, plus the unconditional branch that leaves it (when it follows at once):
    how often the block runs is the number of first tries that failed, which is timing."""
    order = block["order"]
    pos = {int(a, 16): i for i, a in enumerate(order)}
    sass = [block["rows"][a]["sass"] for a in order]
    out = {}
    for i, text in enumerate(sass):
        m = _BRANCH.match(text)
        conditional = text.startswith("@") or ", 0x" in text  # @P0 BRA t, or BRA.U !UP0, t
        if not m or not conditional:
            continue
        j = pos.get(int(m.group(1), 16))
        if j is None or j > i or any(_BRANCH.match(t) for t in sass[j:i]):
            continue
        if not any(op in t for t in sass[j:i + 1] for op in RETRY_OPCODES):
            continue
        span = order[j:i + 1]
        if i + 1 < len(sass) and _BRANCH.match(sass[i + 1]) and not sass[i + 1].startswith("@"):
            span.append(order[i + 1])
        for a in span:
            out[a] = order[j]
    return out


def compare_launches(per_class: dict, *, alpha: float = 1e-3) -> dict:
    """per_class: {class: [source block per repetition]} of one kernel in one public configuration.

    Returns {"pass", "n_instructions", "differing": [...], "retry_loops": {...}, "predicated_on_differs":
    [...]}: ``differing`` lists
    the instructions outside retry loops whose counts are not the same in every launch (address,
    SASS, column, values per class): each one fails the gate. ``retry_loops`` gives, per loop head,
    the loop's executed instructions per class and repetition and the class-effect p-value; a loop
    whose count the class explains (p < alpha and a spread across classes beyond the largest spread
    within one class) fails too. ``predicated_on_differs``: the predicated instructions whose
    predicated-on thread count differs (information, see INFO_COLUMNS)."""
    launches = [(c, b) for c, bs in per_class.items() for b in bs]
    if not launches:
        raise ValueError("no launches to compare")
    ref = launches[0][1]
    loops = retry_loops(ref)
    res = {"kernel": ref["kernel"], "n_instructions": len(ref["order"]), "n_launches": len(launches),
           "differing": [], "predicated_on_differs": [], "retry_loops": {}, "listing_mismatch": []}
    for c, b in launches[1:]:
        if b["order"] != ref["order"] or any(b["rows"][a]["sass"] != ref["rows"][a]["sass"] for a in ref["order"]):
            res["listing_mismatch"].append(c)
    if res["listing_mismatch"]:
        res["pass"] = False
        return res
    for addr in ref["order"]:
        if addr in loops:
            continue
        for col in COUNTED_COLUMNS + INFO_COLUMNS:
            vals = {c: [b["rows"][addr].get(col) for b in bs] for c, bs in per_class.items()}
            flat = [v for vs in vals.values() for v in vs]
            if len(set(flat)) > 1:
                entry = {"address": addr, "offset": _offset(ref, addr), "sass": ref["rows"][addr]["sass"],
                         "column": col, "values": vals}
                (res["predicated_on_differs"] if col in INFO_COLUMNS else res["differing"]).append(entry)
    heads = sorted(set(loops.values()), key=ref["order"].index)
    loop_fail = []
    for head in heads:
        members = [a for a, h in loops.items() if h == head]
        counts = {c: [sum(b["rows"][a].get("Instructions Executed") or 0 for a in members) for b in bs]
                  for c, bs in per_class.items()}
        flat = [x for xs in counts.values() for x in xs]
        noise = max(max(xs) - min(xs) for xs in counts.values())
        spread = max(flat) - min(flat)
        p = class_effect_pvalue(list(counts.values())) if spread else 1.0
        explained = spread > 0 and p is not None and p < alpha and spread > noise
        if explained:
            loop_fail.append(head)
        res["retry_loops"][_offset(ref, head)] = {
            "sass": [ref["rows"][a]["sass"] for a in ref["order"] if a in members],
            "instructions_executed": counts, "spread": spread, "run_to_run": noise, "p_class_effect": p,
            "class_explains": explained}
    res["pass"] = not res["differing"] and not loop_fail
    return res


def _offset(block: dict, addr: str) -> str:
    """The address as an offset from the kernel's first instruction (stable across processes)."""
    return hex(int(addr, 16) - int(block["order"][0], 16))
