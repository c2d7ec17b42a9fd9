"""The backward pass on the CPU: the Triton backward kernels under the interpreter (fp32 and fp16) against the
float64 reference's autograd, by relative error; ``gradcheck`` of the reference; the flags and errors.

Interpreter tests (``interp``) need TRITON_INTERPRET=1; the others run anywhere."""
import os
import re
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashcore
from flashcore import ops, reference
from flashcore.plan.backward import INTERPRETER, BwdConfig, backward_config, bwd_config_name, parse_bwd_config_name
from flashcore.launch.sm90_bwd import RS_DV_SPILLS
from flashcore.plan.tables import triton_minor

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
interp = pytest.mark.interp
TOL = {torch.float32: 1e-5, torch.float16: 3e-3}


def rel(a, b, floor=1e-300):
    """Relative error; ``floor`` bounds the denominator where the true gradient is (nearly) zero: with one visible
    key the softmax is constant and dq = dk = 0 exactly, which fp32 rounding cannot hit relative to itself."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(floor)).item()


def _dense_grads(q, k, v, do, dlse, **kw):
    """(out, dq, dk, dv) of flashcore's kernels; the lse's gradient is ``dlse`` (None: lse not used)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = flashcore.attention(q, k, v, backend="triton", return_lse=True, **kw)
    outs, grads = [out], [do]
    if dlse is not None:
        outs.append(lse.masked_fill(~torch.isfinite(lse), 0))
        grads.append(dlse)
    torch.autograd.backward(outs, grads)
    return out, q.grad, k.grad, v.grad


def _reference_grads(q, k, v, do, dlse, *, causal, layout="bhsd", scale=None):
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    out, lse = reference.attention(q, k, v, causal=causal, layout=layout, scale=scale, return_lse=True)
    outs, grads = [out], [do.double()]
    if dlse is not None:
        outs.append(lse.masked_fill(~torch.isfinite(lse), 0))
        grads.append(dlse.double())
    torch.autograd.backward(outs, grads)
    return out, q.grad, k.grad, v.grad


def _compare(got, ref, dtype, what=""):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        assert torch.isfinite(a).all(), f"{what} {name}: non-finite"
        assert rel(a, b) < TOL[dtype], f"{what} {name}: rel err {rel(a, b):.2e}"


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", [
    # B, Hq, Hkv, Sq, Sk, D, causal, layout
    (1, 2, 2, 37, 37, 32, False, "bhsd"),
    (2, 4, 2, 45, 61, 32, True, "bshd"),   # GQA, causal with Sq < Sk
    (1, 3, 1, 70, 29, 24, True, "bhsd"),   # MQA, Sq > Sk: the first 41 rows see no key
    (1, 2, 1, 33, 80, 40, False, "bshd"),  # a head dim that is not a power of two
    (1, 2, 2, 16, 16, 64, True, "bhsd"),
], ids=lambda s: "x".join(map(str, s[:6])) + ("c" if s[6] else "") + s[7])
def test_gradients_match_the_float64_reference(shape, dtype):
    B, Hq, Hkv, Sq, Sk, D, causal, layout = shape
    g = torch.Generator().manual_seed(hash(shape) % 2**31)
    mk = lambda H, S: (torch.randn(B, H, S, D, generator=g) if layout == "bhsd"  # noqa: E731
                       else torch.randn(B, S, H, D, generator=g)).to(dtype)
    q, k, v, do = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk), mk(Hq, Sq)
    dlse = torch.randn(B, Hq, Sq, generator=g)
    got = _dense_grads(q, k, v, do, dlse, causal=causal, layout=layout)
    ref = _reference_grads(q, k, v, do, dlse, causal=causal, layout=layout)
    _compare(got, ref, dtype)


@interp
def test_rows_that_see_no_key_get_zero_gradients():
    """Causal with Sq > Sk: the first Sq - Sk query rows see no key. Their output is 0 and lse -inf; their
    gradients are exactly zero (not NaN), and the keys get no contribution from them."""
    q, k, v, do = (torch.randn(1, 2, s, 32) for s in (50, 20, 20, 50))
    dlse = torch.randn(1, 2, 50)
    _, dq, dk, dv = _dense_grads(q, k, v, do, dlse, causal=True)
    assert torch.all(dq[:, :, :30] == 0)
    _, _, dk2, dv2 = _dense_grads(q[:, :, 30:], k, v, do[:, :, 30:], dlse[:, :, 30:], causal=True)
    torch.testing.assert_close(dk, dk2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dv, dv2, rtol=1e-5, atol=1e-6)


