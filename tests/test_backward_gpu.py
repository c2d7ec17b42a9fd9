"""The backward pass on a GPU (bf16/fp16). Skipped without CUDA.

    python3 -m pytest -q tests/test_backward_gpu.py

* FlashAttention's rule, per gradient: the error of flashcore's gradient against an fp32 computation of the same
  math from the same inputs is at most 2x the error of that math done in the input dtype by PyTorch, plus 1e-3
  (relative, Frobenius), over a grid of shapes (head dims 40..256, GQA/MQA, causal with Sq != Sk, both layouts);
* varlen with zero-length sequences; a returned lse's gradient;
* ``deterministic=True``: bitwise-identical gradients over repeated runs;
* ``torch.compile(fullgraph=True)`` traces forward and backward;
* a transformers Llama trains 200 steps through the integration with the same loss curve as ``sdpa``.
"""
import math

import pytest
import torch

import flashcore

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _math(q, k, v, do, causal, dtype):
    """Attention and its gradients by PyTorch autograd, computed in ``dtype`` ([B, H, S, D], GQA expanded)."""
    qc, kc, vc = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    G = q.shape[1] // k.shape[1]
    ke, ve = kc.repeat_interleave(G, 1), vc.repeat_interleave(G, 1)
    s = (qc @ ke.transpose(-1, -2)) * q.shape[-1] ** -0.5
    Sq, Sk = s.shape[-2:]
    if causal:
        keep = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device).tril(Sk - Sq)
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s.float(), -1).nan_to_num(0.0).to(dtype)  # rows with no key: zeros, as flashcore
    o = p @ ve
    o.backward(do.to(dtype))
    return o.detach(), qc.grad, kc.grad, vc.grad


def _poison_allocator():
    """Fill freed allocator memory with NaN, so a gradient element the backward never writes shows up."""
    torch.full((64 << 20,), float("nan"), device="cuda")


GRID = [
    # B, Hq, Hkv, Sq, Sk, D, causal
    (2, 4, 4, 256, 256, 64, False),
    (2, 4, 4, 256, 256, 64, True),
    (1, 8, 2, 511, 777, 128, True),
    (1, 8, 1, 777, 511, 128, True),   # Sq > Sk: rows that see no key
    (2, 4, 2, 300, 300, 128, False),
    (1, 4, 4, 1024, 1024, 128, True),
    (1, 6, 3, 333, 200, 96, False),
    (1, 4, 2, 257, 513, 256, True),
    (2, 2, 1, 129, 129, 40, True),
    (1, 2, 2, 64, 4096, 128, False),  # few queries, many keys (the forward runs the decode kernel)
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", GRID, ids=lambda s: "x".join(map(str, s[:6])) + ("c" if s[6] else ""))
def test_gradients_follow_the_flashattention_rule(shape, dtype):
    B, Hq, Hkv, Sq, Sk, D, causal = shape
    g = torch.Generator(device="cuda").manual_seed(hash(shape) % 2**31)
    mk = lambda H, S: torch.randn(B, H, S, D, device="cuda", generator=g).to(dtype)  # noqa: E731
    q, k, v = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk)
    do = mk(Hq, Sq)
    ref = _math(q, k, v, do, causal, torch.float32)
    low = _math(q, k, v, do, causal, dtype)
    for layout in ("bhsd", "bshd"):
        conv = (lambda t: t) if layout == "bhsd" else (lambda t: t.transpose(1, 2).contiguous())
        qa, ka, va = (conv(t).detach().requires_grad_(True) for t in (q, k, v))
        _poison_allocator()
        out = flashcore.attention(qa, ka, va, causal=causal, layout=layout)
        out.backward(conv(do))
        back = (lambda t: t) if layout == "bhsd" else (lambda t: t.transpose(1, 2))
        got = (back(out), back(qa.grad), back(ka.grad), back(va.grad))
        for name, x, r, lo in zip(("out", "dq", "dk", "dv"), got, ref, low):
            assert torch.isfinite(x).all(), f"{layout} {name}: non-finite values"
            err, base = _rel(x, r), _rel(lo, r)
            assert err <= 2 * base + 1e-3, f"{layout} {name}: error {err:.2e} > 2 x {base:.2e} + 1e-3"


