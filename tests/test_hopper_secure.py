"""The constant-time warp-specialised Gluon kernel (kernels/hopper_secure.py): dispatch and
configuration on the CPU, its sm_90a machine code and static taint analysis (compiled here without a
GPU), and correctness, padding invariance and reproducibility on a GPU."""
import re
from dataclasses import replace

import pytest
import torch

from flashcore.kernels import configs, hopper_secure
from conftest import capture_cuda_graph, rel_err

BIG = dict(head_dim=128, dtype_bytes=2, causal=False, secure=True, seqlen_q=4096, seqlen_k=4096, batch_heads=128)


def test_the_secure_gluon_kernel_is_opt_in():
    """Measured no faster than the Triton kernel (docs/perf-notes.md v6): only the knob selects it."""
    for change in ({}, dict(causal=True), dict(head_dim=64)):
        assert configs.hopper(**dict(BIG, **change)).kernel == "triton", change
    assert configs.choose((8, 0), **BIG).kernel == "triton"


def test_secure_kernel_env(monkeypatch):
    monkeypatch.setenv(configs.SECURE_KERNEL_ENV, "triton")
    assert configs.choose((9, 0), **BIG).kernel == "triton"
    monkeypatch.setenv(configs.SECURE_KERNEL_ENV, "gluon_secure")
    small = dict(BIG, seqlen_q=64, seqlen_k=64)
    assert configs.choose((9, 0), **small).kernel == "gluon_secure"
    assert configs.choose((9, 0), **dict(small, secure=False)).kernel != "gluon_secure"  # fast path untouched
    monkeypatch.setenv(configs.SECURE_KERNEL_ENV, "fastest")
    with pytest.raises(ValueError, match=configs.SECURE_KERNEL_ENV):
        configs.choose((9, 0), **BIG)


def test_v_zeroing_knob_selects_the_triton_kernel(monkeypatch):
    """The Gluon kernel sanitises V in shared memory itself; the V-zeroing knob chooses between the
    Triton kernel's two variants, so setting it must pick the Triton kernel."""
    assert not configs.gluon_secure(128).v_prepass
    for mode, prepass in (("in_loop", False), ("prepass", True)):
        monkeypatch.setenv(configs.SECURE_V_ZEROING_ENV, mode)
        cfg = configs.choose((9, 0), **BIG)
        assert cfg.kernel == "triton" and cfg.v_prepass == prepass


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype)


_LAUNCH_KW = dict(scale=0.1, causal=True, secure_public_diag=True, seqlen_q=256, seqlen_k=256, batch=2,
                  num_heads_q=4, num_heads_kv=4, lse_strides=(4 * 256, 256))


def _launch(q, cfg):
    st = q.stride()[:3]
    return hopper_secure.SecureGluonLaunch(q, q, q, q, None, cfg=cfg, q_strides=st, k_strides=st, v_strides=st,
                                           o_strides=st, **_LAUNCH_KW)


def test_unsupported_configs_are_refused():
    q = _t(2, 4, 256, 128)
    for bad in (dict(block_m=64), dict(block_n=64), dict(num_warps=8), dict(num_stages=1), dict(num_stages=3)):
        with pytest.raises(ValueError, match="gluon_secure config"):
            _launch(q, replace(configs.gluon_secure(128), **bad))
    launch = _launch(q, configs.gluon_secure(128))
    assert launch.step.constexprs["PUBLIC_DIAG"] and launch.step.grid == (2, 8)


def test_planner_eligibility():
    from flashcore import kernels

    q = _t(2, 4, 256, 128)
    kw = dict(secure=True, cu_seqlens_q=None)
    cfg = configs.gluon_secure(128)
    assert kernels._gluon_eligible(cfg, q, q, q, q, (9, 0), kw)
    assert not kernels._gluon_eligible(cfg, q, q, q, q, (8, 0), kw)
    assert not kernels._gluon_eligible(cfg, q, q, q, q, None, kw)
    assert not kernels._gluon_eligible(cfg, q, q, q, q, (9, 0), dict(kw, secure=False))
    bad = _t(2, 4, 256, 129)[..., :128]  # a 258-byte row stride: not 16-byte aligned
    assert not kernels._gluon_eligible(cfg, q, bad, q, q, (9, 0), kw)
    assert not kernels._gluon_eligible(configs.gluon_ws(128), q, q, q, q, (9, 0), kw)  # fast kernel, secure call
    assert not kernels._gluon_eligible(cfg, _t(2, 4, 256, 96), _t(2, 4, 256, 96), _t(2, 4, 256, 96),
                                       _t(2, 4, 256, 96), (9, 0), kw)  # D=96
    assert not kernels._gluon_eligible(cfg, *(_t(2, 4, 256, 128, dtype=torch.float32),) * 4, (9, 0), kw)


