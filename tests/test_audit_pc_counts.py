"""Gate 2 per instruction (flashcore.audit.pc_counts) on synthetic ncu source pages: retry loops are
found in the listing, set aside when only timing moves them, and every other difference fails."""
import pytest

from flashcore.audit import counters, pc_counts

BASE = 0x7F0000000000
COLS = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
        "Thread Instructions Executed", "Predicated-On Thread Instructions Executed", "Divergent Branches",
        "L2 Theoretical Sectors Global"]
# (offset, sass); retry blocks out of line at the end, as ptxas lays them out
LISTING = [
    (0x00, "S2R R0, SR_TID.X"),
    (0x10, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x100], R3"),
    (0x20, "@!P0  BRA {retry}"),
    (0x30, "LDG.E R5, desc[UR6][R8.64]"),
    (0x40, "USETMAXREG.TRY_ALLOC.CTAPOOL P1, 0xf0"),
    (0x50, "@!P1  BRA 0x7f0000000040"),
    (0x60, "FSEL R5, R5, -INF , !P2"),
    (0x68, "@P3  BRA 0x7f0000000010"),  # the main loop's back edge: holds the in-line wait, not a retry loop
    (0x70, "EXIT"),
    (0x80, "BRA 0x7f0000000080"),
    (0x90, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x100], R3"),
    (0xA0, "@!P0  BRA 0x7f0000000090"),
    (0xB0, "BRA 0x7f0000000030"),
]
RETRY_BLOCK = {0x90, 0xA0, 0xB0}
REALLOC_LOOP = {0x40, 0x50}


def _sass(text):
    return text.replace("{retry}", hex(BASE + 0x90))


def _page(launches):
    """A source page: one block per launch; ``launches``: list of {offset: count overrides}."""
    lines = []
    for over in launches:
        lines.append('"Kernel Name","attn_fwd_hopper_kernel",')
        lines.append(",".join(f'"{c}"' for c in COLS))
        for off, text in LISTING:
            n = over.get(off, 0 if off in RETRY_BLOCK else 100)
            sectors = over.get(("sectors", off), 32 if "LDG" in text else 0)
            pred_on = over.get(("pred_on", off), 32 * n)
            lines.append(",".join(f'"{v}"' for v in (hex(BASE + off), _sass(text), 7, n, 32 * n, pred_on, 0, sectors)))
    return "\n".join(lines) + "\n"


def _by_class(launches_per_class):
    blocks = pc_counts.parse_source_csv(_page([o for c in launches_per_class.values() for o in c]))
    out, i = {}, 0
    for c, ls in launches_per_class.items():
        out[c] = blocks[i:i + len(ls)]
        i += len(ls)
    return out


def test_parse_and_find_retry_loops():
    (block,) = pc_counts.parse_source_csv(_page([{}]))
    assert block["kernel"] == "attn_fwd_hopper_kernel" and len(block["order"]) == len(LISTING)
    assert block["rows"][hex(BASE + 0x30)]["Instructions Executed"] == 100.0
    loops = pc_counts.retry_loops(block)
    # the out-of-line retry block (with its exit jump) and the register reallocation loop; not the
    # in-line first try, not the main loop around it (other branches inside), not the unconditional
    # self-jump at 0x80 (no wait in it)
    assert {int(a, 16) - BASE for a in loops} == RETRY_BLOCK | REALLOC_LOOP
    with pytest.raises(ValueError, match="Kernel Name"):
        pc_counts.parse_source_csv('"Address","Source"\n')


def test_timing_in_retry_loops_passes_and_is_reported():
    per_class = _by_class({
        "random": [{0x90: 3, 0xA0: 3, 0xB0: 1}, {}],
        "len1": [{}, {0x40: 104, 0x50: 104}],
        "nan_pad": [{0x90: 12, 0xA0: 12, 0xB0: 2}, {}],
    })
    res = pc_counts.compare_launches(per_class)
    assert res["pass"] and res["differing"] == []
    moved = {k: v for k, v in res["retry_loops"].items() if v["spread"]}
    assert set(moved) == {"0x40", "0x90"} and not any(v["class_explains"] for v in moved.values())