HOPPER_GRID = [
    # B, Hq, Hkv, Sq, Sk, D, causal: tails on both axes, GQA, Sq != Sk both ways, a query tile that sees no key tile
    (1, 8, 2, 511, 777, 128, True),
    (1, 8, 1, 777, 511, 128, True),
    (2, 4, 2, 300, 300, 128, False),
    (2, 3, 3, 200, 1000, 64, True),
    (1, 4, 4, 130, 130, 64, False),
    (2, 16, 2, 1024, 1024, 128, True),
    (1, 2, 2, 64, 4096, 64, False),
]


@pytest.mark.skipif(torch.cuda.get_device_capability()[0] != 9, reason="the Gluon dK/dV kernel is sm_90 only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", HOPPER_GRID, ids=lambda s: "x".join(map(str, s[:6])) + ("c" if s[6] else ""))
def test_hopper_dkdv_kernel_runs_and_matches_the_triton_kernel(shape, dtype, monkeypatch):
    """The planner's Hopper configuration runs dK/dV on the Gluon kernel (counted), its gradients follow the FA
    rule, and they agree with the Triton dK/dV kernel's on the same forward to bf16/fp16 rounding; dQ (the same
    Triton kernel either way) is bitwise the same."""
    from dataclasses import replace

    from flashcore import ops
    from flashcore.launch import sm90_bwd
    from flashcore.plan.backward import backward_config

    B, Hq, Hkv, Sq, Sk, D, causal = shape
    g = torch.Generator(device="cuda").manual_seed(hash(shape) % 2**31 + 7)
    mk = lambda H, S: torch.randn(B, H, S, D, device="cuda", generator=g).to(dtype)  # noqa: E731
    q, k, v, do = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk), mk(Hq, Sq)
    scale = D ** -0.5
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True)
    cfg = backward_config((9, 0), head_dim=D, dtype_name={torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype],
                          causal=causal, deterministic=True)
    # the form with dQ on its own kernel (deterministic=True's with GQA; without GQA at D=128 it orders the fused dQ)
    cfg = replace(cfg, atomic_dq=False, ordered_dq=False)
    assert cfg.gluon_dkdv is not None
    runs = []
    real_run = sm90_bwd.HopperDkdvLaunch.run
    monkeypatch.setattr(sm90_bwd.HopperDkdvLaunch, "run", lambda self, *a: (runs.append(1), real_run(self, *a)))
    _poison_allocator()
    got = ops.dense_backward(do, q, k, v, out, lse, None, causal, scale, False, False, config=cfg)
    assert runs, "the Hopper dK/dV kernel did not run"
    want = ops.dense_backward(do, q, k, v, out, lse, None, causal, scale, False, False,
                              config=replace(cfg, gluon_dkdv=None))
    assert len(runs) == 1
    assert torch.equal(got[0], want[0])
    ref = _math(q, k, v, do, causal, torch.float32)
    low = _math(q, k, v, do, causal, dtype)
    for name, x, w, r, lo in zip(("dk", "dv"), got[1:], want[1:], ref[2:], low[2:]):
        assert torch.isfinite(x).all(), f"{name}: non-finite values"
        assert _rel(x, w) < 1e-2, f"{name}: {_rel(x, w):.2e} from the Triton kernel's"
        err, base = _rel(x, r), _rel(lo, r)
        assert err <= 2 * base + 1e-3, f"{name}: error {err:.2e} > 2 x {base:.2e} + 1e-3"
    # dQ inside the Gluon kernel (the copy engine's reduce-add): the same dK/dV bits, dQ to rounding, the FA rule
    fused = ops.dense_backward(do, q, k, v, out, lse, None, causal, scale, False, False,
                               config=replace(cfg, atomic_dq=True))
    assert len(runs) == 2
    if Hq == Hkv:  # (with GQA the fused form adds dK/dV up over the group in fp32: to rounding, below)
        assert torch.equal(fused[1], got[1]) and torch.equal(fused[2], got[2])
    for i, name in enumerate(("dq", "dk", "dv")):
        assert torch.isfinite(fused[i]).all()
        assert _rel(fused[i], got[i]) < 1e-2, f"{name}: {_rel(fused[i], got[i]):.2e} from the unfused form's"
        err, base = _rel(fused[i], ref[1 + i]), _rel(low[1 + i], ref[1 + i])
        assert err <= 2 * base + 1e-3, f"fused {name}: error {err:.2e} > 2 x {base:.2e} + 1e-3"


