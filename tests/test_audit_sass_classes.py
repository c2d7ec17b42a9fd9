"""The static gate's leak classes beyond registers (issue 25, section 1), one known-answer kernel per case,
each checked in both directions (the leak is found; the safe twin is clean):

* the binary that runs: a secret scalar the launcher may specialise on, or a secret constexpr;
* control state in shared memory: a secret written into an mbarrier word makes the waits on it leak;
* addresses the hardware forms from memory: a TMA descriptor whose contents (base, shape, strides) depend
  on a secret, built on the device or passed from the host;
* precision: shared memory is split by the compiler's allocations and ordered by CTA-wide barriers, so a
  public value that shares shared memory with a secret one is not reported.
"""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from flashcore.audit.sass import ParamInfo, analyze_listing, compile_cubin, disassemble, sass_taint  # noqa: E402
from conftest import nvdisasm_missing  # noqa: E402
from flashcore.audit.sass.isa import parse_nvdisasm  # noqa: E402


_NO_NVDISASM = nvdisasm_missing()
pytestmark = [pytest.mark.skipif(_NO_NVDISASM is not None, reason=f"no nvdisasm: {_NO_NVDISASM}"),
              pytest.mark.fresh_process]


def kinds(rep) -> set[str]:
    return {v.kind for v in rep.violations}


def _ops(fn, sig, ce, **kw) -> list[str]:
    out = []
    for ln in disassemble(compile_cubin(fn, sig, ce, **kw).cubin).splitlines():
        if "*/" in ln:
            words = ln.split("*/", 1)[1].split()
            out.append(words[1] if words[0].startswith("@") and len(words) > 1 else words[0])
    return out


# ---------------------------------------------------------------------------------------------
# 1. the binary that runs: Triton's launcher specialises integer scalars by value
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_add_scalar(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs) + n)  # n is only data: no branch, no address


k_add_scalar_dns = triton.jit(k_add_scalar.fn, do_not_specialize=["n"])

SIG_ADD = {"X": "*i32", "Y": "*i32", "n": "i32", "BLOCK": "constexpr"}


def test_secret_integer_scalar_that_the_launcher_specialises_is_a_violation():
    rep = sass_taint(k_add_scalar, SIG_ADD, {"BLOCK": 128}, {"n"})
    assert kinds(rep) == {"specialisation"}, str(rep)
    v = rep.violations[0]
    assert "n" in v.sass and "do_not_specialize" in v.detail
    assert sass_taint(k_add_scalar, SIG_ADD, {"BLOCK": 128}, set()).ok


def test_do_not_specialize_makes_the_secret_scalar_one_binary():
    rep = sass_taint(k_add_scalar_dns, SIG_ADD, {"BLOCK": 128}, {"n"})
    assert rep.ok, str(rep)
    assert "global:Y" in rep.tainted_memory  # the secret still flows, as data


def test_secret_float_scalar_is_not_specialised():
    sig = dict(SIG_ADD, X="*fp32", Y="*fp32", n="fp32")
    assert sass_taint(k_add_scalar, sig, {"BLOCK": 128}, {"n"}).ok


