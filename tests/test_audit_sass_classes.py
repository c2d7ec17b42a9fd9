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

import sys

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


# ---------------------------------------------------------------------------------------------
# 5. a fourth review (2026-11-28): adversarial kernels per class, each found clean before its fix
# ---------------------------------------------------------------------------------------------


_STASH: dict = {}


class _Rules:
    def even(self, a):
        return a["n"] % 16 == 0


def _rule_through_a_traceback(a):
    try:
        raise ValueError
    except ValueError as e:
        frame = e.__traceback__.tb_frame
    return getattr(frame, "f_" + "back").f_locals["args"][2] % 16 == 0


def _launcher_rules():
    def body(X, Y, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        if EVEN:
            tl.store(Y + offs, tl.load(X + offs) + n)
        else:
            tl.store(Y + offs, tl.load(X + offs) - n)

    kj = triton.jit(body, do_not_specialize=["n"])

    def divisible(name, k):  # the argument's name in a closure cell
        return lambda args: args[name] % k == 0

    def reads_n(a):  # a helper the rule calls
        return a["n"] % 16 == 0

    rules = {
        "closure": divisible("n", 16),
        "default": lambda a, key="n": a[key] % 16 == 0,
        "helper": lambda a: reads_n(a),
        "generic": lambda a: all(v % 16 == 0 for v in a.values() if isinstance(v, int)),
        # the caller's frame: Heuristics.run's positional arguments, n among them
        "frame": lambda a: sys._getframe(1).f_locals["args"][2] % 16 == 0,
        "traceback": _rule_through_a_traceback,
        # state that a pre-run hook (or a Config.pre_hook) filled with the call's arguments: a global, a default
        "global state": lambda a: _STASH.get("n", 0) % 16 == 0,
        "default state": lambda a, s=_STASH: s.get("n", 0) % 16 == 0,
        "bound method": _Rules().even,  # its first parameter is self
    }
    heuristics = {k: triton.heuristics({"EVEN": r})(kj) for k, r in rules.items()}
    from triton.runtime.autotuner import Heuristics

    class OtherHeuristics(Heuristics):  # a subclass may run anything at launch
        pass

    heuristics["subclass"] = OtherHeuristics(kj, kj.arg_names, {"EVEN": lambda a: a["BLOCK"] > 64})
    public = triton.heuristics({"EVEN": lambda a: a.get("BLOCK") > 64 and a["BLOCK"] % 2 == 0})(kj)
    two = [triton.Config({"EVEN": True}), triton.Config({"EVEN": False})]

    def prune_by_n(configs, named_args, **kw):
        return [c for c in configs if c.kwargs["EVEN"] == (named_args["n"] % 16 == 0)]

    def prune_by_block(configs, named_args, **kw):
        return configs[:1] if named_args["BLOCK"] > 64 else configs

    tuned = {
        "prune": triton.autotune(configs=two, key=["BLOCK"], prune_configs_by={"early_config_prune": prune_by_n})(kj),
        "perf_model": triton.autotune(configs=two, key=["BLOCK"],
                                      prune_configs_by={"perf_model": lambda **kw: kw["n"] % 7, "top_k": 1})(kj),
        "timed": triton.autotune(configs=two, key=["BLOCK"])(kj),
    }
    one = triton.autotune(configs=two[:1], key=["BLOCK"], prune_configs_by={"early_config_prune": prune_by_block})(kj)
    return heuristics, public, tuned, one


def test_a_launcher_rule_is_read_off_its_bytecode():
    """What a heuristic or an autotuner's rule reads is read off its bytecode: a key in a closure cell or a default
    value, a helper the rule passes the arguments to, and a generic walk over them all read the secret; an autotuner
    with several configurations times them on the secret arguments themselves. Each of these was reported clean
    before (the rules' names were scanned, and only the autotuner's key)."""
    heuristics, public, tuned, one = _launcher_rules()
    sig = {"X": "*i32", "Y": "*i32", "n": "i32", "BLOCK": "constexpr", "EVEN": "constexpr"}
    ce = {"BLOCK": 128, "EVEN": True}
    for name, fn in list(heuristics.items()) + list(tuned.items()):
        rep = sass_taint(fn, sig, ce, {"n"})
        assert kinds(rep) == {"specialisation"}, (name, str(rep))
    assert sass_taint(public, sig, ce, {"n"}).ok  # constant keys of public arguments only
    assert sass_taint(one, sig, ce, {"n"}).ok  # one configuration, pruned by a public argument
    assert sass_taint(tuned["timed"], sig, ce, set()).ok  # nothing secret to time


def test_a_secret_scalar_declared_wider_than_i32_is_more_than_one_binary():
    """do_not_specialize keeps a value out of the launcher's key, not its type: below 2**31 an integer runs the i32
    binary, so a secret declared i64 (or u64) is not the only binary that runs."""
    for ty in ("i64", "u64"):
        rep = sass_taint(k_add_scalar_dns, dict(SIG_ADD, n=ty), {"BLOCK": 128}, {"n"})
        assert kinds(rep) == {"specialisation"} and "i32" in rep.violations[0].detail, str(rep)
    assert sass_taint(k_add_scalar_dns, SIG_ADD, {"BLOCK": 128}, {"n"}).ok


def _view_words():
    """A Gluon function viewing four mbarriers (``[4, 1]`` i64) as two rows of four int32 words (``reinterpret`` in
    Triton 3.9, ``_reinterpret`` in 3.6)."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def view_words(bars, layout: gl.constexpr):
        if hasattr(bars, "reinterpret"):
            return bars.reinterpret(gl.int32, [2, 1, 4], layout)
        else:
            return bars._reinterpret(gl.int32, [2, 1, 4], layout)

    return view_words


def _tma_into_barrier_kernel():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    nv = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    copy = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared

    view_words = _view_words()

    @gluon.jit
    def k_tma_into_barrier(Xd, Y, k, WHERE: gl.constexpr, LAYOUT: gl.constexpr):
        tile = gl.allocate_shared_memory(gl.int32, [2, 1, 4], LAYOUT)  # the data area, first
        bars = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for i in gl.static_range(4):
            mbarrier.init(bars.index(i), count=1)
        mbarrier.init(done, count=1)
        if WHERE == 0:  # the data tile
            dst = tile.index(0)
        elif WHERE == 1:  # barriers 0 and 1 seen as a row of int32, at a constant index
            dst = view_words(bars, LAYOUT).index(0)
        else:  # the same at a public index known only at run time
            dst = view_words(bars, LAYOUT).index(k)
        mbarrier.expect(done, 16)
        copy(Xd, [0, 0], done, dst)
        mbarrier.wait(done, 0)
        mbarrier.wait(bars.index(0), 0)  # returns at once or spins, by what the copy wrote
        mbarrier.expect(done, 16)
        copy(Xd, [1, 0], done, tile.index(1))  # the data tile is used in every form (it is the data area)
        mbarrier.wait(done, 1)
        L: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])
        r = gl.arange(0, 1, layout=gl.SliceLayout(1, L))
        c = gl.arange(0, 4, layout=gl.SliceLayout(0, L))
        gl.store(Y + r[:, None] * 4 + c[None, :], tile.index(1).load(L))

    return k_tma_into_barrier, nv


def test_a_tma_copy_into_mbarrier_words_makes_the_wait_leak():
    """An elected TMA copy's shared address is written under the elect predicate (``@UP0 UIADD3``) and read under
    another (``@UP6 UTMALDG``): it resolves now, to the barriers here; and a barrier allocation viewed as other data
    makes shared memory one area, since a register index into such a view may reach any barrier. Both forms were
    clean before (the copy was placed at its immediate, in the data area)."""
    fn, nv = _tma_into_barrier_kernel()
    sig = {"Xd": "tensordesc<i32[1, 4],NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2, "
                 "transposed=False, fp4_padded=False, cga_layout=[])>", "Y": "*i32", "k": "i32",
           "WHERE": "constexpr", "LAYOUT": "constexpr"}
    for where in (1, 2):
        rep = sass_taint(fn, sig, {"WHERE": where, "LAYOUT": nv}, {"Xd"})
        assert "branch" in kinds(rep), (where, str(rep))
        assert sass_taint(fn, sig, {"WHERE": where, "LAYOUT": nv}, set()).ok
    assert sass_taint(fn, sig, {"WHERE": 0, "LAYOUT": nv}, {"Xd"}).ok  # a secret tile in the data area


from triton.language.extra.cuda import gdc_launch_dependents  # noqa: E402


@triton.jit
def k_pdl_trigger(X, Y, BLOCK: tl.constexpr, GUARDED: tl.constexpr):
    s = tl.load(X)
    if GUARDED:
        if s == 7:
            gdc_launch_dependents()
    else:
        gdc_launch_dependents()
    tl.store(Y + tl.arange(0, BLOCK), tl.load(X + tl.arange(0, BLOCK)))


def test_a_dependent_launch_triggered_under_a_secret_is_a_violation():
    """``griddepcontrol.launch_dependents`` (``PREEXIT``) lets the next kernel start: under a secret predicate, when it
    starts follows the secret (it was an unknown opcode, whose guard went unchecked)."""
    sig = {"X": "*i32", "Y": "*i32", "BLOCK": "constexpr", "GUARDED": "constexpr"}
    assert "PREEXIT" in _ops(k_pdl_trigger, sig, {"BLOCK": 128, "GUARDED": True})
    rep = sass_taint(k_pdl_trigger, sig, {"BLOCK": 128, "GUARDED": True}, {"X"})
    assert not rep.ok and any(v.opcode == "PREEXIT" for v in rep.violations), str(rep)
    assert sass_taint(k_pdl_trigger, sig, {"BLOCK": 128, "GUARDED": False}, {"X"}).ok


def test_an_unmodelled_opcode_under_a_secret_guard_is_a_violation():
    """An opcode the tables do not know: what it does beside its data flow is not modelled, so a secret guard (it
    runs or not) or a secret operand is reported."""
    body = """
        /*0000*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   ISETP.NE.AND P0, PT, R4, 0x7, PT ;
        /*0040*/              {op} ;
        /*0050*/                   EXIT ;
"""
    assert _at(_run(body.format(op="@!P0 FOOBAR R6, R0")), 0x40) == {"branch"}
    assert _at(_run(body.format(op="FOOBAR R6, R4")), 0x40) == {"timing"}
    assert _at(_run(body.format(op="FOOBAR R6, R0")), 0x40) == set()


@triton.jit
def k_cache_policy(X, T, Y, BLOCK: tl.constexpr, SECRET_POLICY: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    s = tl.load(X)
    if SECRET_POLICY:  # evict-last or evict-first, by the secret
        pol = tl.where(s > 0, 0x14F0000000000000, 0x12F0000000000000).to(tl.int64)
    else:
        pol = tl.full([], 0x12F0000000000000, tl.int64)
    # the L2 policy of a load at a public address
    v = tl.inline_asm_elementwise("ld.global.L2::cache_hint.b32 $0, [$1], $2;", "=r,l,l", [T + offs, pol],
                                  dtype=tl.int32, is_pure=False, pack=1)
    tl.store(Y + offs, v + s)


def test_a_load_whose_cache_policy_follows_a_secret_is_a_secret_address():
    """A global access's ``desc[URx]`` is a 64-bit pair that holds its L2 policy among others: both registers are
    address operands (only URx was read)."""
    sig = {"X": "*i32", "T": "*i32", "Y": "*i32", "BLOCK": "constexpr", "SECRET_POLICY": "constexpr"}
    rep = sass_taint(k_cache_policy, sig, {"BLOCK": 128, "SECRET_POLICY": True}, {"X"})
    assert kinds(rep) == {"address"}, str(rep)
    assert sass_taint(k_cache_policy, sig, {"BLOCK": 128, "SECRET_POLICY": False}, {"X"}).ok


@triton.jit
def k_pointer_table(X, PT, Y, T, O, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(PT)  # X's address, written by the host into a 64-bit integer table
    p = Y + (a - Y.to(tl.int64)) // 4  # rebased onto Y: it points into X
    s = tl.load(p + offs)  # X's data
    tl.store(O + offs, tl.load(T + (s & 255)))  # ... as an index


def test_a_table_of_64_bit_integers_may_hold_addresses():
    """A ``*i64``/``*u64`` argument is read like a ``**T``: its values may be addresses, so a pointer rebased onto a
    public argument through it is not taken for that argument (X's data was read as Y's, and its use as an index
    missed)."""
    sig = {"X": "*i32", "PT": "*i64", "Y": "*i32", "T": "*i32", "O": "*i32", "BLOCK": "constexpr"}
    rep = sass_taint(k_pointer_table, sig, {"BLOCK": 128}, {"X"})
    assert kinds(rep) == {"address"}, str(rep)
    assert sass_taint(k_pointer_table, sig, {"BLOCK": 128}, set()).ok


_GUARDED_COPY = """
        /*0000*/                   S2UR UR4, SR_CgaCtaId ;
        /*0010*/                   UMOV UR5, 0x400 ;
        /*0020*/                   ULEA UR8, UR4, UR5, 0x18 ;
        /*0030*/                   MOV R9, UR8 ;
        /*0040*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0050*/                   ULDC.64 UR6, c[0x0][0x208] ;
        /*0060*/                   S2R R0, SR_TID.X ;
        /*0070*/                   ISETP.NE.AND P1, PT, R0, RZ, PT ;
        /*0080*/              @!P1 IADD3 R5, R9, {offset}, RZ ;
        /*0090*/              @!P1 LDGSTS.E [R5], desc[UR6][R2.64] ;
        /*00a0*/                   LDGDEPBAR ;
        /*00b0*/                   DEPBAR.LE SB0, 0x0 ;
        /*00c0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_0:
        /*00d0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [URZ+0x8000], RZ ;
        /*00e0*/              @!P0 BRA `(.L_x_0) ;
        /*00f0*/                   EXIT ;
"""


def test_a_copy_address_written_under_a_guard_resolves():
    """A shared address written under a predicate (``@!P1 IADD3 R5, ...``, the copy under the same one) is that value
    where the register had none before: the secret copy lands in the control area here, so the wait on it leaks (it
    was unresolved and placed at its immediate, 0, in the data area)."""
    rep = _run(_GUARDED_COPY.format(offset="0x8000"))
    assert _at(rep, 0xE0) == {"branch"}, str(rep)
    assert _at(_run(_GUARDED_COPY.format(offset="0x100")), 0xE0) == set()


def _copy_into_barrier_kernel():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    cp_async = async_copy.async_load if hasattr(async_copy, "async_load") else async_copy.async_copy_global_to_shared

    @gluon.jit
    def k_copy_into_barrier(X, Y, k, INTO_BARRIER: gl.constexpr):
        L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        buf = gl.allocate_shared_memory(gl.int32, [64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        bars = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(4):
            mbarrier.init(bars.index(i), count=1)
        if INTO_BARRIER:  # an i64 word of barrier k (a public index known at run time): the copy's destination
            cp_async(bars.index(k), X + gl.arange(0, 1, layout=L))
        else:  # the same two words into the data buffer
            cp_async(buf.slice(0, 2), X.to(gl.pointer_type(gl.int32), bitcast=True) + gl.arange(0, 2, layout=L))
        async_copy.commit_group()
        async_copy.wait_group(0)
        mbarrier.wait(bars.index(0), 0)
        gl.store(Y + gl.arange(0, 64, layout=L), buf.load(L))

    return k_copy_into_barrier


def test_a_copy_whose_destination_is_a_barrier_makes_shared_memory_one_area():
    """A barrier's memory as a copy's destination (no reinterpretation: an i64 view of a barrier's own layout folds
    away), at a register index the analysis does not bound: shared memory is one area, and the wait leaks (it was
    placed at its immediate, in the data area)."""
    fn = _copy_into_barrier_kernel()
    sig = {"X": "*i64", "Y": "*i32", "k": "i32", "INTO_BARRIER": "constexpr"}
    rep = sass_taint(fn, sig, {"INTO_BARRIER": True}, {"X"})
    assert "branch" in kinds(rep) and any("viewed as other data" in n for n in rep.notes), str(rep)
    assert sass_taint(fn, sig, {"INTO_BARRIER": False}, {"X"}).ok


@triton.jit
def k_scalar_address(X, a, Y, T, O, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    p = Y + (a - Y.to(tl.int64)) // 4  # a: X's address, passed as a 64-bit integer; rebased onto Y
    s = tl.load(p + offs)  # X's data
    tl.store(O + offs, tl.load(T + (s & 255)))  # ... as an index


def test_a_64_bit_scalar_may_be_an_address():
    """A 64-bit integer argument may hold an address: a pointer rebased onto a public argument through it is not taken
    for that argument (it was, like the 64-bit table above)."""
    sig = {"X": "*i32", "a": "i64", "Y": "*i32", "T": "*i32", "O": "*i32", "BLOCK": "constexpr"}
    rep = sass_taint(k_scalar_address, sig, {"BLOCK": 128}, {"X"})
    assert kinds(rep) == {"address"}, str(rep)
    assert sass_taint(k_scalar_address, sig, {"BLOCK": 128}, set()).ok


# ---------------------------------------------------------------------------------------------
# 6. tuple arguments (2026-11-29): their elements mapped one by one, a secret tuple's integers held to the scalar rules
# ---------------------------------------------------------------------------------------------


@triton.jit
def k_tuple_copy(PTRS, N, BLOCK: tl.constexpr):
    x_ptr, y_ptr = PTRS[0], PTRS[1]
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)


@triton.jit
def k_tuple_gather(PTRS, N, BLOCK: tl.constexpr):
    x_ptr, y_ptr = PTRS[0], PTRS[1]
    offs = tl.arange(0, BLOCK)
    idx = tl.load(x_ptr + offs).to(tl.int32) & (BLOCK - 1)
    tl.store(y_ptr + offs, tl.load(x_ptr + idx))


@triton.jit(do_not_specialize=["LENS"])
def k_tuple_bound(PTRS, LENS, BLOCK: tl.constexpr):
    x_ptr, y_ptr = PTRS[0], PTRS[1]
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(LENS[1]):
        acc += tl.load(x_ptr + i * BLOCK + offs)
    tl.store(y_ptr + offs, acc)


@triton.jit
def k_tuple_bound_specialised(PTRS, LENS, BLOCK: tl.constexpr):
    x_ptr, y_ptr = PTRS[0], PTRS[1]
    tl.store(y_ptr + tl.arange(0, BLOCK), tl.load(x_ptr + tl.arange(0, BLOCK)) * LENS[0])


def test_a_tuple_of_pointers_is_mapped_element_by_element():
    """A tuple argument's elements are kernel parameters of their own: a secret tuple of pointers whose data is only
    copied is clean (every parameter was unmapped and secret before: a false finding), and its data as an address
    is still a violation."""
    sig = {"PTRS": ("*fp32", "*fp32"), "N": "i32", "BLOCK": "constexpr"}
    rep = sass_taint(k_tuple_copy, sig, {"BLOCK": 128}, {"PTRS"})
    assert rep.ok and not rep.notes, str(rep)
    rep = sass_taint(k_tuple_gather, sig, {"BLOCK": 128}, {"PTRS"})
    assert not rep.ok and rep.counts().get("address"), str(rep)


def test_a_secret_integer_inside_a_tuple_is_a_scalar():
    """A secret tuple's integer element: a loop bound taints the loop (as a secret scalar does), the launcher's
    specialisation of it is a violation unless the tuple is in do_not_specialize, and a 64-bit one is more than one
    binary; the same tuple public is clean."""
    sig = {"PTRS": ("*fp32", "*fp32"), "LENS": ("i32", "i32"), "BLOCK": "constexpr"}
    rep = sass_taint(k_tuple_bound, sig, {"BLOCK": 128}, {"LENS"})
    assert rep.counts().get("branch") and not rep.counts().get("specialisation"), str(rep)
    assert sass_taint(k_tuple_bound, sig, {"BLOCK": 128}, {"PTRS"}).ok
    wide = sass_taint(k_tuple_bound, {**sig, "LENS": ("i32", "i64")}, {"BLOCK": 128}, {"LENS"})
    assert [v.sass for v in wide.violations if v.kind == "specialisation"] == ["LENS[1]: i64"], str(wide)
    rep = sass_taint(k_tuple_bound_specialised, sig, {"BLOCK": 128}, {"LENS"})
    assert sorted(v.sass for v in rep.violations if v.kind == "specialisation") == ["LENS[0]: i32", "LENS[1]: i32"]


# ---------------------------------------------------------------------------------------------
# 7. warp_specialize's captures buffer is as large as its captures (2026-11-29), not open to the end of shared memory
# ---------------------------------------------------------------------------------------------


def _ws_store_kernel():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    nv = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)

    view_words = _view_words()

    @gluon.jit
    def reader(bars, ready, tile, Y):
        mbarrier.wait(ready, 0)
        mbarrier.wait(bars.index(0), 0)  # returns at once or spins, by what the writer left in the barrier
        L: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])
        r = gl.arange(0, 1, layout=gl.SliceLayout(1, L))
        c = gl.arange(0, 4, layout=gl.SliceLayout(0, L))
        gl.store(Y + r[:, None] * 4 + c[None, :], tile.index(1).load(L))

    @gluon.jit
    def writer(bars, ready, tile, X, WHERE: gl.constexpr, LAYOUT: gl.constexpr):
        R: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 1], [1, 0])
        r = gl.arange(0, 1, layout=gl.SliceLayout(1, R))
        c = gl.arange(0, 4, layout=gl.SliceLayout(0, R))
        x = gl.load(X + r[:, None] * 4 + c[None, :])
        if WHERE == 0:  # the secret into the data tile
            tile.index(1).store(x)
        else:  # the secret into the words of barriers 0 and 1
            view_words(bars, LAYOUT).index(0).store(x)
        mbarrier.arrive(ready, count=1)

    @gluon.jit
    def k_ws_store(X, Y, WHERE: gl.constexpr, LAYOUT: gl.constexpr):
        tile = gl.allocate_shared_memory(gl.int32, [2, 1, 4], LAYOUT)
        bars = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for i in gl.static_range(4):
            mbarrier.init(bars.index(i), count=1)
        mbarrier.init(ready, count=1)
        gl.warp_specialize([(reader, (bars, ready, tile, Y)), (writer, (bars, ready, tile, X, WHERE, LAYOUT))], [1],
                           [24])

    return k_ws_store, nv


def test_a_small_warp_specialised_kernel_keeps_its_data_area():
    """The captures buffer of ``warp_specialize`` holds the captures (Triton's own count: 8 bytes per pointer, 8 + 4
    per dimension per shared-memory descriptor, ...), so a secret stored into a data tile above it is data: clean
    (every shared write was in the control area before, and the kernel was reported); the secret stored into the
    barrier words is still a leak."""
    fn, nv = _ws_store_kernel()
    sig = {"X": "*i32", "Y": "*i32", "WHERE": "constexpr", "LAYOUT": "constexpr"}
    rep = sass_taint(fn, sig, {"WHERE": 0, "LAYOUT": nv}, {"X"})
    assert rep.ok, str(rep)
    rep = sass_taint(fn, sig, {"WHERE": 1, "LAYOUT": nv}, {"X"})
    assert "branch" in kinds(rep), str(rep)


# ---------------------------------------------------------------------------------------------
# the binary that runs, again: Triton's debug builds (a review's finding, 2026-12-01)
# ---------------------------------------------------------------------------------------------


def _assert_kernel(debug):
    @triton.jit(debug=debug)
    def k_assert(S, P, Y, BLOCK: tl.constexpr, LEAK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        s = tl.load(S + offs)
        v = s if LEAK else tl.load(P + offs)
        tl.device_assert(v < 1000, "big")  # a debug build keeps it: a branch on v
        tl.store(Y + offs, s)
    return k_assert


@triton.jit(debug=True)
def k_debug_arith(S, P, Y, BLOCK: tl.constexpr, LEAK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    s = tl.load(S + offs)
    v = s if LEAK else tl.load(P + offs)
    tl.store(Y + offs, (v * 3 + 7) ^ s)  # a debug build checks the multiply and add for overflow: branches on v


SIG_DEBUG = {"S": "*i32", "P": "*i32", "Y": "*i32", "BLOCK": "constexpr", "LEAK": "constexpr"}


@pytest.mark.parametrize("kernel", ["assert", "arith"])
def test_debug_builds_are_audited_as_launched(kernel):
    """A kernel marked ``debug=True`` launches a debug build (asserts kept, integer overflow checked): the gate
    audits that build, so a secret reaching an assert or a checked multiply is a branch; its public twin is clean."""
    fn = _assert_kernel(True) if kernel == "assert" else k_debug_arith
    rep = sass_taint(fn, SIG_DEBUG, {"BLOCK": 128, "LEAK": True}, {"S"})
    assert "branch" in kinds(rep), str(rep)
    assert "branch" not in kinds(sass_taint(fn, SIG_DEBUG, {"BLOCK": 128, "LEAK": False}, {"S"}))


def test_triton_debug_knob_makes_every_kernel_a_debug_build(monkeypatch):
    from triton import knobs

    fn = _assert_kernel(False)
    assert sass_taint(fn, SIG_DEBUG, {"BLOCK": 128, "LEAK": True}, {"S"}).ok  # a release build drops the assert
    monkeypatch.setattr(knobs.runtime, "debug", True)
    assert "branch" in kinds(sass_taint(fn, SIG_DEBUG, {"BLOCK": 128, "LEAK": True}, {"S"}))
