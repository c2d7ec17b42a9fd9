"""Static SASS taint audit (flashcore.audit.sass): known-answer kernels, compiled for sm_90a on CPU.

Every case checks both directions: the violation (with its kind) is found where the secret really
reaches a branch / address / predicate, and nothing is reported for the same code when the input
is public (or for the secret-safe variant).
"""
from __future__ import annotations

import json
import sys
import types

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from flashcore.audit import sass  # noqa: E402
from flashcore.audit.sass import (  # noqa: E402
    ParamInfo,
    analyze_listing,
    audit_kernels,
    compile_cubin,
    disassemble,
    sass_taint,
)
from flashcore.audit.sass import elf as sass_elf  # noqa: E402
from conftest import nvdisasm_missing  # noqa: E402
from flashcore.audit.sass.isa import parse_nvdisasm  # noqa: E402


_NO_NVDISASM = nvdisasm_missing()
pytestmark = pytest.mark.skipif(_NO_NVDISASM is not None, reason=f"no nvdisasm: {_NO_NVDISASM}")


# ---------------------------------------------------------------------------------------------
# known-answer kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_branch(X, Y):
    x = tl.load(X)
    if x > 0:
        tl.store(Y, x * 2)


@triton.jit
def k_while(X, Y):
    x = tl.load(X)
    acc = 0
    i = 0
    while i < x:  # trip count = a loaded value
        acc += i * i
        i += 1
    tl.store(Y, acc)