def _heuristic_and_autotuned_kernels():
    def body(X, Y, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        if EVEN:
            tl.store(Y + offs, tl.load(X + offs))
        else:
            tl.store(Y + offs, tl.load(X + offs, mask=offs < n))

    kj = triton.jit(body, do_not_specialize=["n"])
    by_n = triton.heuristics({"EVEN": lambda a: a["n"] % a["BLOCK"] == 0})(kj)
    by_block = triton.heuristics({"EVEN": lambda a: a["BLOCK"] > 64})(kj)
    tuned = triton.autotune(configs=[triton.Config({}, num_warps=4), triton.Config({}, num_warps=8)], key=["n"])(kj)
    return by_n, by_block, tuned


def test_a_heuristic_or_autotune_key_that_reads_a_secret_chooses_the_binary():
    """triton.heuristics computes constexprs from the arguments, triton.autotune picks a configuration per value of its
    key: either reading a secret scalar chooses the machine code (found by a review, 2026-11-27: the wrappers were
    stripped unread)."""
    by_n, by_block, tuned = _heuristic_and_autotuned_kernels()
    sig = {"X": "*i32", "Y": "*i32", "n": "i32", "BLOCK": "constexpr", "EVEN": "constexpr"}
    ce = {"BLOCK": 128, "EVEN": True}
    for fn in (by_n, tuned):
        rep = sass_taint(fn, sig, ce, {"n"})
        assert kinds(rep) == {"specialisation"}, str(rep)
    assert sass_taint(by_block, sig, ce, {"n"}).ok  # a heuristic of public facts only
    assert sass_taint(by_n, sig, ce, {"X"}).ok  # n public


def test_secret_constexpr_selects_the_binary():
    rep = sass_taint(k_add_scalar, SIG_ADD, {"BLOCK": 128}, {"BLOCK"})
    assert kinds(rep) == {"specialisation"}, str(rep)
    assert "BLOCK" in rep.violations[0].sass


# ---------------------------------------------------------------------------------------------
# 2. control state in shared memory: mbarrier words
# ---------------------------------------------------------------------------------------------


def _barrier_kernel():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    # the barrier's memory seen as two int32 words: ``_reinterpret`` up to triton 3.8, ``reinterpret`` in 3.9
    if hasattr(gl.shared_memory_descriptor, "reinterpret"):
        @gluon.jit
        def as_words(bar):
            return bar.reinterpret(gl.int32, [2], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    else:
        @gluon.jit
        def as_words(bar):
            return bar._reinterpret(gl.int32, [2], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    # cp.async into shared memory: ``async_copy_global_to_shared`` up to triton 3.8, ``async_load`` in 3.9
    cp_async = async_copy.async_load if hasattr(async_copy, "async_load") else async_copy.async_copy_global_to_shared

    @gluon.jit
    def k_barrier_word(X, Y, POISON: gl.constexpr):
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        offs = gl.arange(0, 2, layout=gl.BlockedLayout([1], [32], [4], [0]))
        x = gl.load(X + offs)
        if POISON == 1:  # the barrier's memory, seen as two int32 words, receives the loaded values
            as_words(bar).store(x)
        if POISON == 2:  # the same by cp.async, straight from global memory
            cp_async(as_words(bar), X + offs)
            async_copy.commit_group()
            async_copy.wait_group(0)
        mbarrier.wait(bar, 0)
        gl.store(Y + offs, x)

    return k_barrier_word


def test_secret_stored_into_an_mbarrier_word_makes_its_wait_loop_leak():
    fn = _barrier_kernel()
    sig = {"X": "*i32", "Y": "*i32", "POISON": "constexpr"}
    bad = sass_taint(fn, sig, {"POISON": 1}, {"X"})
    assert "branch" in kinds(bad), str(bad)
    assert any(v.opcode == "BRA" and any("SYNCS" in t for t in v.trace) for v in bad.violations), str(bad)
    assert sass_taint(fn, sig, {"POISON": 1}, set()).ok
    assert sass_taint(fn, sig, {"POISON": 0}, {"X"}).ok  # the same wait, the barrier left alone


def test_secret_copied_into_an_mbarrier_word_by_cp_async_makes_its_wait_loop_leak():
    """cp.async (LDGSTS) writes at its destination's resolved offset: into the control area here (found by a review,
    2026-11-27: the copy was placed in the data area whatever its address)."""
    fn = _barrier_kernel()
    sig = {"X": "*i32", "Y": "*i32", "POISON": "constexpr"}
    bad = sass_taint(fn, sig, {"POISON": 2}, {"X"})
    assert "branch" in kinds(bad), str(bad)
    assert sass_taint(fn, sig, {"POISON": 2}, set()).ok


PARAMS = [
    ParamInfo(0, "X", 0x210, 8, "pointer", True),
    ParamInfo(1, "Y", 0x218, 8, "pointer", False),
    ParamInfo(2, "n", 0x220, 4, "scalar", False),
]

# a value stored into shared memory ({store}), then an mbarrier wait on the word at {wait}
_WAIT = """
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   S2R R0, SR_TID.X ;
        /*0040*/                   {store} ;
.L_x_0:
        /*0050*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [URZ+{wait}], RZ ;
        /*0060*/              @!P0 BRA `(.L_x_0) ;
        /*0070*/                   EXIT ;
"""


def _run(body: str, control_from=0x8000):
    return analyze_listing(parse_nvdisasm("k:\n" + body), PARAMS, "k", smem_control_from=control_from)


def _at(rep, off):
    return {v.kind for v in rep.violations if v.offset == off}


def test_wait_reads_the_control_area_it_names():
    # a secret tile in the data area: the wait on the control area is public
    assert _at(_run(_WAIT.format(store="STS [R0+0x100], R4", wait="0x8000")), 0x60) == set()
    # the secret written into the control area: the wait's predicate, and so its loop, depend on it
    rep = _run(_WAIT.format(store="STS [R0+0x8000], R4", wait="0x8000"))
    assert _at(rep, 0x60) == {"branch"} and "shared:control" in rep.tainted_memory
    # shared memory as one region (no layout): any secret in shared memory may be the barrier word
    assert _at(_run(_WAIT.format(store="STS [R0+0x100], R4", wait="0x8000"), None), 0x60) == {"branch"}
    # a public value stored into the control area is fine
    assert _at(_run(_WAIT.format(store="STS [R0+0x8000], R0", wait="0x8000")), 0x60) == set()


def test_barrier_operation_with_a_secret_operand_taints_the_barrier():
    # an arrive whose transaction count is secret: reported itself, and the later wait on that barrier leaks
    rep = _run(_WAIT.format(store="SYNCS.ARRIVE.TRANS64 RZ, [URZ+0x8000], R4", wait="0x8000"))
    assert _at(rep, 0x40) == {"timing"} and _at(rep, 0x60) == {"branch"}
    # a barrier elsewhere in the control area is a different word only if the layout says so: one control area
    assert _at(_run(_WAIT.format(store="SYNCS.ARRIVE.TRANS64 RZ, [URZ+0x8000], R0", wait="0x8000")), 0x60) == set()


# ---------------------------------------------------------------------------------------------
# 3. TMA descriptors: the address is formed from the descriptor's contents
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_hostdesc(Xd, Y, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    x = Xd.load([pid * BLOCK, 0])
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs[:, None] * 64 + tl.arange(0, 64)[None, :], x)


SIG_HOSTDESC = {"Xd": "tensordesc<fp16[64, 64]>", "Y": "*fp16", "BLOCK": "constexpr"}


@pytest.mark.parametrize("field", ["Xd.shape", "Xd.shape0", "Xd.shape1", "Xd.strides", "Xd.stride0", "Xd.desc"])
def test_host_descriptor_with_secret_contents_is_a_secret_address(field):
    rep = sass_taint(k_hostdesc, SIG_HOSTDESC, {"BLOCK": 64}, {field})
    assert "address" in kinds(rep), str(rep)
    assert any(v.opcode.startswith("UTMALDG") and "descriptor" in v.detail for v in rep.violations), str(rep)


def test_host_descriptor_with_secret_data_only_is_clean():
    rep = sass_taint(k_hostdesc, SIG_HOSTDESC, {"BLOCK": 64}, {"Xd"})
    assert rep.ok, str(rep)
    assert "global:Y" in rep.tainted_memory


def test_descriptor_field_names_are_checked():
    with pytest.raises(ValueError, match="Xd.bogus"):
        sass_taint(k_hostdesc, SIG_HOSTDESC, {"BLOCK": 64}, {"Xd.bogus"})
    with pytest.raises(ValueError, match="Y.shape"):
        sass_taint(k_hostdesc, SIG_HOSTDESC, {"BLOCK": 64}, {"Y.shape"})  # Y is a pointer, not a descriptor


@triton.jit
def k_devdesc(X, N, Y, n_arg, SOURCE: tl.constexpr, BLOCK: tl.constexpr):
    """A descriptor built on the device; SOURCE picks what its contents come from."""
    if SOURCE == "shape-loaded":
        rows = tl.load(N)
        d = tl.make_tensor_descriptor(X, shape=[rows, 64], strides=[64, 1], block_shape=[BLOCK, 64])
    elif SOURCE == "shape-scalar":
        d = tl.make_tensor_descriptor(X, shape=[n_arg, 64], strides=[64, 1], block_shape=[BLOCK, 64])
    elif SOURCE == "stride-loaded":
        d = tl.make_tensor_descriptor(X, shape=[4096, 64], strides=[tl.load(N) * 64, 1], block_shape=[BLOCK, 64])
    elif SOURCE == "base-loaded":
        d = tl.make_tensor_descriptor(X + tl.load(N) * 64, shape=[4096, 64], strides=[64, 1],
                                      block_shape=[BLOCK, 64])
    else:  # "public"
        d = tl.make_tensor_descriptor(X, shape=[4096, 64], strides=[64, 1], block_shape=[BLOCK, 64])
    x = d.load([tl.program_id(0) * BLOCK, 0])
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs[:, None] * 64 + tl.arange(0, 64)[None, :], x)


k_devdesc_dns = triton.jit(k_devdesc.fn, do_not_specialize=["n_arg"])
SIG_DEVDESC = {"X": "*fp16", "N": "*i32", "Y": "*fp16", "n_arg": "i32", "SOURCE": "constexpr", "BLOCK": "constexpr"}


@pytest.mark.parametrize("source,secret", [("shape-loaded", {"N"}), ("shape-scalar", {"n_arg"}),
                                           ("stride-loaded", {"N"}), ("base-loaded", {"N"})])
def test_device_descriptor_built_from_a_secret_is_a_secret_address(source, secret):
    ce = {"SOURCE": source, "BLOCK": 64}
    assert any(op.startswith("UTMALDG") for op in _ops(k_devdesc_dns, SIG_DEVDESC, ce))
    rep = sass_taint(k_devdesc_dns, SIG_DEVDESC, ce, secret)
    tma = [v for v in rep.violations if v.opcode.startswith("UTMALDG")]
    assert tma and all(v.kind == "address" for v in tma), str(rep)
    assert any("descriptor" in v.detail for v in tma), str(rep)
    assert sass_taint(k_devdesc_dns, SIG_DEVDESC, ce, set()).ok


@pytest.mark.parametrize("source", ["public", "shape-loaded"])
def test_device_descriptor_with_public_contents_over_secret_data_is_clean(source):
    # the descriptor is built before the secret tile arrives in shared memory (barrier-ordered): its words
    # are public even though the same shared memory later holds secret data
    ce = {"SOURCE": source, "BLOCK": 64}
    rep = sass_taint(k_devdesc_dns, SIG_DEVDESC, ce, {"X"})
    assert rep.ok, str(rep)
    assert "global:Y" in rep.tainted_memory


# ---------------------------------------------------------------------------------------------
# 4. precision: a public value beside a secret one in shared memory
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_two_reductions(X, IDX, T, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    top = tl.max(tl.load(IDX + offs), axis=0)  # public, reduced across warps through shared memory
    total = tl.sum(tl.load(X + offs), axis=0)  # secret, reduced afterwards through the same scratch words
    tl.store(Y, total + tl.load(T + (top & 255)))  # a public index: a public address


def test_public_reduction_beside_a_secret_one_is_not_a_leak():
    # The scratch words are reused: the barriers between the reductions order them, so the public maximum
    # read back never meets the secret partial sums. (The other order, secret first, is still reported:
    # the model keeps no per-address history, docs/security.md section 4.)
    sig = {"X": "*fp32", "IDX": "*i32", "T": "*fp32", "Y": "*fp32", "BLOCK": "constexpr"}
    ce = {"BLOCK": 1024}
    ops = _ops(k_two_reductions, sig, ce, num_warps=8)
    assert {"STS", "LDS", "BAR.SYNC.DEFER_BLOCKING"} <= set(ops)  # cross-warp reductions through shared memory
    rep = sass_taint(k_two_reductions, sig, ce, {"X"}, num_warps=8)
    assert rep.ok, str(rep)
    assert "address" in kinds(sass_taint(k_two_reductions, sig, ce, {"IDX"}, num_warps=8))