def test_offsets_that_overflow_int32_are_not_eligible():
    """The producer computes in-head offsets in int32: a head whose rows span >= 2^31 elements must
    fall back (checked on a view with a huge row stride; no memory is touched)."""
    big = torch.empty_strided((1, 1, 9000, 128), (0, 0, 1 << 18, 1), dtype=torch.bfloat16, device="meta")
    q = _t(1, 1, 256, 128)
    assert hopper_secure.eligible(q, q, q, q, 128)
    assert not hopper_secure.eligible(q, big, q, q, 128)
    one = _t(1, 1, 1, 128)
    assert not hopper_secure.eligible(one, q, q, one, 128) and not hopper_secure.eligible(q, one, one, q, 128)


def _secure_specs():
    from flashcore import kernels

    return [s for s in kernels.audit_specs(True) if s["name"].startswith("secure_gluon")]


def test_audit_lists_the_secure_gluon_kernel_on_hopper_only():
    from flashcore import kernels

    names = [s["name"] for s in _secure_specs()]
    assert len(names) == 12 and len(set(names)) == 12
    assert {n.split("_")[3] for n in names} == {"d64", "d128"}
    assert not [s for s in kernels.audit_specs(True, arch=(8, 0)) if s["name"].startswith("secure_gluon")]
    assert not [s for s in kernels.audit_specs(False) if "gluon" in s["name"]]


@pytest.mark.parametrize("idx", [0, 9])  # d64 full s4096; d128 causal s1000 (GQA, masked tail loads)
def test_sm90a_machine_code_has_only_hardware_waits(idx):
    """No mbarrier (its wait is a software retry loop whose trip count follows timing): the hand-offs
    are named barriers (BAR.SYNC / BAR.ARV on ids 4-15) and cp.async waits (DEPBAR); P@V from
    registers; and ptxas kept the P@V wait after the exponentials (the overlap)."""
    from flashcore.audit.sass import compile_cubin, disassemble

    spec = _secure_specs()[idx]
    args = dict(num_warps=spec["num_warps"], num_stages=spec["num_stages"], attrs=spec["attrs"],
                maxnreg=spec["maxnreg"])
    sass = disassemble(compile_cubin(spec["fn"], spec["signature"], spec["constexprs"], **args).cubin)
    assert "SYNCS" not in sass and "TRYWAIT" not in sass
    assert "LDGSTS" in sass and "DEPBAR.LE SB0" in sass
    # instruction text without the offset comment and the predicate
    lines = [re.sub(r"^@!?U?P\w+\s+", "", ln.split("*/", 1)[-1].strip()) for ln in sass.splitlines() if "/*" in ln]
    # FULL barriers (256 threads: producer + one consumer warpgroup), EMPTY barriers (384: all)
    for op, count in (("BAR.ARV", "0x100"), ("BAR.ARV", "0x180"), ("BAR.SYNC.DEFER_BLOCKING R", "0x100"),
                      ("BAR.SYNC.DEFER_BLOCKING R", "0x180")):
        assert any(ln.startswith(op) and ln.endswith(f", {count} ;") for ln in lines), (op, count)
    hgmma = [ln for ln in lines if ln.startswith("HGMMA.")]
    assert any(ln.split(",")[1].strip().startswith("R") for ln in hgmma), "P@V from registers"
    # in each consumer's loop: S wait (gsb0 0x1), then the 64+ exponentials, then the P@V wait
    waits = [i for i, ln in enumerate(lines) if ln.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x1")]
    assert len(waits) == 2
    for w in waits:
        pv = next(i for i in range(w + 1, len(lines)) if lines[i].startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0"))
        assert sum(ln.startswith("MUFU.EX2") for ln in lines[w:pv]) >= 64


# --------------------------------------------------------------------------- GPU
needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                  reason="needs an sm_90 GPU")

CASES = [
    # B, Hq, Hkv, S_q, S_k, D, causal, query lengths ("self": = key lengths, "cross": their own)
    (3, 4, 4, 1000, 1000, 128, False, "self"),
    (3, 4, 4, 1000, 1000, 128, True, "self"),
    (3, 4, 4, 1000, 1000, 128, True, "cross"),
    (2, 8, 2, 513, 700, 128, True, "cross"),  # GQA, Sq != Sk
    (2, 4, 4, 1024, 1024, 64, False, "self"),
    (2, 4, 1, 300, 1500, 64, True, "cross"),  # MQA
    (1, 2, 2, 2, 2, 128, False, "self"),
]


def _secure_inputs(case, dtype, seed):
    B, Hq, Hkv, Sq, Sk, D, causal, lens_mode = case
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h, s: torch.randn(B, h, s, D, device="cuda", generator=g).to(dtype)
    q, k, v = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk)
    lens_k = torch.randint(0, Sk + 1, (B,), device="cuda", generator=g, dtype=torch.int32)
    lens_k[0] = Sk  # one full-length sequence
    if lens_mode == "self":
        return q, k, v, None, lens_k
    lens_q = torch.randint(0, Sq + 1, (B,), device="cuda", generator=g, dtype=torch.int32)
    return q, k, v, lens_q, lens_k