@interp
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(B=st.integers(1, 2), Hkv=st.integers(1, 2), G=st.integers(1, 3), Sq=st.integers(1, 70), Sk=st.integers(1, 70),
       D=st.sampled_from([8, 16, 24, 32, 48]), causal=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_random_shapes_match_the_reference(B, Hkv, G, Sq, Sk, D, causal, seed):
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(B, Hkv * G, Sq, D, generator=g) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Sk, D, generator=g) for _ in range(2))
    got = _dense_grads(q, k, v, do, None, causal=causal)
    ref = _reference_grads(q, k, v, do, None, causal=causal)
    floor = 0.1 * do.double().norm().item()  # Sq = Sk = 1: exact zeros against fp32 rounding of ~1e-7
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        assert torch.isfinite(a).all(), f"seed {seed} {name}: non-finite"
        assert rel(a, b, floor) < 1e-5, f"seed {seed} {name}: rel err {rel(a, b, floor):.2e}"


@interp
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_gradients_with_empty_sequences_and_unowned_rows(causal):
    g = torch.Generator().manual_seed(7 + causal)
    lq, lk = [5, 0, 37, 20, 3], [9, 0, 30, 41, 0]
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32)
    q, do = (torch.randn(sum(lq) + 3, 4, 32, generator=g) for _ in range(2))  # 3 rows no sequence owns
    k, v = (torch.randn(sum(lk) + 2, 2, 32, generator=g) for _ in range(2))  # and 2 unowned key rows
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, lse = flashcore.attention_varlen(qg, kg, vg, cq, ck, max(lq), max(lk), causal=causal, backend="triton",
                                          return_lse=True)
    dlse = torch.randn(lse.shape, generator=g)
    torch.autograd.backward([out, lse.masked_fill(~torch.isfinite(lse), 0)], [do, dlse])
    qd, kd, vd = (t.double().requires_grad_(True) for t in (q, k, v))
    o2, l2 = reference.attention_varlen(qd, kd, vd, cq, ck, max(lq), max(lk), causal=causal, scale=32 ** -0.5,
                                        return_lse=True)
    torch.autograd.backward([o2, l2.masked_fill(~torch.isfinite(l2), 0)], [do.double(), dlse.double()])
    for name, a, b in (("dq", qg.grad, qd.grad), ("dk", kg.grad, kd.grad), ("dv", vg.grad, vd.grad)):
        assert torch.isfinite(a).all()
        assert rel(a, b) < 1e-5, f"{name}: {rel(a, b):.2e}"
    assert torch.all(qg.grad[-3:] == 0) and torch.all(kg.grad[-2:] == 0) and torch.all(vg.grad[-2:] == 0)
    assert torch.all(qg.grad[cq[4]:cq[5]] == 0)  # the last sequence has queries but no keys


@interp
@pytest.mark.parametrize("atomic", [False, True], ids=["dq-kernel", "dq-atomic"])
@pytest.mark.parametrize("Sk", [61, 64])  # a key tail, and whole key tiles (EVEN_N: the masked loop not compiled)
def test_every_kernel_variant_agrees_with_the_reference(atomic, Sk):
    """Both dQ strategies (the atomic one is a config no table row chooses today), with and without a key tail,
    causal and not."""
    g = torch.Generator().manual_seed(21)
    q, do = (torch.randn(2, 4, 50, 32, generator=g) for _ in range(2))
    k, v = (torch.randn(2, 2, Sk, 32, generator=g) for _ in range(2))
    cfg = replace(INTERPRETER, atomic_dq=atomic)
    for causal in (False, True):
        out, lse = ops.attention_fwd_grad(q, k, v, causal, 32 ** -0.5, False, False)
        got = ops.dense_backward(do, q, k, v, out, lse, None, causal, 32 ** -0.5, False, False, config=cfg)
        ref = _reference_grads(q, k, v, do, None, causal=causal)
        for a, b in zip(got, ref[1:]):
            assert rel(a, b) < 1e-5


@interp
def test_a_strided_expanded_incoming_gradient():
    """``out.sum().backward()`` hands the backward an expanded gradient (all strides 0); strided inputs too."""
    base = torch.randn(1, 40, 3, 2, 32)  # a packed qkv projection: q/k/v are strided views of it
    qkv = base.clone().requires_grad_(True)
    q, k, v = qkv.unbind(2)
    flashcore.attention(q, k, v, causal=True, layout="bshd", backend="triton").sum().backward()
    ref = base.double().requires_grad_(True)
    qr, kr, vr = ref.unbind(2)
    reference.attention(qr, kr, vr, causal=True, layout="bshd").sum().backward()
    assert rel(qkv.grad, ref.grad) < 1e-5


def _assert_compiled_grads_are_eager(loss, inputs):
    """``loss(*inputs).backward()`` through torch.compile(fullgraph=True) (aot_eager) and eagerly: the same
    gradients, finite."""
    torch.compile(loss, fullgraph=True, backend="aot_eager")(*inputs).backward()
    got = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    loss(*inputs).backward()
    for a, t in zip(got, inputs):
        assert torch.isfinite(a).all() and rel(a, t.grad) < 1e-6


