"""The constant-time Gluon kernel (kernels/hopper_secure.py): dispatch and configuration on the CPU,
its sm_90a machine code and static taint analysis (compiled here without a GPU), and correctness,
padding invariance and reproducibility on a GPU."""
from dataclasses import replace

import pytest
import torch

from flashcore.kernels import configs, hopper_secure
from conftest import capture_cuda_graph, rel_err

BIG = dict(head_dim=128, dtype_bytes=2, causal=False, secure=True, seqlen_q=4096, seqlen_k=4096, batch_heads=128)


def test_hopper_picks_the_secure_gluon_kernel_for_large_16bit_d64_d128():
    for change in ({}, dict(causal=True), dict(head_dim=64)):
        assert configs.hopper(**dict(BIG, **change)).kernel == "gluon_secure", change
    for change in (dict(dtype_bytes=4), dict(head_dim=96), dict(head_dim=256),
                   dict(seqlen_q=512, seqlen_k=512, batch_heads=8)):
        assert configs.hopper(**dict(BIG, **change)).kernel == "triton", change
    assert configs.hopper(**dict(BIG, secure=False)).kernel != "gluon_secure"
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


def test_in_loop_v_zeroing_knob_falls_back_to_the_triton_kernel(monkeypatch):
    """The Gluon kernel always reads the pre-pass's copy of V; forcing the in-loop select must
    therefore pick the Triton kernel, and the fallback table must keep honouring the knob."""
    monkeypatch.setenv(configs.SECURE_V_ZEROING_ENV, "in_loop")
    cfg = configs.choose((9, 0), **BIG)
    assert cfg.kernel == "triton" and not cfg.v_prepass
    monkeypatch.setenv(configs.SECURE_V_ZEROING_ENV, "prepass")
    small = dict(BIG, seqlen_q=64, seqlen_k=64, batch_heads=1)
    assert configs.triton_table((9, 0), **small).v_prepass
    assert configs.choose((9, 0), **BIG) == configs.gluon_secure(128)


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
    for bad in (dict(block_m=64), dict(block_n=256), dict(num_warps=4), dict(num_stages=1), dict(num_stages=3)):
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
    assert not kernels._gluon_eligible(replace(cfg, v_prepass=False), q, q, q, q, (9, 0), kw)
    bad = _t(2, 4, 256, 129)[..., :128]  # a 258-byte row stride: not 16-byte aligned
    assert not kernels._gluon_eligible(cfg, q, bad, q, q, (9, 0), kw)
    assert not kernels._gluon_eligible(configs.gluon_ws(128), q, q, q, q, (9, 0), kw)  # fast kernel, secure call


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
def test_sm90a_machine_code_has_only_hardware_waits_and_passes_the_taint_analysis(idx):
    """No mbarrier (its wait is a software retry loop whose trip count follows timing), cp.async
    loads, P@V from registers, no spills; and gate 1 finds no secret-dependent branch, address or
    predicate. Marking the public padded length secret must make the loop bound show up."""
    from flashcore.audit.sass import compile_cubin, disassemble, sass_taint

    spec = _secure_specs()[idx]
    args = dict(num_warps=spec["num_warps"], num_stages=spec["num_stages"], attrs=spec["attrs"])
    sass = disassemble(compile_cubin(spec["fn"], spec["signature"], spec["constexprs"], **args).cubin)
    assert "SYNCS" not in sass and "TRYWAIT" not in sass
    assert "LDGSTS" in sass and "DEPBAR" in sass
    hgmma = [ln for ln in sass.splitlines() if "HGMMA." in ln]
    assert any(" R" in ln.split("HGMMA.")[1].split(",")[1] for ln in hgmma), "P@V from registers"
    assert "STL" not in sass and "LDL" not in sass, "register spills"
    assert sass_taint(spec["fn"], spec["signature"], spec["constexprs"], spec["secret"], **args).ok
    leaky = sass_taint(spec["fn"], spec["signature"], spec["constexprs"], spec["secret"] | {"seqlen_k"}, **args)
    assert any(v.kind == "branch" for v in leaky.violations)


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
    (1, 2, 2, 1, 1, 128, False, "self"),
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
@pytest.mark.parametrize("stages", [2, 4])
def test_secure_gluon_rings_wrap(stages):
    """D=64 with 2 and 4 slots per ring over 12 key tiles: every slot is reused several times."""
    import flashcore

    case = (2, 4, 4, 1500, 1500, 64, True, "cross")
    q, k, v, lens_q, lens_k = _secure_inputs(case, torch.bfloat16, seed=41 + stages)
    out, _ = _run(q, k, v, lens_q, lens_k, True, replace(configs.gluon_secure(64), num_stages=stages))
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
