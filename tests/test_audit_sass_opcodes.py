"""Static SASS taint audit: one known-answer kernel per opcode class, compiled for sm_90a on the CPU.

In each kernel the secret stays in registers from its load to the sink (no shared-memory round trip
that would taint everything after it whatever the opcode tables say), so each test depends on the
analyser's model of exactly one opcode class:

========================  ======================================  =========================
class                     kernel                                  expected
========================  ======================================  =========================
float compare (FSETP)     ``if x > 0.5`` on a loaded fp32         branch
integer compare (ISETP)   ``if x != 7`` on a loaded int32         branch
wgmma (HGMMA)             each product element picks an address   address, at every gather
conversion (I2F, F2I)     int -> float -> int picks an address    address
shuffle (SHFL)            a value from another lane (gather)      address
reduction (REDUX)         the warp's sum picks an address         address
select (SEL, FSEL)        ``tl.where`` on a secret predicate      nothing (data flow only)
IEEE div / sqrt           the slow path's call                    branch (approximate: none)
address arithmetic        ``T[(x * 7 + 3) & 1023]``               address
========================  ======================================  =========================

Each violation must be the right one: its kind, the instruction it is reported at, and a trace that
runs through the opcode class under test back to the secret load. The same kernel with no secret
argument is clean, and the analyser knows every opcode in it.
"""
from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from flashcore.audit.sass import compile_cubin, disassemble, sass_taint  # noqa: E402
from conftest import nvdisasm_missing  # noqa: E402


_NO_NVDISASM = nvdisasm_missing()
pytestmark = pytest.mark.skipif(_NO_NVDISASM is not None, reason=f"no nvdisasm: {_NO_NVDISASM}")


def _opcodes(fn, sig, ce, num_warps=4) -> list[str]:
    text = disassemble(compile_cubin(fn, sig, ce, num_warps=num_warps).cubin)
    ins = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", text)
    return ins


def _audit(fn, sig, ce, secret, num_warps=4, kind=None, at=None, through=None, source="secret pointer"):
    """Audit ``fn`` with ``secret`` and without; return the secret run's report. ``kind``: the one violation
    kind expected (None: no violation); ``at``: opcode prefix of every violating instruction; ``through``:
    regex an opcode on every violation's trace must match (the class under test); ``source``: what the
    trace ends at (the secret load; None: the trace may be cut short before it)."""
    pub = sass_taint(fn, sig, ce, set(), num_warps=num_warps)
    assert pub.ok, f"public inputs must be clean:\n{pub}"
    rep = sass_taint(fn, sig, ce, secret, num_warps=num_warps)
    assert not rep.unknown_opcodes and not pub.unknown_opcodes, rep.unknown_opcodes
    assert rep.n_instructions == pub.n_instructions > 0
    if kind is None:
        assert rep.ok, str(rep)
        return rep
    assert rep.violations and {v.kind for v in rep.violations} == {kind}, str(rep)
    for v in rep.violations:
        if at is not None:
            assert v.opcode.startswith(at), (v.opcode, v.sass)
        assert v.trace, v
        if source is not None:
            assert source in v.trace[-1], v.trace  # back to the secret
        if through is not None:
            assert any(re.search(rf"\*/ (?:@!?U?P\w+ )?(?:{through})", t) for t in v.trace), (through, v.trace)
    return rep


# ---------------------------------------------------------------------------------------------
# compares
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_float_compare_branch(X, Y):
    x = tl.load(X)
    if x > 0.5:
        tl.store(Y, x * 2.0)


@triton.jit
def k_int_compare_branch(X, Y):
    x = tl.load(X)
    if x != 7:
        tl.store(Y, x + 1)


def test_float_compare_drives_a_branch():
    sig = {"X": "*fp32", "Y": "*fp32"}
    assert any(op.startswith("FSETP") for op in _opcodes(k_float_compare_branch, sig, {}))
    _audit(k_float_compare_branch, sig, {}, {"X"}, kind="branch", at=("BRA", "EXIT"), through="FSETP")


def test_integer_compare_drives_a_branch():
    sig = {"X": "*i32", "Y": "*i32"}
    assert any(op.startswith("ISETP") for op in _opcodes(k_int_compare_branch, sig, {}))
    _audit(k_int_compare_branch, sig, {}, {"X"}, kind="branch", at=("BRA", "EXIT"), through="ISETP")