FUSED_GRID = [
    # B, Hq, Hkv, Sq, Sk, causal (D=128: the planner's rows that add dQ inside the Gluon kernel)
    (2, 4, 4, 300, 300, False),
    (1, 4, 4, 1024, 1024, True),
    (1, 4, 4, 511, 777, True),
    (1, 2, 2, 777, 511, True),   # rows that see no key
    (2, 3, 3, 64, 1000, False),  # one query tile
    (2, 8, 2, 300, 300, False),  # GQA: a program per query head, dK/dV added up over the group
    (1, 8, 2, 511, 777, True),
    (1, 6, 1, 777, 511, True),   # MQA, rows that see no key
]


@pytest.mark.skipif(torch.cuda.get_device_capability()[0] != 9, reason="the Gluon dK/dV kernel is sm_90 only")
@pytest.mark.parametrize("shape", FUSED_GRID, ids=lambda s: "x".join(map(str, s[:5])) + ("c" if s[5] else ""))
def test_the_default_d128_backward_adds_dq_inside_the_gluon_kernel(shape, monkeypatch):
    """At D=128, autograd's backward computes dQ inside the Gluon dK/dV kernel (counted: its launch gets the fp32
    dQ buffer, and the dQ kernel never runs). Its gradients follow the FA rule and agree with
    ``deterministic=True``'s dQ-kernel form (the one it runs with GQA; ``plan.backward.ORDERED_DQ`` off here) to
    rounding; without GQA dK/dV are bitwise the same (with GQA they are added up over the group's query heads in
    fp32, in a varying order)."""
    from flashcore.launch import sm90_bwd, triton_bwd
    from flashcore.plan import backward as plan_backward
    from flashcore.plan.cache import PLANS

    monkeypatch.setattr(plan_backward, "ORDERED_DQ", False)
    PLANS.clear()  # (plans built with the ordered form are cached under the same key)

    B, H, Hkv, Sq, Sk, causal = shape
    g = torch.Generator(device="cuda").manual_seed(hash(shape) % 2**31 + 3)
    q = torch.randn(B, Sq, H, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Sk, Hkv, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn(B, Sq, H, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    fused, dq_kernel = [], []
    real_run = sm90_bwd.HopperDkdvLaunch.run
    monkeypatch.setattr(sm90_bwd.HopperDkdvLaunch, "run",
                        lambda self, *a: (fused.append(len(a) > 8 and a[8] is not None), real_run(self, *a)))
    real_step = triton_bwd.KernelStep.run
    monkeypatch.setattr(triton_bwd.KernelStep, "run",
                        lambda self, *a: (dq_kernel.append(self.fn.__name__ == "attn_bwd_dq_kernel"),
                                          real_step(self, *a)))
    grads = {}
    for det in (False, True):
        ins = [t.clone().requires_grad_() for t in (q, k, v)]
        _poison_allocator()
        flashcore.attention(*ins, causal=causal, layout="bshd", deterministic=det).backward(do)
        grads[det] = [t.grad for t in ins]
    assert fused == [True, False], fused
    assert sum(dq_kernel) == 1, "the dQ kernel ran in the default backward"
    (dq, dk, dv), (dq_d, dk_d, dv_d) = grads[False], grads[True]
    if H == Hkv:
        assert torch.equal(dk, dk_d) and torch.equal(dv, dv_d)
    for name, x, w in (("dq", dq, dq_d), ("dk", dk, dk_d), ("dv", dv, dv_d)):
        assert torch.isfinite(x).all()
        assert _rel(x, w) < 1e-2, f"{name}: {_rel(x, w):.2e} from the deterministic form's"
    tr = lambda t: t.transpose(1, 2)  # noqa: E731
    ref = _math(tr(q), tr(k), tr(v), tr(do), causal, torch.float32)
    low = _math(tr(q), tr(k), tr(v), tr(do), causal, torch.bfloat16)
    for name, x, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref[1:], low[1:]):
        err, base = _rel(tr(x), r), _rel(lo, r)
        assert err <= 2 * base + 1e-3, f"{name}: error {err:.2e} > 2 x {base:.2e} + 1e-3"
    PLANS.clear()


ORDERED_GRID = [
    # B, H, Sq, Sk, causal (D=128, no GQA: deterministic=True's fused form, dQ added in a fixed order of key tiles)
    (2, 4, 300, 300, False),
    (1, 4, 1024, 1024, True),
    (1, 2, 511, 777, True),      # Sk > Sq: a partial last key tile
    (1, 3, 777, 511, True),      # rows that see no key: query tiles no program adds to
    (1, 8, 130, 2048, False),    # a partial last query tile, 16 key tiles
    (1, 16, 4096, 4096, False),  # 32 key tiles per head: long chains of turns
]


def _turn_counts(B, H, Sq, Sk, causal):
    """What each (batch entry, query head, query tile) counter of the ordered dQ holds after a backward: the number
    of 128-key tiles whose programs add to that 64-query tile (all of them; causal: those up to the bottom-right
    diagonal's last, none for a tile whose rows see no key)."""
    n_kt = -(-Sk // 128)
    per_tile = [max(min(((m + 1) * 64 + Sk - Sq - 1) // 128, n_kt - 1) + 1, 0) if causal else n_kt
                for m in range(-(-Sq // 64))]
    return torch.tensor(per_tile, dtype=torch.int32).repeat(B * H)


@pytest.mark.skipif(torch.cuda.get_device_capability()[0] != 9, reason="the Gluon dK/dV kernel is sm_90 only")
@pytest.mark.parametrize("shape", ORDERED_GRID, ids=lambda s: "x".join(map(str, s[:4])) + ("c" if s[4] else ""))
def test_deterministic_d128_adds_dq_in_a_fixed_order(shape, monkeypatch):
    """deterministic=True at D=128 without GQA: dQ is added inside the Gluon kernel in a fixed order of key tiles
    (``kernels.sm90.bwd._dq_turn``, perf-notes v41). Its launch gets zeroed counters, and after the backward each
    query tile's counter holds the number of key tiles that add to it (every program passed its turn once, and only
    once); the gradients are bitwise the same whatever order the programs run in (``HEAD_CHUNK`` reorders them)
    and from run to run; dK/dV are bitwise the default form's (the same products); all three follow the FA rule."""
    from flashcore.launch import sm90_bwd
    from flashcore.plan.cache import PLANS

    B, H, Sq, Sk, causal = shape
    g = torch.Generator(device="cuda").manual_seed(hash(shape) % 2**31 + 41)
    q = torch.randn(B, Sq, H, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Sk, H, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn(B, Sq, H, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    turns = []
    real_run = sm90_bwd.HopperDkdvLaunch.run

    def spy(self, *a):
        real_run(self, *a)
        turns.append(a[9].clone() if len(a) > 9 and a[9] is not None else None)

    monkeypatch.setattr(sm90_bwd.HopperDkdvLaunch, "run", spy)
    runs = []
    for chunk in (4, 1, 16, 4):  # program orders: 4 heads' key tiles at once, head by head, 16 heads at once
        monkeypatch.setattr(sm90_bwd, "HEAD_CHUNK", chunk)
        PLANS.clear()
        ins = [t.clone().requires_grad_() for t in (q, k, v)]
        _poison_allocator()
        flashcore.attention(*ins, causal=causal, layout="bshd", deterministic=True).backward(do)
        runs.append([t.grad for t in ins])
    PLANS.clear()
    assert len(turns) == 4 and all(t is not None for t in turns), "the ordered form did not run"
    want = _turn_counts(B, H, Sq, Sk, causal)
    for t in turns:
        assert torch.equal(t.cpu(), want), "a program passed its turn twice, or not at all"
    for r in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], r):
            assert torch.equal(a, b), f"{name} differs between program orders"
    ins = [t.clone().requires_grad_() for t in (q, k, v)]
    flashcore.attention(*ins, causal=causal, layout="bshd").backward(do)
    assert torch.equal(ins[1].grad, runs[0][1]) and torch.equal(ins[2].grad, runs[0][2])
    tr = lambda t: t.transpose(1, 2)  # noqa: E731
    ref = _math(tr(q), tr(k), tr(v), tr(do), causal, torch.float32)
    low = _math(tr(q), tr(k), tr(v), tr(do), causal, torch.bfloat16)
    for name, x, r, lo in zip(("dq", "dk", "dv"), runs[0], ref[1:], low[1:]):
        assert torch.isfinite(x).all()
        err, base = _rel(tr(x), r), _rel(lo, r)
        assert err <= 2 * base + 1e-3, f"{name}: error {err:.2e} > 2 x {base:.2e} + 1e-3"


WIDE_D64_GRID = [
    # B, Hq, Hkv, Sq, Sk, causal
    (2, 4, 4, 256, 256, False),
    (2, 4, 4, 300, 300, True),
    (1, 8, 2, 511, 777, True),    # GQA, Sq != Sk, a partial last query tile
    (1, 6, 1, 777, 511, True),    # MQA, rows that see no key
    (1, 2, 2, 130, 2048, False),  # one whole and one partial 128-query tile
]


@pytest.mark.skipif(torch.cuda.get_device_capability()[0] != 9, reason="the Gluon dK/dV kernel is sm_90 only")
@pytest.mark.parametrize("shape", WIDE_D64_GRID, ids=lambda s: "x".join(map(str, s[:5])) + ("c" if s[5] else ""))
def test_the_wide_d64_fused_form_follows_the_rule(shape, monkeypatch):
    """The fused-dQ form with 128-query steps at D=64 (``launch.sm90_bwd.WIDE_STEP``, selected by an explicit
    config; perf-notes v38): its launch carries the fp32 dQ buffer, its gradients follow the FA rule and agree with
    the dQ-kernel form's to rounding (P^T is rounded to bf16 before dS^T here, so not bitwise)."""
    from dataclasses import replace

    from flashcore import ops
    from flashcore.launch import sm90_bwd
    from flashcore.plan.backward import backward_config

    B, Hq, Hkv, Sq, Sk, causal = shape
    g = torch.Generator(device="cuda").manual_seed(hash(shape) % 2**31 + 11)
    mk = lambda H, S: torch.randn(B, H, S, 64, device="cuda", generator=g).to(torch.bfloat16)  # noqa: E731
    q, k, v, do = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk), mk(Hq, Sq)
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True)
    base = backward_config((9, 0), head_dim=64, dtype_name="bf16", causal=causal, deterministic=True)
    wide = replace(base, atomic_dq=True, gluon_dkdv=(128, 128, 8, 2))
    fused = []
    real_run = sm90_bwd.HopperDkdvLaunch.run
    monkeypatch.setattr(sm90_bwd.HopperDkdvLaunch, "run",
                        lambda self, *a: (fused.append(len(a) > 8 and a[8] is not None), real_run(self, *a)))
    _poison_allocator()
    got = ops.dense_backward(do, q, k, v, out, lse, None, causal, 0.125, False, False, config=wide)
    want = ops.dense_backward(do, q, k, v, out, lse, None, causal, 0.125, False, False, config=base)
    assert fused == [True, False], fused
    ref = _math(q, k, v, do, causal, torch.float32)
    low = _math(q, k, v, do, causal, torch.bfloat16)
    for i, name in enumerate(("dq", "dk", "dv")):
        assert torch.isfinite(got[i]).all(), f"{name}: non-finite values"
        assert _rel(got[i], want[i]) < 1e-2, f"{name}: {_rel(got[i], want[i]):.2e} from the dQ-kernel form's"
        err, lo = _rel(got[i], ref[1 + i]), _rel(low[1 + i], ref[1 + i])
        assert err <= 2 * lo + 1e-3, f"{name}: error {err:.2e} > 2 x {lo:.2e} + 1e-3"


def test_varlen_gradients_with_empty_sequences_and_lse():
    torch.manual_seed(3)
    lq, lk = [100, 0, 257, 33], [130, 0, 200, 64]
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    H, Hkv, D = 8, 2, 128
    q = torch.randn(sum(lq) + 5, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # 5 unowned rows
    k = torch.randn(sum(lk), Hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(sum(lk), Hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn_like(q)
    out, lse = flashcore.attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=True, return_lse=True)
    dl = torch.randn_like(lse)
    torch.autograd.backward([out, lse.masked_fill(~torch.isfinite(lse), 0)], [do, dl])
    assert q.grad[-5:].abs().max() == 0
    for i in range(len(lq)):
        qs, ks, vs = (t.detach()[c[i]:c[i + 1]].float().requires_grad_(True)
                      for t, c in ((q, cq), (k, ck), (v, ck)))
        if lq[i] == 0:
            continue
        o_ref, l_ref = flashcore.reference.attention_varlen(
            qs.double(), ks.double(), vs.double(), torch.tensor([0, lq[i]], dtype=torch.int32),
            torch.tensor([0, lk[i]], dtype=torch.int32), lq[i], lk[i], causal=True, scale=D ** -0.5,
            return_lse=True)
        sl = slice(cq[i].item(), cq[i + 1].item())
        torch.autograd.backward([o_ref, l_ref.masked_fill(~torch.isfinite(l_ref), 0)],
                                [do[sl].double(), dl[:, sl].double()])
        for name, got, r in (("dq", q.grad[sl], qs.grad), ("dk", k.grad[ck[i]:ck[i + 1]], ks.grad),
                             ("dv", v.grad[ck[i]:ck[i + 1]], vs.grad)):
            assert _rel(got, r) < 2e-2, f"sequence {i} {name}: {_rel(got, r):.2e}"


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("hkv", [4, 16], ids=["gqa", "mha"])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_gradients_are_bitwise_identical(causal, hkv, D):
    """With GQA deterministic=True runs the dQ kernel at D=128, without it the fused form with dQ added in order;
    D=64 runs the dQ kernel beside the Gluon dK/dV kernel (its wide fused step only by default)."""
    torch.manual_seed(11 + D)
    q = torch.randn(2, 1024, 16, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 1024, hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 1024, hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn_like(q)
    runs = []
    for _ in range(5):
        for t in (q, k, v):
            t.grad = None
        flashcore.attention(q, k, v, causal=causal, layout="bshd", deterministic=True).backward(do)
        runs.append([t.grad.clone() for t in (q, k, v)])
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_varlen_gradients_are_bitwise_identical(causal):
    """attention_varlen with deterministic=True (the Triton backward with its dQ kernel, no atomics): the same bits
    in five runs, a zero-length sequence included, each gradient within 2e-2 of the float64 reference's."""
    torch.manual_seed(17)
    cu = torch.tensor([0, 700, 700, 1900, 3000], device="cuda", dtype=torch.int32)
    q = torch.randn(3000, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(3000, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    runs = []
    for _ in range(5):
        for t in (q, k, v):
            t.grad = None
        flashcore.attention_varlen(q, k, v, cu, cu, 1200, 1200, causal=causal, deterministic=True).backward(do)
        runs.append([t.grad.clone() for t in (q, k, v)])
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert torch.equal(a, b)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    flashcore.reference.attention_varlen(qd, kd, vd, cu, cu, 1200, 1200, causal=causal).backward(do.double())
    for a, b in zip(runs[0], (qd.grad, kd.grad, vd.grad)):
        assert torch.isfinite(a).all() and _rel(a, b) < 2e-2


def test_compile_fullgraph_traces_forward_and_backward():
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def loss(q, k, v):
        return flashcore.attention(q, k, v, causal=True).float().square().sum()

    compiled = torch.compile(loss, fullgraph=True)
    compiled(q, k, v).backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    loss(q, k, v).backward()
    for a, b in zip(got, (q.grad, k.grad, v.grad)):
        assert _rel(a, b) < 1e-2


def test_a_llama_trains_like_sdpa():
    """200 steps of a small transformers Llama (GQA 8/4 heads, head dim 64, autocast bf16) on a learnable synthetic
    task, once through flashcore's integration and once through sdpa, from the same seed."""
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("needs transformers >= 5")
    from transformers import LlamaConfig, LlamaForCausalLM

    from flashcore.integrations import transformers as fc_hf

    name = fc_hf.register()
    cfg = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
               num_key_value_heads=4, head_dim=64, max_position_embeddings=512, attention_dropout=0.0)
    curves = {}
    for impl in ("sdpa", name):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation=impl)).cuda().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator(device="cuda").manual_seed(1)
        losses = []
        for _ in range(200):
            # sequences of 16 random tokens repeated: the model can learn to copy from 16 back
            base = torch.randint(0, 512, (8, 16), device="cuda", generator=gen)
            ids = base.repeat(1, 16)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        curves[impl] = losses
    a, b = torch.tensor(curves["sdpa"]), torch.tensor(curves[name])
    print(f"loss sdpa {a[0]:.3f} -> {a[-1]:.3f}; flashcore {b[0]:.3f} -> {b[-1]:.3f}; "
          f"max |diff| {(a - b).abs().max():.3f}, mean |diff| over the last 50 {(a - b)[-50:].abs().mean():.4f}")
    assert b[-1] < 0.5 * b[0], "the flashcore model did not learn"
    assert math.isclose(a[-1].item(), b[-1].item(), rel_tol=0.1, abs_tol=0.05)
    assert (a - b)[:50].abs().max() < 0.05  # early steps: the two runs have not yet drifted apart
    assert (a - b)[-50:].abs().mean() < 0.1