def test_a_difference_outside_retry_loops_fails():
    per_class = _by_class({"random": [{}, {}], "len1": [{0x60: 101}, {0x60: 101}]})
    res = pc_counts.compare_launches(per_class)
    assert not res["pass"]
    (d,) = [d for d in res["differing"] if d["column"] == "Instructions Executed"]
    assert d["offset"] == "0x60" and d["sass"].startswith("FSEL") and d["values"]["len1"] == [101.0, 101.0]
    # a data-dependent address shows in the sectors an instruction touched, with the same count
    res = pc_counts.compare_launches(_by_class({"random": [{}], "huge": [{("sectors", 0x30): 64}]}))
    assert not res["pass"] and res["differing"][0]["column"] == "L2 Theoretical Sectors Global"


def test_a_select_as_a_predicated_instruction_is_reported_not_failed():
    """``FSEL``'s cousin: a select compiled to ``@!P2 PRMT`` issues for every thread; only how many
    threads had the predicate on follows the data (what the aggregate gate's info metric reports)."""
    res = pc_counts.compare_launches(_by_class({"random": [{("pred_on", 0x60): 1000}], "len1": [{("pred_on", 0x60): 64}]}))
    assert res["pass"] and res["differing"] == []
    (d,) = res["predicated_on_differs"]
    assert d["offset"] == "0x60" and d["values"] == {"random": [1000.0], "len1": [64.0]}


def test_a_retry_loop_that_follows_the_class_fails():
    per_class = _by_class({
        "len1": [{0x90: 2, 0xA0: 2, 0xB0: 1}, {0x90: 3, 0xA0: 3, 0xB0: 1}, {0x90: 2, 0xA0: 2, 0xB0: 1}],
        "len_full": [{0x90: 60, 0xA0: 60, 0xB0: 9}, {0x90: 61, 0xA0: 61, 0xB0: 9}, {0x90: 60, 0xA0: 60, 0xB0: 9}],
    })
    res = pc_counts.compare_launches(per_class)
    assert not res["pass"] and res["differing"] == [] and res["retry_loops"]["0x90"]["class_explains"]


def test_different_machine_code_fails():
    blocks = pc_counts.parse_source_csv(_page([{}, {}]))
    other = dict(blocks[1], rows=dict(blocks[1]["rows"]))
    other["rows"][hex(BASE + 0x60)] = dict(other["rows"][hex(BASE + 0x60)], sass="FMNMX R5, R5, R6, !PT")
    res = pc_counts.compare_launches({"a": [blocks[0]], "b": [other]})
    assert not res["pass"] and res["listing_mismatch"] == ["b"]


def test_per_pc_supersedes_the_aggregate_instruction_counters_only():
    per_class = {c: [{"smsp__inst_executed.sum": {"value": v, "raw": str(v), "instances": None},
                      "dram__bytes_read.sum": {"value": 1000.0, "raw": "1000", "instances": None}} for v in vs]
                 for c, vs in {"random": [100.0, 103.0], "len1": [100.0, 101.0]}.items()}
    res = counters.compare_config(per_class)
    assert res["failed"] == ["smsp__inst_executed.sum"]
    ok = _by_class({"random": [{}, {0x90: 3, 0xA0: 3, 0xB0: 1}], "len1": [{}, {0x90: 1, 0xA0: 1, 0xB0: 1}]})
    res = counters.apply_per_pc(res, [ok])
    assert res["pass"] and res["metrics"]["smsp__inst_executed.sum"]["status"] == "per_pc"
    bad = _by_class({"random": [{}, {}], "len1": [{0x30: 99}, {0x30: 99}]})
    res = counters.apply_per_pc(counters.compare_config(per_class), [bad])
    assert not res["pass"] and res["failed"] == ["per_pc"]