# ---------------------------------------------------------------------------------------------
# wgmma: the product stays in the accumulator's registers (Gluon: explicit layouts, no conversion)
# ---------------------------------------------------------------------------------------------


def _wgmma_kernel():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

    @gluon.jit
    def k_wgmma_gather(A, B, C, T, BLOCK: gl.constexpr):
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BLOCK, 16])
        smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, BLOCK], gl.float16)
        r = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, ld))
        c = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, ld))
        a = gl.allocate_shared_memory(gl.float16, [BLOCK, BLOCK], smem, gl.load(A + r[:, None] * BLOCK + c[None, :]))
        b = gl.allocate_shared_memory(gl.float16, [BLOCK, BLOCK], smem, gl.load(B + r[:, None] * BLOCK + c[None, :]))
        fence_async_shared()
        acc = warpgroup_mma(a, b, gl.zeros([BLOCK, BLOCK], gl.float32, layout=acc_layout))
        ro = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, acc_layout))
        co = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, acc_layout))
        # every element of the product picks an address, in the accumulator's own layout
        gl.store(C + ro[:, None] * BLOCK + co[None, :], gl.load(T + (acc.to(gl.int32) & 1023)))

    return k_wgmma_gather


def test_wgmma_result_drives_every_gather_address():
    fn = _wgmma_kernel()
    block = 64
    sig = {"A": "*fp16", "B": "*fp16", "C": "*fp32", "T": "*fp32", "BLOCK": "constexpr"}
    ce = {"BLOCK": block}
    ops = _opcodes(fn, sig, ce)
    assert any(op.startswith("HGMMA") for op in ops)
    assert not any(op.startswith(("LDS", "LDSM")) for op in ops)  # the product never goes through shared memory
    first_mma = next(i for i, op in enumerate(ops) if op.startswith("HGMMA"))
    gathers = [op for op in ops[first_mma:] if op.startswith("LDG")]
    assert len(gathers) == block * block // 128  # one per accumulator element of each of the 128 threads
    # A and B reach the tensor cores through shared memory only: the secret is in the descriptors' tiles
    rep = _audit(fn, sig, ce, {"A", "B"}, kind="address", at="LDG", through="HGMMA", source="shared memory")
    assert len(rep.violations) == len(gathers), f"{len(rep.violations)} of {len(gathers)} gathers flagged"
    assert "shared" in rep.tainted_memory


# ---------------------------------------------------------------------------------------------
# conversions, shuffles, reductions
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_convert_gather(X, T, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)  # int32
    f = x.to(tl.float32) * 0.37  # I2F
    tl.store(Y + offs, tl.load(T + (f.to(tl.int32) & 255)))  # F2I