@triton.jit
def k_gather(IDX, T, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    idx = tl.load(IDX + offs)
    tl.store(Y + offs, tl.load(T + idx))


@triton.jit
def k_loop(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, n):
        acc += tl.load(X + i * BLOCK + offs)
    tl.store(Y + offs, acc)


@triton.jit
def k_select(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    tl.store(Y + offs, tl.where(x > 0, x, 0.0))


@triton.jit
def k_mask(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0)
    tl.store(Y + offs, x * 2.0)


@triton.jit
def k_dot(A, B, C, T, USE_AS_INDEX: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    a = tl.load(A + r[:, None] * BLOCK + r[None, :])
    b = tl.load(B + r[:, None] * BLOCK + r[None, :])
    c = tl.dot(a, b)
    if USE_AS_INDEX:
        idx = c.to(tl.int32) & 1023
        tl.store(C + r[:, None] * BLOCK + r[None, :], tl.load(T + idx))
    else:
        tl.store(C + r[:, None] * BLOCK + r[None, :], c)


@triton.jit
def k_div(X, Y, Z, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Z + offs, tl.div_rn(tl.load(X + offs), tl.load(Y + offs)))  # IEEE division: slow-path CALL


@triton.jit
def k_tma(Q, K, O, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Pipelined Hopper kernel: device-side TMA descriptors, mbarriers (SYNCS.*), wgmma."""
    pid = tl.program_id(0)
    qd = tl.make_tensor_descriptor(Q, shape=[N, D], strides=[D, 1], block_shape=[BLOCK_M, D])
    kd = tl.make_tensor_descriptor(K, shape=[N, D], strides=[D, 1], block_shape=[BLOCK_N, D])
    od = tl.make_tensor_descriptor(O, shape=[N, D], strides=[D, 1], block_shape=[BLOCK_M, D])
    q = qd.load([pid * BLOCK_M, 0])
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N):
        k = kd.load([start, 0])
        s = tl.dot(q, k.T)
        acc = tl.dot(s.to(tl.float16), k, acc)
    od.store([pid * BLOCK_M, 0], acc.to(tl.float16))


@triton.jit
def k_hostdesc(Xd, Y, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    x = Xd.load([pid * BLOCK, 0])
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs[:, None] * 64 + tl.arange(0, 64)[None, :], x)


SIG_MASK = {"X": "*fp32", "Y": "*fp32", "n": "i32", "BLOCK": "constexpr"}
SIG_DOT = {"A": "*fp16", "B": "*fp16", "C": "*fp32", "T": "*fp32", "USE_AS_INDEX": "constexpr", "BLOCK": "constexpr"}
SIG_TMA = {"Q": "*fp16", "K": "*fp16", "O": "*fp16", "N": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
           "D": "constexpr"}


def kinds(rep) -> set[str]:
    return {v.kind for v in rep.violations}


# ---------------------------------------------------------------------------------------------
# 1. branch on a loaded secret
# ---------------------------------------------------------------------------------------------


def test_branch_on_loaded_secret():
    sig = {"X": "*i32", "Y": "*i32"}
    bad = sass_taint(k_branch, sig, {}, {"X"})
    assert not bad.ok
    assert "branch" in kinds(bad), str(bad)
    v = next(v for v in bad.violations if v.kind == "branch")
    assert v.opcode in ("BRA", "EXIT") and v.sass and isinstance(v.offset, int)
    assert any("secret pointer X" in t for t in v.trace), v.trace  # the explanation reaches the source
    good = sass_taint(k_branch, sig, {}, set())
    assert good.ok, str(good)
    assert good.n_instructions == bad.n_instructions > 0


def test_loop_trip_count_from_loaded_secret():
    sig = {"X": "*i32", "Y": "*i32"}
    bad = sass_taint(k_while, sig, {}, {"X"})
    assert "branch" in kinds(bad), str(bad)
    assert any(v.opcode == "BRA" for v in bad.violations)
    assert sass_taint(k_while, sig, {}, set()).ok


# ---------------------------------------------------------------------------------------------
# 2. gather with a secret index
# ---------------------------------------------------------------------------------------------


def test_gather_with_secret_index():
    sig = {"IDX": "*i32", "T": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"}
    bad = sass_taint(k_gather, sig, {"BLOCK": 128}, {"IDX"})
    addr = [v for v in bad.violations if v.kind == "address"]
    assert addr and all(v.opcode.startswith("LDG") for v in addr), str(bad)
    # secret table, public index: the data is secret but the address is not
    good = sass_taint(k_gather, sig, {"BLOCK": 128}, {"T"})
    assert good.ok, str(good)
    assert "global:Y" in good.tainted_memory  # the secret did flow (into the output), just not into an address


# ---------------------------------------------------------------------------------------------
# 3. loop bound from a secret scalar
# ---------------------------------------------------------------------------------------------


def test_loop_bound_from_secret_scalar():
    bad = sass_taint(k_loop, SIG_MASK, {"BLOCK": 128}, {"X", "n"})
    assert "branch" in kinds(bad), str(bad)
    assert any("secret scalar n" in " ".join(v.trace) for v in bad.violations if v.kind == "branch")
    good = sass_taint(k_loop, SIG_MASK, {"BLOCK": 128}, {"X"})
    assert good.ok, str(good)


# ---------------------------------------------------------------------------------------------
# 4. a select is data flow, not a violation
# ---------------------------------------------------------------------------------------------


def test_select_is_not_a_violation():
    rep = sass_taint(k_select, {"X": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 128}, {"X"})
    assert rep.ok, str(rep)
    assert rep.tainted_registers, "the loaded secret must be tracked"
    assert "global:Y" in rep.tainted_memory


# ---------------------------------------------------------------------------------------------
# 5. bounds mask on a public vs a secret length
# ---------------------------------------------------------------------------------------------


def test_mask_on_public_length_is_clean_secret_length_is_not():
    good = sass_taint(k_mask, SIG_MASK, {"BLOCK": 1024}, {"X"})
    assert good.ok, str(good)
    bad = sass_taint(k_mask, SIG_MASK, {"BLOCK": 1024}, {"X", "n"})
    assert "predicated-memory" in kinds(bad), str(bad)
    pm = [v for v in bad.violations if v.kind == "predicated-memory"]
    assert all(v.opcode.startswith(("LDG", "STG")) for v in pm)
    assert all(v.sass.startswith("@") for v in pm)


# ---------------------------------------------------------------------------------------------
# 6. matrix unit outputs
# ---------------------------------------------------------------------------------------------


def test_dot_of_secret_tiles():
    cubin = compile_cubin(k_dot, SIG_DOT, {"USE_AS_INDEX": False, "BLOCK": 64}, num_warps=4).cubin
    assert "HGMMA" in disassemble(cubin)  # the secret goes through shared memory and the tensor cores
    clean = sass_taint(k_dot, SIG_DOT, {"USE_AS_INDEX": False, "BLOCK": 64}, {"A", "B"}, num_warps=4)
    assert clean.ok, str(clean)
    assert "shared" in clean.tainted_memory and "global:C" in clean.tainted_memory
    idx = sass_taint(k_dot, SIG_DOT, {"USE_AS_INDEX": True, "BLOCK": 64}, {"A", "B"}, num_warps=4)
    assert "address" in kinds(idx), str(idx)
    assert sass_taint(k_dot, SIG_DOT, {"USE_AS_INDEX": True, "BLOCK": 64}, set(), num_warps=4).ok


# ---------------------------------------------------------------------------------------------
# calls (IEEE division slow path), Hopper pipelines (TMA + mbarriers), parameters
# ---------------------------------------------------------------------------------------------


def test_ieee_division_slow_path_is_a_secret_branch():
    sig = {"X": "*fp32", "Y": "*fp32", "Z": "*fp32", "BLOCK": "constexpr"}
    text = disassemble(compile_cubin(k_div, sig, {"BLOCK": 128}).cubin)
    assert "CALL.REL" in text and "RET.REL" in text
    bad = sass_taint(k_div, sig, {"BLOCK": 128}, {"X"})
    assert "branch" in kinds(bad), str(bad)
    assert sass_taint(k_div, sig, {"BLOCK": 128}, set()).ok


def test_pipelined_tma_kernel_mbarriers_are_not_false_positives():
    ce = {"BLOCK_M": 128, "BLOCK_N": 64, "D": 64}
    text = disassemble(compile_cubin(k_tma, SIG_TMA, ce, num_warps=8).cubin)
    for op in ("UTMALDG", "SYNCS.PHASECHK", "SYNCS.ARRIVE", "HGMMA"):
        assert op in text
    good = sass_taint(k_tma, SIG_TMA, ce, {"Q", "K"}, num_warps=8)
    assert good.ok, str(good)
    assert "shared" in good.tainted_memory  # tiles arrive through TMA from secret tensors
    bad = sass_taint(k_tma, SIG_TMA, ce, {"Q", "K", "N"}, num_warps=8)  # secret trip count
    assert "branch" in kinds(bad), str(bad)


def test_parameter_mapping_to_constant_bank():
    comp = compile_cubin(k_mask, SIG_MASK, {"BLOCK": 1024})
    info = sass_elf.kernel_info(comp.cubin, comp.kernel)
    assert info.param_base == 0x210
    rep = sass_taint(k_mask, SIG_MASK, {"BLOCK": 1024}, {"X", "n"})
    by_name = {p.name: p for p in rep.params}
    assert (by_name["X"].cbank_offset, by_name["X"].size, by_name["X"].role) == (0x210, 8, "pointer")
    assert (by_name["Y"].cbank_offset, by_name["Y"].role) == (0x218, "pointer")
    assert (by_name["n"].cbank_offset, by_name["n"].size, by_name["n"].role) == (0x220, 4, "scalar")
    assert by_name["X"].secret and by_name["n"].secret and not by_name["Y"].secret
    hidden = [p for p in rep.params if p.role == "hidden"]
    assert [p.name for p in hidden] == ["<global_scratch>", "<profile_scratch>"]
    assert not rep.notes


def test_host_tensor_descriptor_parameters():
    sig = {"Xd": "tensordesc<fp16[64, 64]>", "Y": "*fp16", "n": "i32", "BLOCK": "constexpr"}
    rep = sass_taint(k_hostdesc, sig, {"BLOCK": 64}, {"Xd"})
    by_name = {p.name: p for p in rep.params}
    assert by_name["Xd"].role == "tensordesc" and by_name["Xd"].size == 128 and by_name["Xd"].secret
    assert {"Xd.shape0", "Xd.shape1", "Xd.stride0", "Xd.stride1", "Y", "n"} <= set(by_name)
    assert not by_name["Xd.shape0"].secret
    assert rep.ok, str(rep)
    assert "global:Y" in rep.tainted_memory  # the TMA-loaded tile is secret and reaches the output


def test_secret_must_name_an_argument():
    with pytest.raises(ValueError):
        sass_taint(k_select, {"X": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 128}, {"Z"})


# ---------------------------------------------------------------------------------------------
# modelling details on hand-written SASS (no compiler involved)
# ---------------------------------------------------------------------------------------------

PARAMS = [
    ParamInfo(0, "X", 0x210, 8, "pointer", True),
    ParamInfo(1, "Y", 0x218, 8, "pointer", False),
    ParamInfo(2, "n", 0x220, 4, "scalar", False),
]


def _run(body: str):
    listing = parse_nvdisasm("k:\n" + body)
    return analyze_listing(listing, PARAMS, "k")


def _at(rep, off):
    return {v.kind for v in rep.violations if v.offset == off}


def test_mbarrier_results_public_but_shared_memory_data_secret():
    # the secret stored in the data area (below 0x100), the barrier in the control area: the wait is public
    rep = _run_split("""
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   STS [RZ], R4 ;
.L_x_0:
        /*0040*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [URZ+0x100], RZ ;
        /*0050*/              @!P0 BRA `(.L_x_0) ;
        /*0060*/                   LDS R6, [RZ] ;
        /*0070*/                   ISETP.GT.AND P1, PT, R6, RZ, PT ;
        /*0080*/               @P1 BRA `(.L_x_1) ;
        /*0090*/                   NOP ;
.L_x_1:
        /*00a0*/                   EXIT ;
""", control_from=0x100)
    assert _at(rep, 0x50) == set()
    assert _at(rep, 0x80) == {"branch"}
    assert "shared" in rep.tainted_memory


def test_packed_predicate_bits_and_local_spills_are_bit_precise():
    rep = _run("""
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDG.E R6, desc[UR4][R2.64] ;
        /*0030*/                   S2R R0, SR_TID.X ;
        /*0040*/                   ISETP.GT.AND P1, PT, R6, RZ, PT ;
        /*0050*/                   ISETP.GT.AND P2, PT, R0, 0x3, PT ;
        /*0060*/                   LOP3.LUT R7, R7, 0xfffffffe, RZ, 0xc0, !PT ;
        /*0070*/               @P1 LOP3.LUT R7, R7, 0x1, RZ, 0xfc, !PT ;
        /*0080*/                   LOP3.LUT R7, R7, 0xfffffffd, RZ, 0xc0, !PT ;
        /*0090*/               @P2 LOP3.LUT R7, R7, 0x2, RZ, 0xfc, !PT ;
        /*00a0*/                   STL [R1+0x10], R7 ;
        /*00b0*/                   LDL R8, [R1+0x10] ;
        /*00c0*/                   LOP3.LUT P3, RZ, R8, 0x2, RZ, 0xc0, !PT ;
        /*00d0*/               @P3 STG.E desc[UR4][R2.64], R0 ;
        /*00e0*/                   LOP3.LUT P4, RZ, R8, 0x1, RZ, 0xc0, !PT ;
        /*00f0*/               @P4 STG.E desc[UR4][R2.64], R0 ;
        /*0100*/                   SHF.R.U32.HI R9, RZ, 0x1, R8 ;
        /*0110*/                   R2P PR, R9, 0x3 ;
        /*0120*/               @P0 STG.E desc[UR4][R2.64], R0 ;
        /*0130*/               @P1 STG.E desc[UR4][R2.64], R0 ;
        /*0140*/                   EXIT ;
""")
    assert _at(rep, 0xD0) == set()  # bit 1 (public predicate P2)
    assert _at(rep, 0xF0) == {"predicated-memory"}  # bit 0 (secret predicate P1)
    assert _at(rep, 0x120) == set()  # (R8 >> 1) bit 0 = public bit 1
    assert _at(rep, 0x130) == set()  # (R8 >> 1) bit 1 = 0: R2P made P1 public again
    assert "local[0x10]" in rep.tainted_memory


def test_same_guard_write_then_use_is_precise():
    rep = _run("""
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   S2R R0, SR_TID.X ;
        /*0040*/                   ISETP.NE.AND P5, PT, R0, RZ, PT ;
        /*0050*/              @!P5 MOV R4, 0x4000 ;
        /*0060*/              @!P5 SYNCS.ARRIVE.TRANS64 RZ, [URZ+0x100], R4 ;
        /*0070*/               @P5 SYNCS.ARRIVE.TRANS64 RZ, [URZ+0x108], R4 ;
        /*0080*/                   EXIT ;
""")
    assert _at(rep, 0x60) == set()
    assert _at(rep, 0x70) == {"timing"}


def _run_split(body: str, control_from=0x8000):
    listing = parse_nvdisasm("k:\n" + body)
    return analyze_listing(listing, PARAMS, "k", smem_control_from=control_from)


# a secret tile stored into shared memory, then a word read back and branched on: where the store and
# the read fall (data or control area, by their address immediates) decides whether the branch leaks
_SPLIT = """
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   S2R R0, SR_TID.X ;
        /*0040*/                   STS [R0+{store}], R4 ;
        /*0050*/                   LDS.U8 R6, [R0+{load}] ;
        /*0060*/                   ISETP.GT.AND P1, PT, R6, RZ, PT ;
        /*0070*/               @P1 BRA `(.L_x_1) ;
        /*0080*/                   NOP ;
.L_x_1:
        /*0090*/                   EXIT ;
"""


def test_shared_memory_split_into_data_and_control_areas():
    # secret tile in the data area, flag read from the control area: no leak
    rep = _run_split(_SPLIT.format(store="0x100", load="0x8010"))
    assert _at(rep, 0x70) == set()
    assert "shared" in rep.tainted_memory and "shared:control" not in rep.tainted_memory
    # a secret value stored into the control area taints it
    rep = _run_split(_SPLIT.format(store="0x8010", load="0x8010"))
    assert _at(rep, 0x70) == {"branch"} and "shared:control" in rep.tainted_memory
    # data read back from the data area is secret
    assert _at(_run_split(_SPLIT.format(store="0x100", load="0x200")), 0x70) == {"branch"}
    # without a layout, shared memory is one region: the flag read is tainted too
    assert _at(_run_split(_SPLIT.format(store="0x100", load="0x8010"), None), 0x70) == {"branch"}


_BRX = """
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0040*/                   LDC R6, c[0x2][R0] ;
        /*0050*/                   BRX R6 -0x60 {targets};
.L_x_1:
        /*0060*/                   MOV R5, R0 ;
        /*0070*/                   BRA `(.L_x_0) ;
.L_x_2:
        /*0080*/                   MOV R5, R4 ;
        /*0090*/                   BRA `(.L_x_0) ;
.L_x_3:
        /*00a0*/                   ISETP.GT.AND P1, PT, R5, RZ, PT ;
        /*00b0*/               @P1 BRA `(.L_x_1) ;
        /*00c0*/                   EXIT ;
"""


def test_indirect_branch_follows_the_declared_jump_table():
    # a dispatch loop (as warp_specialize's): the cubin's jump table names .L_x_1 and .L_x_3 only, so
    # .L_x_2, which puts the secret into R5, never runs, and the branch on R5 in .L_x_3 is public
    rep = _run(_BRX.format(targets='(*"BRANCH_TARGETS .L_x_1,.L_x_3"*)'))
    assert _at(rep, 0xB0) == set() and not any("indirect branch" in n for n in rep.notes)
    # without the annotation (or with a target that does not resolve) every block is a successor
    for targets in ("", '(*"BRANCH_TARGETS .L_x_1,.L_x_9"*)'):
        rep = _run(_BRX.format(targets=targets))
        assert _at(rep, 0xB0) == {"branch"} and any("indirect branch" in n for n in rep.notes)


_VOTES = """
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   S2R R0, SR_TID.X ;
        /*0040*/                   R2UR UR9, R4 ;
        /*0050*/                   ISETP.LT.U32.AND P1, PT, R0, 0x20, PT ;
        /*0060*/                   VOTEU.ANY UP1, P1 ;
        /*0070*/               @UP1 UMOV UR9, URZ ;
        /*0080*/                   {between} ;
        /*0090*/                   VOTEU.ANY UP0, P1 ;
        /*00a0*/               @UP0 STS [UR9], R0 ;
        /*00b0*/                   EXIT ;
"""


def test_guards_from_the_same_vote_are_one_predicate():
    # UP0 and UP1 are the same vote of an unchanged P1: under UP0, UR9 holds UP1's public value
    assert _at(_run(_VOTES.format(between="NOP")), 0xA0) == set()
    # P1 redefined in between: the two votes may differ, and the old secret UR9 may be the address
    rep = _run(_VOTES.format(between="ISETP.LT.U32.AND P1, PT, R0, 0x40, PT"))
    assert _at(rep, 0xA0) == {"address"}


def test_unknown_opcode_is_reported_and_conservative():
    rep = _run("""
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDG.E R6, desc[UR4][R2.64] ;
        /*0030*/                   FROBNICATE.X R10, R6 ;
        /*0040*/                   LDG.E R5, desc[UR4][R12.64] ;
        /*0050*/                   EXIT ;
""")
    assert rep.unknown_opcodes == {"FROBNICATE.X": 1}
    assert _at(rep, 0x40) == {"address"}  # R10..R13 over-approximated as written
    assert "FROBNICATE" in str(rep)


def test_call_outside_the_listing_fails_as_coverage():
    rep = _run("""
        /*0000*/                   MOV R20, 0x20 ;
        /*0010*/                   CALL.REL.NOINC `(somewhere_else) ;
        /*0020*/                   EXIT ;
""")
    assert _at(rep, 0x10) == {"coverage"} and not rep.ok
    assert any("outside" in n for n in rep.notes)


# ---------------------------------------------------------------------------------------------
# report API, audit_kernels, CLI
# ---------------------------------------------------------------------------------------------


def test_report_api():
    rep = sass_taint(k_gather, {"IDX": "*i32", "T": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 128},
                     {"IDX"})
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["kernel"] == "k_gather" and d["ok"] is False
    assert d["violation_counts"]["address"] >= 1
    v = d["violations"][0]
    assert {"offset", "opcode", "kind", "sass", "trace"} <= set(v)
    assert d["n_instructions"] > 0 and d["n_blocks"] > 0
    text = str(rep)
    assert "k_gather" in text and "address" in text


def _fake_kernels(monkeypatch, secure_specs, fast_specs):
    mod = types.ModuleType("flashcore.audit.specs")
    mod.audit_specs = lambda secure, **kw: list(secure_specs if secure else fast_specs)
    monkeypatch.setitem(sys.modules, "flashcore.audit.specs", mod)


def _spec(name, fn, sig, ce, secret, nw=4, ns=3):
    return dict(name=name, fn=fn, signature=sig, constexprs=ce, secret=secret, num_warps=nw, num_stages=ns)


SEL_SIG = {"X": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"}


def test_audit_kernels_reports_errors():
    reps = audit_kernels([
        _spec("clean", k_select, SEL_SIG, {"BLOCK": 128}, {"X"}),
        _spec("broken", k_select, {"X": "*fp32"}, {}, {"X"}),
    ])
    assert [r.name for r in reps] == ["clean", "broken"]
    assert reps[0].ok and not reps[1].ok and reps[1].error


def test_cli_gate(monkeypatch, tmp_path, capsys):
    fast = [_spec("fast_loop", k_loop, SIG_MASK, {"BLOCK": 128}, {"X", "n"})]
    _fake_kernels(monkeypatch, [_spec("secure_select", k_select, SEL_SIG, {"BLOCK": 128}, {"X"})], fast)
    out = tmp_path / "sass.json"
    assert sass.main(["--json", str(out), "--include-fast"]) == 0  # fast findings are not fatal
    doc = json.loads(out.read_text())
    assert doc["ok"] is True and len(doc["secure"]) == 1 and doc["secure"][0]["ok"]
    assert doc["fast"][0]["violation_counts"].get("branch")
    assert "PASS" in capsys.readouterr().out

    _fake_kernels(monkeypatch, [_spec("secure_gather", k_gather,
                                      {"IDX": "*i32", "T": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"},
                                      {"BLOCK": 128}, {"IDX"})], [])
    assert sass.main([]) == 1
    assert "FAIL" in capsys.readouterr().out

    _fake_kernels(monkeypatch, [], [])
    assert sass.main([]) == 1  # an empty gate does not pass


def test_cli_wiring_as_subcommand(monkeypatch):
    import argparse

    _fake_kernels(monkeypatch, [_spec("secure_select", k_select, SEL_SIG, {"BLOCK": 128}, {"X"})], [])
    parser = argparse.ArgumentParser(prog="flashcore")
    sub = parser.add_subparsers(dest="cmd")
    p = sub.add_parser("sass")
    sass.add_arguments(p)
    p.set_defaults(func=sass.run)
    args = parser.parse_args(["sass", "--include-fast"])
    assert args.func(args) == 0


# ---------------------------------------------------------------------------------------------
# --reuse REPORT: a committed clean analysis taken for the same machine code (memo.py: every non-debug section)


GATHER_SIG = {"IDX": "*i32", "T": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"}


def _first_run(monkeypatch, tmp_path):
    """A report with one clean secure kernel and one fast kernel with findings, written with analysis keys."""
    _fake_kernels(monkeypatch, [_spec("secure_select", k_select, SEL_SIG, {"BLOCK": 128}, {"X"})],
                  [_spec("fast_gather", k_gather, GATHER_SIG, {"BLOCK": 128}, {"IDX"})])
    path = tmp_path / "first.json"
    assert sass.main(["--json", str(path), "--include-fast", "--jobs", "1", "--no-progress"]) == 0
    return path


def _count_disassembly(monkeypatch):
    from flashcore.audit.sass import analyze

    listed = []
    real = analyze.disassemble

    def counted(cubin):
        listed.append(len(cubin))
        return real(cubin)

    monkeypatch.setattr(analyze, "disassemble", counted)
    return listed


def test_reuse_takes_the_clean_analysis_and_analyses_the_rest(monkeypatch, tmp_path, capsys):
    first = _first_run(monkeypatch, tmp_path)
    doc = json.loads(first.read_text())
    assert doc["secure"][0]["analysis_key"] and doc["fast"][0]["analysis_key"]
    listed = _count_disassembly(monkeypatch)
    again = tmp_path / "again.json"
    assert sass.main(["--json", str(again), "--include-fast", "--jobs", "1", "--no-progress",
                      "--reuse", str(first)]) == 0
    new = json.loads(again.read_text())
    assert new["secure"][0]["reused"] is True and new["fast"][0]["reused"] is False
    assert len(listed) == 1  # only the kernel with findings was disassembled and analysed again
    for field in ("ok", "n_instructions", "n_blocks", "tainted_registers", "tainted_memory", "params", "notes",
                  "analysis_key", "secret"):
        assert new["secure"][0][field] == doc["secure"][0][field], field
    assert new["fast"][0]["violation_counts"] == doc["fast"][0]["violation_counts"]
    assert "1 analyses reused" in capsys.readouterr().out


def test_reuse_misses_when_an_input_of_the_analysis_changes(monkeypatch, tmp_path):
    from flashcore.audit.sass import memo

    first = _first_run(monkeypatch, tmp_path)
    key = json.loads(first.read_text())["secure"][0]["analysis_key"]
    listed = _count_disassembly(monkeypatch)
    # another secret set: the same bytes, a different question
    _fake_kernels(monkeypatch, [_spec("secure_select", k_select, SEL_SIG, {"BLOCK": 128}, {"X", "Y"})], [])
    assert sass.main(["--jobs", "1", "--no-progress", "--reuse", str(first)]) == 0
    assert len(listed) == 1
    # another analyser (its sources or nvdisasm): nothing is taken
    _fake_kernels(monkeypatch, [_spec("secure_select", k_select, SEL_SIG, {"BLOCK": 128}, {"X"})], [])
    monkeypatch.setattr(memo, "_FINGERPRINT", "0" * 64)
    assert sass.main(["--jobs", "1", "--no-progress", "--reuse", str(first)]) == 0
    assert len(listed) == 2
    monkeypatch.setattr(memo, "_FINGERPRINT", None)
    # other machine code, parameters or shared-memory split: other keys
    cubin = b"\x7fELF" + bytes(64)
    params = [("X", "pointer", "X"), ("Y", "pointer", "Y")]
    keys = {memo.analysis_key(cubin, "k", params, {"X"}, None),
            memo.analysis_key(cubin[:-1] + b"\x01", "k", params, {"X"}, None),
            memo.analysis_key(cubin, "k", params[::-1], {"X"}, None),
            memo.analysis_key(cubin, "k", params, {"X"}, 0x400),
            memo.analysis_key(cubin, "k2", params, {"X"}, None)}
    assert len(keys) == 5 and key not in keys


def test_analysis_keys_follow_the_code_not_the_debug_sections(monkeypatch):
    """A key hashes every section the analysis can read and none of the debug sections (source paths and line
    numbers: a kernel edit that moves another form's lines changes them, and nothing ``nvdisasm -c`` lists). A
    report keyed by the earlier whole-cubin scheme is still taken for the same bytes."""
    from flashcore.audit.sass import elf, memo

    cubin = compile_cubin(k_select, SEL_SIG, {"BLOCK": 128}).cubin
    secs = elf._sections(cubin)
    debug = [n for n, (_, size, typ) in secs.items() if "debug" in n and size and typ != 8]
    assert ".debug_line" in debug, sorted(secs)
    params = [("X", "pointer", "X"), ("Y", "pointer", "Y")]
    key = memo.analysis_key(cubin, "k_select", params, {"X"}, None)
    legacy = memo._LEGACY[key]  # the whole-cubin key of the same analysis

    def flipped(section):
        off, size, _ = secs[section]
        b = bytearray(cubin)
        b[off + size // 2] ^= 0xFF
        return bytes(b)

    for name in debug:
        assert memo.analysis_key(flipped(name), "k_select", params, {"X"}, None) == key, name
    assert disassemble(flipped(".debug_line")) == disassemble(cubin)
    text = next(n for n in secs if n.startswith(".text."))
    assert memo.analysis_key(flipped(text), "k_select", params, {"X"}, None) != key
    info = next(n for n in secs if n.startswith(".nv.info."))
    assert memo.analysis_key(flipped(info), "k_select", params, {"X"}, None) != key
    # a report of the whole-cubin scheme: taken for these bytes, not for others
    entry = dict(kernel="k_select", ok=True, violations=[], n_instructions=1, n_blocks=1, total_instructions=1,
                 iterations=1, tainted_registers=[], tainted_memory=[], unknown_opcodes={}, params=[], notes=[],
                 analysis_key=legacy, analysis_notes=0)
    memo.activate({legacy: entry})
    try:
        taken = memo.lookup(memo.analysis_key(flipped(".debug_line"), "k_select", params, {"X"}, None))
        assert taken is None  # other bytes (in a debug section): the whole-cubin key does not match
        taken = memo.lookup(memo.analysis_key(cubin, "k_select", params, {"X"}, None))
        assert taken is not None and taken.analysis_key == key and taken.reused
    finally:
        memo.activate(None)


def test_reuse_never_takes_a_report_with_findings(monkeypatch, tmp_path):
    from flashcore.audit.sass import memo

    _fake_kernels(monkeypatch, [_spec("secure_gather", k_gather, GATHER_SIG, {"BLOCK": 128}, {"IDX"})], [])
    first = tmp_path / "first.json"
    assert sass.main(["--json", str(first), "--jobs", "1", "--no-progress"]) == 1
    doc = json.loads(first.read_text())
    assert doc["secure"][0]["analysis_key"] and memo.load(str(first)) == {}
    # even a report edited to say "ok" is not taken while it lists violations
    doc["secure"][0]["ok"] = True
    first.write_text(json.dumps(doc))
    assert memo.load(str(first)) == {}
    assert sass.main(["--jobs", "1", "--no-progress", "--reuse", str(first)]) == 1


def test_verify_fails_the_gate_when_a_taken_analysis_differs(monkeypatch, tmp_path, capsys):
    first = _first_run(monkeypatch, tmp_path)
    doc = json.loads(first.read_text())
    doc["secure"][0]["tainted_registers"] = []  # a stored result that is not what the analysis gives
    first.write_text(json.dumps(doc))
    _fake_kernels(monkeypatch, [_spec("secure_select", k_select, SEL_SIG, {"BLOCK": 128}, {"X"})], [])
    out = tmp_path / "again.json"
    assert sass.main(["--json", str(out), "--jobs", "1", "--no-progress", "--reuse", str(first)]) == 0
    assert sass.main(["--json", str(out), "--jobs", "1", "--no-progress", "--reuse", str(first),
                      "--verify", "1"]) == 1
    res = capsys.readouterr()
    assert "tainted_registers" in res.err and "FAIL" in res.out
    assert json.loads(out.read_text())["verify_failures"] == ["secure_select: tainted_registers"]


def test_a_gzip_report_is_written_and_taken(monkeypatch, tmp_path):
    """The committed reports are gzip (``--json PATH.gz``; ~15 MB each as plain JSON, over the device tool's
    64 MiB for the whole tree): the same report, compressed, byte for byte the same each time, and taken by
    ``--reuse``."""
    import gzip

    from flashcore.audit.sass import memo

    _fake_kernels(monkeypatch, [_spec("secure_select", k_select, SEL_SIG, {"BLOCK": 128}, {"X"})], [])
    plain, packed = tmp_path / "r.json", tmp_path / "r.json.gz"
    assert sass.main(["--json", str(plain), "--jobs", "1", "--no-progress"]) == 0
    assert sass.main(["--json", str(packed), "--jobs", "1", "--no-progress"]) == 0
    doc, zdoc = json.loads(plain.read_text()), json.loads(gzip.decompress(packed.read_bytes()))
    assert zdoc["secure"][0]["analysis_key"] == doc["secure"][0]["analysis_key"]
    assert zdoc["analyser"] == memo.analyser_fingerprint()
    again = tmp_path / "again.json.gz"
    memo.write_report(str(again), zdoc)
    assert memo.read_report(str(again)) == zdoc
    memo.write_report(str(tmp_path / "twice.json.gz"), zdoc)
    assert (tmp_path / "twice.json.gz").read_bytes() == again.read_bytes()  # no timestamp in the header
    listed = _count_disassembly(monkeypatch)
    assert sass.main(["--jobs", "1", "--no-progress", "--reuse", str(packed)]) == 0
    assert listed == []  # taken from the gzip report, nothing disassembled


def test_the_fingerprint_covers_the_analysers_modules_and_not_the_command_line():
    """What decides an analysis is in the key (memo.ANALYSER_MODULES: every module of the package that the analysis
    imports), and the command line and the reuse layer are not, so an edit to ``cli.py`` does not send CI through
    every kernel again."""
    import ast
    import pathlib

    from flashcore.audit.sass import memo

    here = pathlib.Path(memo.__file__).parent

    def imports(name):
        tree = ast.parse((here / f"{name}.py").read_text())
        out = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                out |= {node.module} if node.module else {a.name for a in node.names}
        return out

    closure, todo = set(), ["analyze"]
    while todo:
        name = todo.pop()
        if name not in closure:
            closure.add(name)
            todo += sorted(imports(name) - {"memo"})
    assert closure == set(memo.ANALYSER_MODULES), closure ^ set(memo.ANALYSER_MODULES)
    assert not {"cli", "memo", "__init__", "__main__"} & set(memo.ANALYSER_MODULES)


def test_reuse_and_verify_arguments_are_checked(monkeypatch, tmp_path, capsys):
    _fake_kernels(monkeypatch, [_spec("secure_select", k_select, SEL_SIG, {"BLOCK": 128}, {"X"})], [])
    assert sass.main(["--no-progress", "--verify", "3"]) == 2
    assert "--verify" in capsys.readouterr().err
    assert sass.main(["--no-progress", "--reuse", str(tmp_path / "none.json")]) == 2
    assert "none.json: no such file" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# progress on stderr: plain lines when not a terminal (CI logs), a rich bar on one, none with --no-progress


def _three_selects(monkeypatch):
    # one compiled kernel (cached per process) under three names: a small subset, fast to audit
    _fake_kernels(monkeypatch, [_spec(f"secure_select_{i}", k_select, SEL_SIG, {"BLOCK": 128}, {"X"})
                                for i in range(3)], [])


def _progress_lines(err):
    return [ln for ln in err.splitlines() if ln.startswith("flashcore audit sass: secure:") and "kernels analysed" in ln]


def test_cli_progress_lines_when_not_a_terminal(monkeypatch, tmp_path, capsys):
    _three_selects(monkeypatch)
    assert sass.main(["--jobs", "1", "--progress-every", "2"]) == 0
    out, err = capsys.readouterr()
    lines = _progress_lines(err)
    assert [ln.split(": ")[2].split(" ")[0] for ln in lines] == ["2/3", "3/3"], err
    assert not _progress_lines(out)  # stdout keeps the table only

    assert sass.main(["--jobs", "1"]) == 0  # default: every 10 kernels, and the last one
    assert [ln.split(": ")[2].split(" ")[0] for ln in _progress_lines(capsys.readouterr().err)] == ["3/3"]


def test_cli_no_progress_removes_the_lines(monkeypatch, capsys):
    _three_selects(monkeypatch)
    assert sass.main(["--jobs", "1", "--progress-every", "1", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert not _progress_lines(err) and "kernels analysed" not in err + out
    assert "PASS" in out


def test_cli_progress_bar_on_a_terminal(monkeypatch, capsys):
    import io

    from rich.console import Console

    from flashcore.audit.sass import cli as sass_cli

    buf = io.StringIO()
    monkeypatch.setattr(sass_cli, "_stderr_console", lambda: Console(file=buf, force_terminal=True, width=120))
    _three_selects(monkeypatch)
    assert sass.main(["--jobs", "1", "--progress-every", "1"]) == 0
    assert "3/3" in buf.getvalue()  # rich's M/N column
    assert not _progress_lines(capsys.readouterr().err)  # no plain lines on a terminal


def test_cli_progress_every_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        sass.main(["--progress-every", "0"])
    assert "--progress-every must be a positive integer, got 0" in capsys.readouterr().err


def test_audit_kernels_progress_callback_counts_every_kernel():
    seen = []
    specs = [_spec(f"s{i}", k_select, SEL_SIG, {"BLOCK": 128}, {"X"}) for i in range(3)]
    reps = audit_kernels(specs, progress=lambda done, total, r: seen.append((done, total, r.name)))
    assert seen == [(1, 3, "s0"), (2, 3, "s1"), (3, 3, "s2")] and [r.name for r in reps] == ["s0", "s1", "s2"]
    seen.clear()  # worker processes: completion order, the caller's order kept in the result
    reps = audit_kernels(specs, jobs=2, progress=lambda done, total, r: seen.append((done, total, r.name)))
    assert [d for d, _, _ in seen] == [1, 2, 3] and sorted(n for _, _, n in seen) == ["s0", "s1", "s2"]
    assert [r.name for r in reps] == ["s0", "s1", "s2"] and all(r.ok for r in reps)


# a secret tile stored into the data area, then an mbarrier wait whose address is formed in a register from the
# shared window base, which a block other than the wait's defines (as warp_specialize's partitions do)
_WINDOW = """
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   S2R R0, SR_TID.X ;
        /*0030*/                   ISETP.GT.AND P0, PT, R0, 0x3, PT ;
        /*0040*/               @P0 BRA `({skip}) ;
        /*0050*/                   S2UR UR29, SR_CgaCtaId ;
        /*0060*/                   UMOV UR6, 0x400 ;
        /*0070*/                   ULEA UR29, UR29, UR6, 0x18 ;
        /*0080*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0090*/                   STS [UR29], R4 ;
        /*00a0*/                   BRA `(.L_x_0) ;
.L_x_0:
        /*00b0*/                   UIADD3 UR8, UR29, 0x100, URZ ;
        /*00c0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8], RZ ;
        /*00d0*/              @!P1 BRA `(.L_x_0) ;
.L_x_1:
        /*00e0*/                   EXIT ;
"""


def test_barrier_address_resolves_through_every_definition_that_reaches_it():
    # UR29 has two definitions (the CTA id, then the window base), neither in the entry block; the window base is
    # the only one that reaches the wait, so the wait is on the barrier at 0x100 (control area): public
    assert _at(_run_split(_WINDOW.format(skip=".L_x_1"), control_from=0x100), 0xD0) == set()
    # a path from the entry that reaches the wait without a definition: unresolved, any barrier, and it reads the
    # data area too (secret)
    assert _at(_run_split(_WINDOW.format(skip=".L_x_0"), control_from=0x100), 0xD0) == {"branch"}


# a 4-D TMA copy: the first operand is a register vector (a store's: shared address, then the 4 coordinates;
# a load's: shared address, mbarrier, then the 4 coordinates); the secret lands in register UR{reg}
_TMA4D = """
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   ULDC.64 UR18, c[0x0][0x218] ;
        /*0040*/                   UMOV UR8, 0x100 ;
        /*0050*/                   UMOV UR9, URZ ;
        /*0060*/                   UMOV UR10, URZ ;
        /*0070*/                   UMOV UR11, URZ ;
        /*0080*/                   UMOV UR12, URZ ;
        /*0090*/                   UMOV UR13, URZ ;
        /*00a0*/                   R2UR UR{reg}, R4 ;
        /*00b0*/                   {op}.4D [UR8], [UR18] ;
        /*00c0*/                   EXIT ;
"""


def test_tma_copy_reads_exactly_its_coordinate_registers():
    # a store's 4th (last) coordinate is UR12: secret there moves the store
    assert _at(_run(_TMA4D.format(reg=12, op="UTMASTG")), 0xB0) == {"address"}
    # UR13 is past a store's vector: not read (ptxas leaves a secret row count there in the secure Gluon kernel)
    assert _at(_run(_TMA4D.format(reg=13, op="UTMASTG")), 0xB0) == set()
    # a load's vector holds the mbarrier too: its 4th coordinate is UR13
    assert _at(_run(_TMA4D.format(reg=13, op="UTMALDG")), 0xB0) == {"address"}
    # UR14 is past a plain load's vector (ptxas puts a secret key length there in the instruction before a 4D load
    # in the secure chunked-prefill kernel); a copy with other modifiers keeps one register of margin
    assert _at(_run(_TMA4D.format(reg=14, op="UTMALDG")), 0xB0) == set()
    assert _at(_run(_TMA4D.format(reg=14, op="UTMALDG.MULTICAST")), 0xB0) == {"address"}