@interp
def test_compile_fullgraph_traces_forward_and_backward():
    q, k, v = (torch.randn(1, 2, 24, 32, requires_grad=True) for _ in range(3))

    def loss(q, k, v):
        return flashcore.attention(q, k, v, causal=True, backend="triton").square().sum()

    _assert_compiled_grads_are_eager(loss, (q, k, v))


@interp
def test_compile_fullgraph_traces_varlen_forward_and_backward():
    """attention_varlen under torch.compile(fullgraph=True): forward and backward traced through the custom ops
    (a zero-length sequence included), the gradients those of the eager call."""
    cu_q = torch.tensor([0, 7, 7, 19], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 14, 30], dtype=torch.int32)
    q = torch.randn(19, 4, 32, requires_grad=True)
    k, v = (torch.randn(30, 2, 32, requires_grad=True) for _ in range(2))

    def loss(q, k, v):
        out, lse = flashcore.attention_varlen(q, k, v, cu_q, cu_k, 12, 16, causal=True, backend="triton",
                                              return_lse=True)
        return out.square().sum() + lse.masked_fill(~torch.isfinite(lse), 0).sum()

    _assert_compiled_grads_are_eager(loss, (q, k, v))


def _directional_check(kernel_fn, reference_fn, inputs, do, *, seed, eps=1e-6, directions=3):
    """gradcheck's comparison for a kernel that cannot run in float64: the kernel's gradient of <do, f(x)> (fp32)
    against central finite differences of the float64 function along random directions u, <grad, u> against
    (L(x + eps u) - L(x - eps u)) / 2 eps. Returns the largest relative difference."""
    xs = [t.detach().clone().requires_grad_(True) for t in inputs]
    torch.autograd.backward(kernel_fn(*xs), do)
    grads = [x.grad.double() for x in xs]
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    for _ in range(directions):
        us = [torch.randn(x.shape, generator=g, dtype=torch.float64) for x in xs]

        def loss(sign):
            with torch.no_grad():
                return (reference_fn(*(x.detach().double() + sign * eps * u for x, u in zip(xs, us)))
                        * do.double()).sum().item()

        numerical = (loss(1) - loss(-1)) / (2 * eps)
        analytical = sum((gr * u).sum().item() for gr, u in zip(grads, us))
        worst = max(worst, abs(numerical - analytical) / max(abs(numerical), 1e-3))
    return worst


@interp
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_gradients_match_finite_differences_of_the_float64_function(causal):
    """gradcheck on the kernel path, as far as the interpreter allows (the kernels take no float64): the Triton
    backward's fp32 gradients along random directions against finite differences of the float64 attention. GQA,
    Sq != Sk (bottom-right causal), odd lengths."""
    g = torch.Generator().manual_seed(11 + causal)
    q = torch.randn(1, 4, 13, 16, generator=g)
    k, v = (torch.randn(1, 2, 21, 16, generator=g) for _ in range(2))
    do = torch.randn(1, 4, 13, 16, generator=g)
    worst = _directional_check(lambda q, k, v: flashcore.attention(q, k, v, causal=causal, backend="triton"),
                               lambda q, k, v: reference.attention(q, k, v, causal=causal), (q, k, v), do, seed=5)
    assert worst < 2e-4, worst


@interp
def test_varlen_kernel_gradients_match_finite_differences_of_the_float64_function():
    g = torch.Generator().manual_seed(12)
    cu_q = torch.tensor([0, 5, 5, 14], dtype=torch.int32)
    cu_k = torch.tensor([0, 8, 11, 24], dtype=torch.int32)
    q = torch.randn(14, 4, 16, generator=g)
    k, v = (torch.randn(24, 2, 16, generator=g) for _ in range(2))
    do = torch.randn(14, 4, 16, generator=g)
    worst = _directional_check(
        lambda q, k, v: flashcore.attention_varlen(q, k, v, cu_q, cu_k, 9, 13, causal=True, backend="triton"),
        lambda q, k, v: reference.attention_varlen(q, k, v, cu_q, cu_k, 9, 13, causal=True), (q, k, v), do, seed=6)
    assert worst < 2e-4, worst