def _poison_padding(q, k, v, lens_q, lens_k, values=(float("nan"), float("inf"), float("nan"))):
    q, k, v = q.clone(), k.clone(), v.clone()
    for b in range(q.shape[0]):
        nq, nk = int(lens_q[b]), int(lens_k[b])
        q[b, :, nq:], k[b, :, nk:], v[b, :, nk:] = values
    return q, k, v


def _run(q, k, v, lens_q, lens_k, causal, cfg, lse=True):
    from flashcore import ops

    D = q.shape[-1]
    out = torch.full_like(q, float("nan"))
    call = ops.dense_call(q, k, v, lens_q, lens_k, causal, D ** -0.5, False, True, lse, out=out, config=cfg,
                          validate=False)
    assert type(call.plan.main).__name__ == "SecureGluonLaunch"
    _, lse_out = call(q, k, v, lens_q, lens_k, out)
    return out, lse_out


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_secure_gluon_matches_reference_and_ignores_padding(case, dtype):
    import flashcore

    causal, D = case[6], case[5]
    q, k, v, lens_q, lens_k = _secure_inputs(case, dtype, seed=hash(case) % 2**31)
    lq = lens_k if lens_q is None else lens_q
    cfg = configs.gluon_secure(D)
    out, lse = _run(q, k, v, lens_q, lens_k, causal, cfg)
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=causal, seqlens_q=lens_q, seqlens_k=lens_k,
                                                 return_lse=True)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < (1.2e-2 if dtype == torch.bfloat16 else 2e-3)
    seen = torch.isfinite(ref_lse)
    assert torch.allclose(lse[seen].double(), ref_lse[seen], atol=2e-3, rtol=1e-4)
    assert bool((lse[~seen] == float("-inf")).all())
    rows = torch.arange(q.shape[2], device="cuda")
    assert bool((out.transpose(1, 2)[rows[None, :] >= lq[:, None].long()] == 0).all()), "rows past the length"
    # Whatever the padding holds (NaN, Inf, other numbers), the output bytes are the same.
    for values in ((float("nan"), float("inf"), float("nan")), (1e4, -1e4, 3.0)):
        poisoned = _poison_padding(q, k, v, lq, lens_k, values)
        again, lse2 = _run(*poisoned, lens_q, lens_k, causal, cfg)
        assert torch.equal(again, out) and torch.equal(lse2, lse)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("D", [64, 128])
def test_secure_gluon_rings_wrap(D):
    """12 key tiles through two-slot rings: every slot and named barrier is reused six times."""
    import flashcore

    case = (2, 4, 4, 1500, 1500, D, True, "cross")
    q, k, v, lens_q, lens_k = _secure_inputs(case, torch.bfloat16, seed=41 + D)
    out, _ = _run(q, k, v, lens_q, lens_k, True, configs.gluon_secure(D))
    ref = flashcore.reference.attention(q, k, v, causal=True, seqlens_q=lens_q, seqlens_k=lens_k)
    assert rel_err(out, ref) < 1.2e-2


@pytest.mark.gpu
@needs_hopper
def test_secure_gluon_auto_dispatch_graph_and_bitwise_repeat():
    """A large bshd problem takes the Gluon kernel through the public API; a CUDA graph replays it
    bit for bit, and so do repeated eager calls."""
    import flashcore
    from flashcore import kernels

    B, H, S, D = 2, 16, 2048, 128
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", generator=g).bfloat16() for _ in range(3))
    lens = torch.tensor([2048, 1100], dtype=torch.int32, device="cuda")
    kernels._PLANS.clear()
    fn = lambda: flashcore.attention(q, k, v, causal=True, layout="bshd", secure=True, seqlens_k=lens,
                                     validate_seqlens=False)
    out = fn()
    assert any(p.cfg.kernel == "gluon_secure" for p in kernels._PLANS.values())
    ref = flashcore.reference.attention(q, k, v, causal=True, layout="bshd", seqlens_k=lens)
    assert rel_err(out, ref) < 1.2e-2
    for _ in range(3):
        assert torch.equal(fn(), out)
    graph, static_out = capture_cuda_graph(fn)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, out)


@pytest.mark.gpu
@needs_hopper
def test_misaligned_inputs_fall_back_to_the_triton_kernel():
    import flashcore
    from flashcore import kernels

    B, H, S, D = 2, 16, 2048, 128
    g = torch.Generator(device="cuda").manual_seed(9)
    q, v = (torch.randn(B, H, S, D, device="cuda", generator=g).bfloat16() for _ in range(2))
    k = torch.randn(B, H, S, D + 1, device="cuda", generator=g).bfloat16()[..., :D]  # row stride 258 bytes
    lens = torch.tensor([2048, 999], dtype=torch.int32, device="cuda")
    kernels._PLANS.clear()
    out = flashcore.attention(q, k, v, secure=True, seqlens_k=lens)
    assert [p.cfg.kernel for p in kernels._PLANS.values()] == ["triton"]
    assert rel_err(out, flashcore.reference.attention(q, k, v, seqlens_k=lens)) < 1.2e-2