@triton.jit
def k_shuffle_gather(X, I, T, Y, BLOCK: tl.constexpr, SECRET_LANE: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    if SECRET_LANE:
        lane = tl.load(I + offs) & (BLOCK - 1)
    else:
        lane = (offs + 5) % BLOCK
    y = tl.gather(x, lane, 0)  # one warp: a shuffle, the value comes from another lane
    tl.store(Y + offs, tl.load(T + (y & 255)))


@triton.jit
def k_reduce_gather(X, T, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    s = tl.sum(tl.load(X + offs), 0)  # one warp, int32: a warp reduction
    tl.store(Y, tl.load(T + (s & 255)))


def test_conversions_drive_an_address():
    sig = {"X": "*i32", "T": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"}
    ops = _opcodes(k_convert_gather, sig, {"BLOCK": 128})
    assert any(op.startswith("F2I") for op in ops) and any(op.startswith("I2F") for op in ops)
    rep = _audit(k_convert_gather, sig, {"BLOCK": 128}, {"X"}, kind="address", at="LDG", through="F2I")
    assert all(any(re.search(r"\*/ I2F", t) for t in v.trace) for v in rep.violations)


SIG_SHFL = {"X": "*i32", "I": "*i32", "T": "*fp32", "Y": "*fp32", "BLOCK": "constexpr", "SECRET_LANE": "constexpr"}


@pytest.mark.parametrize("secret_lane", [False, True])
def test_shuffle_result_drives_an_address(secret_lane):
    ce = {"BLOCK": 32, "SECRET_LANE": secret_lane}
    ops = _opcodes(k_shuffle_gather, SIG_SHFL, ce, num_warps=1)
    assert any(op.startswith("SHFL") for op in ops)
    # the data from another lane is secret; or the data is public and the lane it comes from is secret
    secret = {"I"} if secret_lane else {"X"}
    _audit(k_shuffle_gather, SIG_SHFL, ce, secret, num_warps=1, kind="address", at="LDG", through="SHFL")


def test_reduction_drives_an_address():
    sig = {"X": "*i32", "T": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"}
    assert any(op.startswith("REDUX") for op in _opcodes(k_reduce_gather, sig, {"BLOCK": 32}, num_warps=1))
    _audit(k_reduce_gather, sig, {"BLOCK": 32}, {"X"}, num_warps=1, kind="address", at="LDG", through="REDUX")


# ---------------------------------------------------------------------------------------------
# selects are data flow
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_int_select(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    tl.store(Y + offs, tl.where(x > 3, 11, 29) * offs)  # both arms public: only the predicate is secret


@triton.jit
def k_float_select(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    tl.store(Y + offs, tl.where(x > 0.5, 1.5, -3.25) * offs.to(tl.float32))


@pytest.mark.parametrize("fn,dtype,opcode", [(k_int_select, "*i32", "SEL"), (k_float_select, "*fp32", "FSEL")])
def test_select_on_a_secret_predicate_is_not_a_violation(fn, dtype, opcode):
    sig = {"X": dtype, "Y": dtype, "BLOCK": "constexpr"}
    ops = _opcodes(fn, sig, {"BLOCK": 128})
    assert opcode in {op.split(".")[0] for op in ops}, ops
    rep = _audit(fn, sig, {"BLOCK": 128}, {"X"}, kind=None)
    # the secret predicate's value did reach the output, through the select (both arms are public)
    assert "global:Y" in rep.tainted_memory, rep.tainted_memory


# ---------------------------------------------------------------------------------------------
# IEEE division / square root: a data-dependent slow path
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_div_sqrt(X, Y, Z, BLOCK: tl.constexpr, OP: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    y = tl.load(Y + offs)
    if OP == "div_rn":
        r = tl.div_rn(x, y)
    elif OP == "sqrt_rn":
        r = tl.sqrt_rn(x)
    elif OP == "fdiv":
        r = tl.fdiv(x, y, ieee_rounding=False)
    else:
        r = tl.sqrt(x)
    tl.store(Z + offs, r)


SIG_DIV = {"X": "*fp32", "Y": "*fp32", "Z": "*fp32", "BLOCK": "constexpr", "OP": "constexpr"}


@pytest.mark.parametrize("op,slow", [("div_rn", True), ("sqrt_rn", True), ("fdiv", False), ("sqrt", False)])
def test_ieee_division_and_sqrt_slow_paths(op, slow):
    ce = {"BLOCK": 128, "OP": op}
    ops = _opcodes(k_div_sqrt, SIG_DIV, ce)
    assert any(o.startswith("CALL") for o in ops) == slow, ops
    assert any(o.startswith("MUFU") for o in ops)
    if slow:
        rep = _audit(k_div_sqrt, SIG_DIV, ce, {"X"}, kind="branch", source=None)
        # the branch into the slow path: its predicate comes from the secret operand (a short trace)
        assert any(v.opcode == "BRA" and "secret pointer X" in v.trace[-1] for v in rep.violations), str(rep)
    else:
        _audit(k_div_sqrt, SIG_DIV, ce, {"X", "Y"}, kind=None)


# ---------------------------------------------------------------------------------------------
# a load whose address is computed from a secret
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_secret_address(X, T, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    tl.store(Y + offs, tl.load(T + ((x * 7 + 3) & 1023)))


def test_load_address_derived_from_a_secret():
    sig = {"X": "*i32", "T": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"}
    rep = _audit(k_secret_address, sig, {"BLOCK": 128}, {"X"}, kind="address", at="LDG", through="IMAD|IADD3|LEA")
    # the secret table behind a public index: data flows, no address depends on it
    clean = _audit(k_secret_address, sig, {"BLOCK": 128}, {"T"}, kind=None)
    assert "global:Y" in clean.tainted_memory and rep.violations