@interp
def test_deterministic_gradients_are_bitwise_identical():
    q, k, v, do = (torch.randn(1, 4, 40, 32) for _ in range(4))
    runs = [_dense_grads(q, k, v, do, None, causal=True, deterministic=True) for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_the_reference_passes_gradcheck():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 1, 7, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(lambda q, k, v: reference.attention(q, k, v, causal=True), (q, k, v))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    qv = q[0].transpose(0, 1).detach().requires_grad_(True)
    kv, vv = (t[0, :, :5].transpose(0, 1).detach().requires_grad_(True) for t in (k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: reference.attention_varlen(q, k, v, cu, cu, 3, 3, causal=True, scale=0.3), (qv, kv, vv))


# -- flags and errors, on every backend ------------------------------------------------------------------------

BACKENDS = ["reference", "auto"] + (["triton"] if INTERP else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic_must_be_a_bool(backend):
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        flashcore.attention(q, q, q, deterministic=1, backend=backend)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        flashcore.attention_varlen(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1), cu, cu, 8, 8,
                                   deterministic="yes", backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic_is_checked_on_a_repeated_call_too(backend):
    """A repeat call replays the cached plan of an earlier one without the metadata checks: a bad ``deterministic``
    must still be refused, not answered from the plan that a valid call left."""
    q = torch.randn(1, 2, 8, 16, dtype=torch.float16 if backend == "triton" else torch.float32)
    flashcore.attention(q, q, q, backend=backend)
    flashcore.attention(q, q, q, deterministic=True, backend=backend)
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="deterministic must be a bool"):
            flashcore.attention(q, q, q, deterministic=bad, backend=backend)
    flashcore.plan_attention(q, q, q, deterministic=False, backend=backend)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        flashcore.plan_attention(q, q, q, deterministic=0, backend=backend)


def test_plan_attention_takes_the_same_arguments_as_attention():
    """plan_attention(...) promises attention()'s arguments: deterministic included, and checked the same way."""
    q = torch.randn(1, 2, 8, 16)
    assert flashcore.plan_attention(q, q, q, deterministic=True, backend="reference") is None
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        flashcore.plan_attention(q, q, q, deterministic=None, backend="reference")


@pytest.mark.parametrize("backend", BACKENDS)
def test_secure_with_gradients_is_refused_at_the_forward_call(backend):
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    lens = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="q requires grad, but secure=True is forward-only"):
        flashcore.attention(q, q.detach(), q.detach(), secure=True, seqlens_k=lens, backend=backend)
    with torch.no_grad():
        flashcore.attention(q, q.detach(), q.detach(), secure=True, seqlens_k=lens, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_with_gradients_is_refused_at_the_forward_call(backend):
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="q requires grad, but out= is given"):
        flashcore.attention(q, q.detach(), q.detach(), out=torch.empty(1, 2, 8, 16), backend=backend)


def test_kvcache_with_gradients_is_refused_on_every_backend():
    q = torch.randn(1, 1, 2, 16, requires_grad=True)
    cache = torch.randn(1, 8, 2, 16)
    for backend in BACKENDS:
        with pytest.raises(RuntimeError, match="q requires grad, but attention_with_kvcache is inference-only"):
            flashcore.attention_with_kvcache(q, cache, cache.clone(), cache_seqlens=4, backend=backend)


def test_reference_route_keeps_gradients_and_accepts_deterministic():
    q, k, v = (torch.randn(1, 2, 9, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    with pytest.raises(TypeError):  # float64 is refused as before: the reference is reached through fp32/16 inputs
        flashcore.attention(q, k, v, backend="reference")
    q, k, v = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    flashcore.attention(q, k, v, causal=True, deterministic=True, backend="reference").sum().backward()
    assert all(t.grad is not None for t in (q, k, v))


# -- the configuration table -----------------------------------------------------------------------------------

def test_config_names_round_trip_and_deterministic_never_uses_unordered_atomics():
    for cfg in (INTERPRETER, BwdConfig(64, 128, 8, 4, 128, 64, 8, 4, atomic_dq=True),
                BwdConfig(64, 128, 8, 4, 128, 64, 8, 4, atomic_dq=True, gluon_dkdv=(64, 128, 8, 2), ordered_dq=True)):
        assert parse_bwd_config_name(bwd_config_name(cfg)) == cfg
    with pytest.raises(ValueError, match="backward config name"):
        parse_bwd_config_name("64x128")
    for arch in (None, (9, 0), (8, 0)):
        for d in (64, 128, 256):
            for dt in ("fp16", "bf16", "fp32"):
                for causal in (False, True):
                    cfg = backward_config(arch, head_dim=d, dtype_name=dt, causal=causal, deterministic=True)
                    assert not cfg.atomic_dq or cfg.ordered_dq
                    assert not cfg.ordered_dq or (arch == (9, 0) and d == 128 and dt != "fp32")


def test_the_hopper_table_adds_dq_inside_the_gluon_kernel_at_d128_and_d64():
    """v33's rows: dQ inside the Gluon dK/dV kernel at D=128, bf16 and fp16, causal or not. v39's: at D=64 too, on
    the 128-query step, non-causal at every length and causal from WIDE_CAUSAL_MIN_SEQLEN queries (shorter causal
    problems keep the dQ kernel: the wide step lost 5-10% at 2048). D=256, fp32, other GPUs and deterministic=True
    keep the dQ kernel; deterministic D=64 its own 64-query Gluon form, not the wide step without dQ; deterministic
    D=128 the fused form with dQ added in a fixed order (v41), causal up to ORDERED_CAUSAL_MAX_SEQLEN queries."""
    from flashcore.plan.backward import GLUON_DKDV, ORDERED_CAUSAL_MAX_SEQLEN, WIDE_CAUSAL_MIN_SEQLEN, WIDE_D64

    def cfg(arch=(9, 0), **kw):
        return backward_config(arch, **(dict(head_dim=128, dtype_name="bf16", causal=True, deterministic=False) | kw))

    def fused(arch=(9, 0), **kw):
        return cfg(arch, **kw).atomic_dq

    assert fused() and fused(causal=False) and fused(dtype_name="fp16")
    assert not fused(head_dim=256) and not fused(dtype_name="fp32")
    assert not fused(arch=(8, 0)) and not fused(arch=None)
    for kw in (dict(causal=False), dict(causal=False, seqlen_q=65536), dict(causal=True, seqlen_q=4096),
               dict(causal=True, seqlen_q=ORDERED_CAUSAL_MAX_SEQLEN)):
        c = cfg(deterministic=True, **kw)
        assert c.atomic_dq and c.ordered_dq and c.gluon_dkdv == GLUON_DKDV[128], kw
    assert not fused(deterministic=True, causal=True, seqlen_q=ORDERED_CAUSAL_MAX_SEQLEN + 1)
    assert not cfg(deterministic=False).ordered_dq
    for kw in (dict(causal=False), dict(causal=False, seqlen_q=128), dict(causal=True, seqlen_q=WIDE_CAUSAL_MIN_SEQLEN),
               dict(causal=False, dtype_name="fp16")):
        c = cfg(head_dim=64, **kw)
        assert c.atomic_dq and c.gluon_dkdv == WIDE_D64, kw
    for kw in (dict(causal=True), dict(causal=True, seqlen_q=WIDE_CAUSAL_MIN_SEQLEN - 1),
               dict(causal=False, deterministic=True), dict(causal=True, seqlen_q=16384, deterministic=True)):
        c = cfg(head_dim=64, **kw)
        assert not c.atomic_dq and c.gluon_dkdv == GLUON_DKDV[64], kw
    assert not fused(head_dim=64, causal=False, arch=(8, 0)) and not fused(head_dim=32, causal=False)


def test_gqa_programs_follow_the_step():
    """The fused Gluon form with GQA: the 64-query step (D=128) runs a program per query head and adds dK/dV up in
    fp32 buffers; D=64's 128-query step a program per K/V head (v39: 3-10% faster there); without GQA neither splits.
    Built on CPU tensors (the launch builders need no GPU)."""
    from flashcore.launch.triton_bwd import BackwardLaunch
    from flashcore.plan.backward import WIDE_D64

    def split(D, Hq, Hkv, gluon):
        q, k = torch.randn(1, Hq, 256, D, dtype=torch.bfloat16), torch.randn(1, Hkv, 256, D, dtype=torch.bfloat16)
        lse = torch.zeros(1, Hq, 256)
        cfg = BwdConfig(32, 128, 4, 3, 64, 64, 4, 3, atomic_dq=True, gluon_dkdv=gluon)
        launch = BackwardLaunch(q, q, k, k, q, lse, has_dlse=False, as_view=lambda t: t, varlen=False, num_seqs=1,
                                seqlen_q=256, seqlen_k=256, scale=D ** -0.5, causal=True, config=cfg)
        assert launch.atomic and launch.hopper_dkdv is not None
        return launch.split

    assert split(128, 8, 2, (64, 128, 8, 2)) and not split(128, 8, 8, (64, 128, 8, 2))
    assert not split(64, 8, 2, WIDE_D64) and not split(64, 8, 8, WIDE_D64)


def test_deterministic_orders_the_fused_dq_without_gqa_only():
    """deterministic=True's fused form (dQ added in a fixed order, v41) runs where it is planned and has no GQA: its
    launch counts turns per (batch entry, query head, query tile). With GQA the fused form adds dK/dV up over the
    group in a varying order, so the dQ kernel runs instead (never the unordered reduce-add). Built on CPU tensors."""
    from flashcore.launch.triton_bwd import BackwardLaunch

    cfg = backward_config((9, 0), head_dim=128, dtype_name="bf16", causal=False, deterministic=True)
    assert cfg.ordered_dq

    def build(Hq, Hkv, S=300):
        q, k = torch.randn(2, Hq, S, 128, dtype=torch.bfloat16), torch.randn(2, Hkv, S, 128, dtype=torch.bfloat16)
        return BackwardLaunch(q, q, k, k, q, torch.zeros(2, Hq, S), has_dlse=False, as_view=lambda t: t,
                              varlen=False, num_seqs=2, seqlen_q=S, seqlen_k=S, scale=128 ** -0.5, causal=False,
                              config=cfg)

    mha = build(8, 8)
    assert mha.atomic and mha.ordered and not mha.split and mha.dq is None
    assert mha.hopper_dkdv.turns_size == 2 * 8 * 5  # 300 queries: five 64-query tiles
    assert mha.hopper_dkdv.step.constexprs["DQ_ORDERED"] and mha.hopper_dkdv.step.constexprs["DQ_WRITER"]
    gqa = build(8, 2)
    assert not gqa.atomic and not gqa.ordered and gqa.dq is not None and gqa.hopper_dkdv is not None
    assert not gqa.hopper_dkdv.step.constexprs["FUSED_DQ"]
    # only the form with two consumer warpgroups has the dQ-writer partition (one would wait forever at its barrier)
    from flashcore.launch.sm90_bwd import HopperDkdvLaunch, ordered_dq_serves

    assert ordered_dq_serves(64, 128, 8, 8)
    assert not ordered_dq_serves(64, 64, 8, 8) and not ordered_dq_serves(128, 128, 8, 8)
    q = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dq_ordered"):
        HopperDkdvLaunch(q, q, q, q, q, q, (1, 2, 256), seqlen_q=256, seqlen_k=256, scale=0.125, qk_scale=0.18,
                         causal=False, block_m=64, block_n=64, num_warps=4, stages=3,
                         dq_accum=torch.empty(q.shape, dtype=torch.float32), dq_ordered=True)


@pytest.mark.parametrize("causal", [False, True], ids=["d128-ordered", "d128-causal-ordered"])
def test_hopper_ordered_dq_machine_code(causal):
    """deterministic=True's fused form at D=128 (v41), compiled for sm_90a here: a dQ-writer warp waits for each
    query tile's turn with acquire loads (LDG.E.STRONG.GPU in a loop), adds the consumers' staged shares by the
    copy engine's reduce-add, one message per warpgroup (the 128-byte staging swizzle: the 32-byte one took eight,
    issued in a row by one thread, and ran 10-14% slower), and passes the turn on by a GPU-scope fence and an add
    (MEMBAR.ALL.GPU, then RED); the consumers hand their shares over by hardware named barriers of 160 threads
    (BAR.ARV / BAR.SYNC, 0xa0) and never wait on another program. The default form has none of these. A few scalars
    spill outside the loops (Triton 3.6: 5 / 11 non-causal, 3 / 12 causal); the bound fails if a tile does."""
    from conftest import gluon_bwd_sass

    sass = gluon_bwd_sass(128, causal, fused_dq=True, hkv=8, ordered_dq=True)
    lines = sass.splitlines()
    assert any("LDG.E.STRONG.GPU" in ln for ln in lines), "no acquire load of a turn counter"
    assert any("MEMBAR.ALL.GPU" in ln for ln in lines) and any("REDG.E.ADD.S32.STRONG.GPU" in ln for ln in lines)
    assert 0 < sum("UTMAREDG" in ln for ln in lines) <= 4, "dQ shares not one reduce message per warpgroup"
    for op in ("BAR.ARV", "BAR.SYNC.DEFER_BLOCKING"):
        assert sum(op in ln and ", 0xa0" in ln for ln in lines) >= 4, f"no {op} of 160 threads"
    hgmma = [ln.split("HGMMA.")[1] for ln in lines if "HGMMA." in ln]
    assert 0 < sum("gsb0" in h for h in hgmma) <= len(hgmma) // 4, "products serialised"
    assert sass.count("STL") <= 8 and sass.count("LDL") <= 16, (sass.count("STL"), sass.count("LDL"))
    default = gluon_bwd_sass(128, causal, fused_dq=True, hkv=8)
    assert "LDG.E.STRONG.GPU" not in default and "BAR.ARV" not in default


@interp
def test_a_gluon_form_that_cannot_serve_runs_the_dq_kernel_not_triton_atomics():
    """A configuration with a Gluon form and dQ inside it, on views the Gluon kernel cannot take (varlen here):
    the Triton dK/dV kernel runs with the dQ kernel after it (its per-thread atomics lost everywhere, v19), and the
    gradients match the reference."""
    from flashcore.launch.triton_bwd import BackwardLaunch

    built = []
    real_init = BackwardLaunch.__init__

    def spy(self, *a, **kw):
        real_init(self, *a, **kw)
        built.append(self)

    g = torch.Generator().manual_seed(9)
    cq = torch.tensor([0, 17, 57], dtype=torch.int32)
    ck = torch.tensor([0, 33, 54], dtype=torch.int32)
    q, do = (torch.randn(57, 2, 32, generator=g) for _ in range(2))
    k, v = (torch.randn(54, 2, 32, generator=g) for _ in range(2))
    cfg = replace(INTERPRETER, atomic_dq=True, gluon_dkdv=(64, 128, 8, 2))
    out, lse = ops.attention_varlen_fwd_grad(q, k, v, cq, ck, 40, 33, True, 32 ** -0.5, False)
    BackwardLaunch.__init__ = spy
    try:
        got = ops.varlen_backward(do, q, k, v, out, lse, None, cq, ck, 40, 33, True, 32 ** -0.5, False, config=cfg)
    finally:
        BackwardLaunch.__init__ = real_init
    assert len(built) == 1 and not built[0].atomic and built[0].dq is not None and built[0].hopper_dkdv is None
    qd, kd, vd = (t.double().requires_grad_(True) for t in (q, k, v))
    o2 = reference.attention_varlen(qd, kd, vd, cq, ck, 40, 33, causal=True, scale=32 ** -0.5)
    o2.backward(do.double())
    for name, a_, b_ in (("dq", got[0], qd.grad), ("dk", got[1], kd.grad), ("dv", got[2], vd.grad)):
        assert rel(a_, b_) < 1e-5, f"{name}: {rel(a_, b_):.2e}"


@interp
def test_a_repeat_backward_replays_its_cached_launch_on_new_tensors():
    """The second backward with the same metadata reuses the first one's launch (plan cache) with new pointers and
    still matches the reference: nothing of the first call's tensors is baked in."""
    from flashcore.launch.triton_bwd import BackwardLaunch
    from flashcore.plan.cache import PLANS

    def launches():
        return sum(isinstance(p, BackwardLaunch) for p in PLANS.plans())

    g = torch.Generator().manual_seed(5)
    shape = (1, 2, 37, 32)
    before = None
    for i in range(2):
        q, k, v, do = (torch.randn(shape, generator=g) for _ in range(4))
        got = _dense_grads(q, k, v, do, None, causal=True)
        ref = _reference_grads(q, k, v, do, None, causal=True)
        _compare(got, ref, torch.float32, f"call {i}")
        if before is None:
            before = launches()
    assert before >= 1 and launches() == before


@pytest.mark.parametrize("head_dim,causal,fused,hkv", [
    (128, False, False, 2), (128, True, False, 2), (64, False, False, 2), (64, True, False, 2),
    (128, False, True, 8), (128, True, True, 8), (128, False, True, 2), (128, True, True, 2)],
    ids=["d128", "d128-causal", "d64", "d64-causal", "d128-dq", "d128-causal-dq", "d128-dq-gqa", "d128-causal-dq-gqa"])
def test_hopper_dkdv_machine_code(head_dim, causal, fused, hkv):
    """The Hopper dK/dV kernel as the planner launches it, compiled for sm_90a here (no GPU): warp-specialised
    (register reallocation between partitions) and fed by TMA. D=64 (one consumer warpgroup) keeps P and dS in
    registers as the left operands of dV += P^T dO and dK += dS^T Q; D=128 (two) reads them from shared memory
    (v33: 4-6% faster there, 7-10% slower at D=64), except the non-causal fused-dQ form's P^T, dV's register operand
    where the toolchain fits it (v35; launch.sm90_bwd.RS_DV_SPILLS). No product is serialised (ptxas does that when
    the registers run short: every HGMMA then waits for the last, as with dS^T in registers too). No spills, except
    the causal fused-dQ forms': they add dQ by the copy engine's reduce-add (UTMAREDG, never per-thread atomics; with
    GQA, 8 query heads on 2 K/V heads here, dK/dV by per-thread atomics once per program) and spill a few scalars,
    never the tiles (STL / LDL, no GQA, GQA: Triton 3.6 2/2, 4/4; 3.9 9/22, 15/28): the bound below fails if the dQ
    accumulator (32 registers) or a tile spills. The non-causal fused forms spill nothing since v35's 32-byte dQ
    staging tile (9/9 and 8/8 on 3.6 before, 3/15 and 4/16 on 3.9)."""
    from conftest import gluon_bwd_sass

    sass = gluon_bwd_sass(head_dim, causal, fused_dq=fused, hkv=hkv)
    assert "USETMAXREG" in sass
    assert "UTMALDG" in sass
    hgmma = [ln.split("HGMMA.")[1] for ln in sass.splitlines() if "HGMMA." in ln]
    from_registers = [h for h in hgmma if h.split(",")[1].strip().startswith("R")]
    # a chain of HGMMAs waits once, at its last (gsb0); serialised, every one carries it
    assert 0 < sum("gsb0" in h for h in hgmma) <= len(hgmma) // 4, "products serialised"
    if head_dim == 64:
        assert from_registers and len(from_registers) < len(hgmma), "P and dS from registers, S^T and dP^T from shared"
    elif fused and not causal and triton_minor() not in RS_DV_SPILLS:
        # dV's four k-steps in each consumer's copy: 64x128 products whose left operand is P^T in registers
        assert len(from_registers) == 8 and all(h.startswith("64x128") for h in from_registers), from_registers
    else:
        assert hgmma and not from_registers, "every product's operands from shared memory"
    reductions = [ln for ln in sass.splitlines() if "RED" in ln and "REDUX" not in ln]
    if fused:
        tma = [ln for ln in reductions if "UTMAREDG" in ln]
        assert tma, "dQ by the copy engine's reduce-add"
        if hkv == 8:
            assert len(tma) == len(reductions), "dQ by the copy engine's reduce-add only"
        else:
            assert len(reductions) > len(tma), "dK/dV added up across the GQA group"
        if causal:
            assert sass.count("STL") <= 20 and sass.count("LDL") <= 32, (sass.count("STL"), sass.count("LDL"))
        else:
            assert "STL" not in sass and "LDL" not in sass, "register spills"
    else:
        assert not reductions
        assert "STL" not in sass and "LDL" not in sass, "register spills"


@pytest.mark.parametrize("causal", [False, True], ids=["d64-wide", "d64-wide-causal"])
def test_hopper_wide_d64_step_fits_its_registers(causal):
    """The fused-dQ form with 128-query steps at D=64 (FA4's step there; two consumer warpgroups of 64 keys,
    ``launch.sm90_bwd.WIDE_STEP``), compiled for sm_90a here: it fits 240 registers only with its three savings
    (perf-notes v38: without them it spills 215 words non-causal, 88 causal). dQ is split along the queries: each
    warpgroup's dQ product is 64x64 (the head dimension whole), not 64x32 halves of it. No product is serialised, dQ
    goes out by the copy engine's reduce-add, and at most a scalar or two spills (Triton 3.6: none; the bound fails
    if a tile or an accumulator spills; Triton 3.9's ptxas spills more causal: conftest.REGISTER_MISSES). The
    planner's D=64 row since v39 (plan.backward.WIDE_D64)."""
    from conftest import gluon_bwd_sass

    sass = gluon_bwd_sass(64, causal, form=(128, 128, 8, 2), fused_dq=True, hkv=8)
    hgmma = [ln.split("HGMMA.")[1] for ln in sass.splitlines() if "HGMMA." in ln]
    assert 0 < sum("gsb0" in h for h in hgmma) <= len(hgmma) // 4, "products serialised"
    # S^T and dP^T: 64x128 (128 queries); dQ: 64x64 per warpgroup and key block (both warpgroups' dS^T)
    assert any(h.startswith("64x128x16") for h in hgmma) and any(h.startswith("64x64x16") for h in hgmma)
    assert not any(h.startswith("64x32x16") for h in hgmma), "dQ split along the head dimension"
    assert "UTMAREDG" in sass
    # The exponentials' pipe (XU, a quarter of the FMA rate) carries the step's exponentials and nothing per
    # probability beside them: P^T is rounded to 16 bits two at a time (F2FP), not one by one (F2F, XU: v39 measured
    # 34.8 M XU instructions where 17 M are exponentials), and -lse2 / scale is a product by a reciprocal taken once,
    # not a division per query row (MUFU.RCP and its range fix-ups).
    assert "F2F.BF16.F32" not in sass and "F2F.F16.F32" not in sass, "P^T rounded one probability at a time"
    fixups = len(re.findall(r"FMUL R\d+, R\d+, (?:0\.25|16777216)", sass))  # a division's range scaling
    assert fixups <= 8, f"{fixups} range fix-ups of a division: one per query row"
    # P^T, rounded to 16 bits, is widened back to fp32 for dS^T by integer operations on its pairs
    # (kernels.sm90.bwd._widen_pairs), not split into halves by byte permutes, widened by an IMAD each and permuted
    # together again for dV's operand (`.to(float32)`: 128 PRMT per consumer pair and step, perf-notes v40). Triton
    # 3.9 keeps `.to(float32)` (launch.sm90_bwd.WIDEN_SPILLS).
    from flashcore.launch import sm90_bwd
    from flashcore.plan.tables import triton_minor

    if triton_minor() not in sm90_bwd.WIDEN_SPILLS:
        assert "PRMT" not in sass, f"{sass.count('PRMT')} byte permutes: P^T split and re-merged for dS^T"
    from conftest import expect_register_fit

    expect_register_fit("bwd_d64_wide" + ("_causal" if causal else ""),
                        sass.count("STL") <= 2 and sass.count("LDL") <= 4,
                        f"at most a scalar or two spilled: {sass.count('STL')} STL, {sass.count('LDL')} LDL")
