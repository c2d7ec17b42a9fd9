"""The FP8 KV-cache kernel's machine code (sm_90a, compiled on the CPU): how its e4m3 tiles reach the tensor cores.

Triton loads an 8-bit MMA operand whose contraction dimension is not its contiguous one (V's keys) byte by byte from
shared memory; on an H200 that and Triton's integer widening made an FP8 cache slower per call than a bf16 one
(docs/perf-notes.md v22, v24). The kernel now reads e4m3 pairs as uint16 tiles (``ldmatrix``) and widens them with
the hardware convert. These tests pin that shape of the code, for the fast and the secure kernel, contiguous and
paged (the per-key page gather)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import nvdisasm_missing

pytestmark = pytest.mark.skipif(nvdisasm_missing() is not None, reason=str(nvdisasm_missing()))

_DECODE_SASS = """
import sys, torch
from flashcore.audit.sass import compile_cubin, disassemble
from flashcore.audit.specs import _decode_specs
secure, cache, page, splits = sys.argv[1] == "secure", sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cache_dtype = torch.bfloat16 if sys.argv[5:] == ["bf16"] else torch.float8_e4m3fn
spec = _decode_specs(torch.bfloat16, cache_dtype, 128, cache, page, 1, True, splits, secure)[0]
c = compile_cubin(spec["fn"], spec["signature"], spec["constexprs"], num_warps=spec["num_warps"],
                  num_stages=spec["num_stages"], attrs=spec["attrs"], maxnreg=spec["maxnreg"])
sys.stdout.write(disassemble(c.cubin))
"""


def decode_split_sass(secure: bool, cache: str, page: int, splits: int = 1, cache_dtype: str = "fp8") -> str:
    """SASS of the split kernel for a bf16 q and an e4m3 cache (``cache_dtype`` "bf16": a bf16 one; D 128, ``splits``
    splits), as the planner launches it; compiled in a fresh process without ``TRITON_INTERPRET`` (which the CPU suite
    sets)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    argv = ["secure" if secure else "fast", cache, str(page), str(splits), cache_dtype]
    r = subprocess.run([sys.executable, "-c", _DECODE_SASS, *argv], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def opcodes(sass: str) -> list[str]:
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass)


@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("cache,page", [("contiguous", 0), ("paged", 16)])
def test_fp8_tiles_reach_the_tensor_cores_by_ldmatrix_and_the_hardware_convert(secure, cache, page):
    ops = opcodes(decode_split_sass(secure, cache, page))
    assert any(o.startswith("HMMA") for o in ops), "no MMA: the kernel did not compile as expected"
    byte_loads = [o for o in ops if o.startswith("LDS") and (".U8" in o or ".S8" in o)]
    assert not byte_loads, f"{len(byte_loads)} byte-wise shared-memory loads ({byte_loads[:3]})"
    assert any(o.startswith("LDSM") and ".MT88" in o for o in ops), "V is not read by a transposing ldmatrix"
    converts = [o for o in ops if o.startswith("F2FP") and "E4M3" in o]
    assert converts, "e4m3 is not widened by the hardware convert"


def loop_bodies(sass: str) -> list[list[str]]:
    """The instructions of each loop (a label and a branch back to it), in order."""
    ins, labels, loops = [], {}, []
    for line in sass.splitlines():
        label = re.match(r"\s*\.L_x_(\d+):", line)
        if label:
            labels[label.group(1)] = len(ins)
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m:
            ins.append(m.group(1))
            back = re.search(r"BRA\s+`\(\.L_x_(\d+)\)", m.group(1))
            if back and back.group(1) in labels and len(ins) - 1 - labels[back.group(1)] > 1:
                loops.append(ins[labels[back.group(1)]:])
    return loops


@pytest.mark.parametrize("page,splits", [(16, 1), (64, 7)])
def test_fp8_page_gather_keeps_a_tile_in_flight_while_it_computes(page, splits):
    """The per-key page gather of an FP8 cache (page 16; page 64 with splits, whose 128-key tiles span two pages), as
    the planner launches it: its K/V loop waits for the oldest copy group only (``DEPBAR.LE SB0, n`` with n >= 1), so
    the next tile's copies stay in flight. With fewer than 5 stages Triton gave this loop one K/V slot and a wait for
    every copy (n = 0): each tile waited for its whole load (docs/perf-notes.md v25: B1 64k page 16, 70.4 -> 58.7 us;
    page 64, 64.8 -> 55.7 us on H200)."""
    loops = [body for body in loop_bodies(decode_split_sass(False, "paged", page, splits))
             if any("HMMA" in i for i in body)]
    assert loops, "no MMA loop found"
    waits = [int(w, 16) for body in loops for i in body for w in re.findall(r"DEPBAR\.LE SB0, (0x[0-9a-f]+)", i)]
    assert waits, "the key loop has no cp.async wait: the copies are no longer what this test reads"
    assert min(waits) >= 1, f"the key loop waits for every copy in flight (DEPBAR.LE SB0 {waits})"


@pytest.mark.parametrize("page", [16, 64])
def test_secure_fp8_page_gather_with_splits_keeps_a_tile_in_flight(page):
    """The secure form of that gather with splits (B1-like), as the planner launches it: its page indices are register
    loads, not a pipeline stage, so three stages keep the next tile's copies in flight while a tile computes
    (``DEPBAR.LE SB0, n`` with n >= 1). With the two stages it had before, every tile waited for its whole load
    (n = 0): B1 64k page 16 ran 74.0 us against 62.0 with three (H100, graph replays, docs/perf-notes.md v37)."""
    loops = [body for body in loop_bodies(decode_split_sass(True, "paged", page, 7)) if any("HMMA" in i for i in body)]
    assert loops, "no MMA loop found"
    waits = [int(w, 16) for body in loops for i in body for w in re.findall(r"DEPBAR\.LE SB0, (0x[0-9a-f]+)", i)]
    assert waits, "the key loop has no cp.async wait: the copies are no longer what this test reads"
    assert min(waits) >= 1, f"the key loop waits for every copy in flight (DEPBAR.LE SB0 {waits})"


@pytest.mark.parametrize("secure,splits,cache_dtype,expected", [(False, 7, "bf16", True), (False, 7, "fp8", True),
                                                                (False, 1, "bf16", False), (True, 7, "bf16", False)])
def test_the_split_step_lets_its_combine_launch_as_it_starts(secure, splits, cache_dtype, expected):
    """With splits, the fast split step executes ``griddepcontrol.launch_dependents`` (SASS ``PREEXIT``) before its
    first load, so its combine step (a programmatic dependent) starts beside it instead of after it (docs/perf-notes.md
    v43: B1 4k 11.7 -> 10.9 us in CUDA-graph replays on H200). Not at one split (no combine), and not in secure mode,
    whose audited machine code stays as it was."""
    ops = opcodes(decode_split_sass(secure, "contiguous", 0, splits, cache_dtype))
    assert ("PREEXIT" in ops) == expected, ops[:40]
    if expected:
        first_load = next(i for i, op in enumerate(ops) if op.startswith(("LDG", "LDGSTS")))
        assert ops.index("PREEXIT") < first_load


@pytest.mark.parametrize("secure,splits,cache_dtype,expected", [(False, 7, "bf16", True), (False, 1, "bf16", False),
                                                                (True, 7, "bf16", False), (False, 7, "fp8", False)])
def test_a_short_page_gather_prefetches_its_table_row_before_its_first_load(secure, splits, cache_dtype, expected):
    """v59: the fast 16-bit page gather with splits over a short table row (here 64 entries, two lines) issues one L2
    prefetch instruction (``CCTL.E.PF2``, thread-predicated) before its first global load, the length's, so the row is
    on its way while the split's page indices wait for the length. Not at one split, not in secure mode (its audited
    machine code stays as it was), not for the FP8 gather (round-robin splits, whose first indices do not wait)."""
    ops = opcodes(decode_split_sass(secure, "paged", 16, splits, cache_dtype))
    prefetches = [op for op in ops if op.startswith("CCTL")]
    assert prefetches == (["CCTL.E.PF2"] if expected else []), prefetches
    if expected:
        first_load = next(i for i, op in enumerate(ops) if op.startswith(("LDG", "LDGSTS")))
        assert ops.index("CCTL.E.PF2") < first_load


_DECODE_TTGIR = """
import sys, torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashcore.audit.sass.compile import _compiler_mode, _unwrap_jit
from flashcore.audit.specs import _decode_specs
cache, page, splits, cache_dtype, which = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
dtype = torch.bfloat16 if cache_dtype == "bf16" else torch.float8_e4m3fn
specs = _decode_specs(torch.bfloat16, dtype, 128, cache, page, 1, True, splits, True)
spec = specs[0] if which == "planned" else next(s for s in specs if s["name"].endswith("_vscalars"))
src = ASTSource(_unwrap_jit(spec["fn"]), signature=dict(spec["signature"]), constexprs=dict(spec["constexprs"]),
                attrs=dict(spec["attrs"]))
with _compiler_mode():
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": spec["num_warps"], "num_stages": spec["num_stages"]})
print(spec["constexprs"]["BLOCK_N"], spec["constexprs"]["SEEN_BY_LOAD"])
sys.stdout.write(c.asm["ttgir"])
"""


def secure_decode_ttgir(cache: str, page: int, splits: int, cache_dtype: str,
                        which: str = "planned") -> tuple[int, bool, str]:
    """(BLOCK_N, SEEN_BY_LOAD, TTGIR) of the secure split kernel for a bf16 q, D 128, as the planner configures it at
    ``splits`` splits (``which`` "control": the audit's scalar-select control at the same tiles); compiled for sm_90a
    in a fresh process without ``TRITON_INTERPRET``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", _DECODE_TTGIR, cache, str(page), str(splits), cache_dtype, which],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    head, ttgir = r.stdout.split("\n", 1)
    block_n, by_load = head.split()
    return int(block_n), by_load == "True", ttgir


def _v_reaches_the_mma_from_shared_memory(cache: str, page: int, splits: int, cache_dtype: str) -> None:
    """V's tile read from shared memory as the MMA operand, never written back (the planner's secure form), where the
    audit's scalar-select control at the same tiles does write it back (so the check can see a round trip)."""
    cols = 128 if cache_dtype == "bf16" else 64  # an FP8 tile as its even and odd columns (float16 halves)

    def v_sized_allocs(ttgir, block_n):
        return re.findall(rf"ttg\.local_alloc %\S+ : \(tensor<{block_n}x{cols}x", ttgir)

    # the control: the select on scalars at the same tiles sends V's tile back (so the pattern below can see it)
    block_n, by_load, control = secure_decode_ttgir(cache, page, splits, cache_dtype, which="control")
    assert not by_load and v_sized_allocs(control, block_n), "the control shows no round trip: the test is blind"
    block_n, by_load, ttgir = secure_decode_ttgir(cache, page, splits, cache_dtype)
    assert by_load, "the planner no longer takes the select from loaded tensors here"
    v_sized = v_sized_allocs(ttgir, block_n)
    assert not v_sized, f"V's tile goes back to shared memory ({len(v_sized)} allocations of a {block_n}x{cols} tile)"
    operand = re.findall(rf"ttg\.local_load .*-> tensor<{block_n}x{cols}x\w+, #ttg\.dot_op<\{{opIdx = 1", ttgir)
    operand += re.findall(rf"ttg\.local_load .*-> tensor<{block_n}x{cols}xi16, #ttg\.dot_op<\{{opIdx = 1", ttgir)
    assert operand, "V's tile is not read from shared memory as the MMA operand"


@pytest.mark.parametrize("cache,page,cache_dtype", [("contiguous", 0, "bf16"), ("paged", 16, "bf16"),
                                                    ("paged", 64, "bf16"), ("contiguous", 0, "fp8")])
def test_secure_decode_at_one_split_takes_v_to_the_mma_without_a_shared_memory_round_trip(cache, page, cache_dtype):
    """The secure split kernel at one split (B64-like decode), a bf16 cache or a contiguous FP8 one: V's rows outside
    the secret range are zeroed by a select that Triton keeps in the MMA operand's layout, so V's tile goes from shared
    memory (where its copy lands) straight into the operand, as in the fast path. With the select on a range and the
    scalar lengths, the tile was read into a blocked layout, selected, written back to shared memory and read again
    as the operand on every step (``ttg.local_alloc`` of a V-sized register tile): 0.89-0.93x of the fast path at
    B64 against 0.97-0.99x without it (H200, docs/perf-notes.md v47)."""
    _v_reaches_the_mma_from_shared_memory(cache, page, 1, cache_dtype)


@pytest.mark.parametrize("cache,page,cache_dtype", [("contiguous", 0, "bf16"), ("paged", 128, "bf16"),
                                                    ("contiguous", 0, "fp8")])
def test_secure_decode_with_splits_takes_v_to_the_mma_without_a_shared_memory_round_trip(cache, page, cache_dtype):
    """The same with splits (B1-like decode, 7 splits) since v49, where each tile lies in one page: the hoisted loop
    with V's select from loaded tensors (a 16-bit cache reading each key's position every tile, FP8 the tile's
    start), which took B1 64k FP8 from 0.80x to 0.99x of the fast path and bf16 from 0.98x to 1.01x (H200,
    docs/perf-notes.md v49)."""
    _v_reaches_the_mma_from_shared_memory(cache, page, 7, cache_dtype)
