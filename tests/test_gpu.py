"""GPU correctness at realistic sizes (bf16 included), against the float64 reference on the GPU."""
import pytest
import torch

import flashcore
from conftest import capture_cuda_graph, rel_err

pytestmark = pytest.mark.gpu
TOL = {torch.bfloat16: 1.2e-2, torch.float16: 2e-3, torch.float32: 2e-5}

SHAPES = [
    # B, Hq, Hkv, Sq, Sk, D, causal
    (2, 8, 8, 1024, 1024, 64, False),
    (1, 16, 16, 2048, 2048, 128, True),
    (2, 32, 8, 1000, 1000, 128, True),
    (1, 4, 1, 777, 1500, 96, True),
    (1, 4, 4, 1500, 777, 96, True),
    (2, 4, 4, 513, 513, 256, False),
    (2, 4, 2, 300, 301, 8, True),
    (1, 8, 8, 1, 4096, 128, False),
    (3, 6, 2, 129, 4000, 192, False),
]


def _inputs(B, Hq, Hkv, Sq, Sk, D, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h, s: torch.randn(B, h, s, D, device="cuda", generator=g, dtype=torch.float32).to(dtype)
    return mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_dense(shape, dtype):
    B, Hq, Hkv, Sq, Sk, D, causal = shape
    q, k, v = _inputs(B, Hq, Hkv, Sq, Sk, D, dtype, seed=hash(shape) % 2**31)
    out = torch.full_like(q, float("nan"))
    _, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True, out=out)
    torch.cuda.synchronize()
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=causal, return_lse=True)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[dtype], rel_err(out, ref)
    seen = torch.isfinite(ref_lse)
    assert torch.allclose(lse[seen].double(), ref_lse[seen], atol=2e-3, rtol=1e-4)
    assert bool((lse[~seen] == float("-inf")).all())


def test_fp32_is_accurate():
    q, k, v = _inputs(1, 4, 2, 333, 517, 64, torch.float32, seed=3)
    out = flashcore.attention(q, k, v, causal=True)
    assert rel_err(out, flashcore.reference.attention(q, k, v, causal=True)) < TOL[torch.float32]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_layouts_bf16(layout):
    q, k, v = _inputs(2, 8, 2, 700, 700, 128, torch.bfloat16, seed=4)
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    out = flashcore.attention(q, k, v, causal=True, layout=layout)
    ref = flashcore.reference.attention(q, k, v, causal=True, layout=layout)
    assert out.shape == q.shape and rel_err(out, ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_bf16(causal):
    g = torch.Generator(device="cuda").manual_seed(5)
    lens_q, lens_k = [100, 0, 1023, 1, 517], [300, 7, 1023, 0, 2000]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), 16, 128, device="cuda", generator=g).bfloat16()
    k = torch.randn(sum(lens_k), 4, 128, device="cuda", generator=g).bfloat16()
    v = torch.randn(sum(lens_k), 4, 128, device="cuda", generator=g).bfloat16()
    out = torch.full_like(q, float("nan"))
    flashcore.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, out=out)
    ref = flashcore.reference.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("causal", [False, True])
def test_secure_bf16_with_nan_padding(causal):
    B, H, S, D = 4, 8, 1024, 128
    q, k, v = _inputs(B, H, H, S, S, D, torch.bfloat16, seed=6 + causal)
    lens = torch.tensor([1024, 517, 1, 0], dtype=torch.int32, device="cuda")
    for b, n in enumerate(lens.tolist()):
        q[b, :, n:] = float("nan"); k[b, :, n:] = float("inf"); v[b, :, n:] = float("nan")
    out = flashcore.attention(q, k, v, causal=causal, secure=True, seqlens_k=lens)
    ref = flashcore.reference.attention(q, k, v, causal=causal, seqlens_k=lens)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    assert bool((out[3] == 0).all()) and bool((out[2, :, 1:] == 0).all())


def test_deterministic_bitwise():
    q, k, v = _inputs(2, 8, 8, 1000, 1000, 128, torch.bfloat16, seed=8)
    a = flashcore.attention(q, k, v, causal=True)
    for _ in range(5):
        assert torch.equal(flashcore.attention(q, k, v, causal=True), a)


def test_cuda_graph_capture_and_replay():
    q, k, v = _inputs(1, 8, 8, 512, 512, 64, torch.bfloat16, seed=9)
    lens = torch.tensor([300], dtype=torch.int32, device="cuda")
    flashcore.attention(q, k, v, causal=True)  # warm-up: compile and plan outside the graph
    flashcore.attention(q, k, v, secure=True, seqlens_k=lens)
    g, (out_fast, out_sec) = capture_cuda_graph(lambda: (flashcore.attention(q, k, v, causal=True),
                                                         flashcore.attention(q, k, v, secure=True, seqlens_k=lens)))
    q2, k2, v2 = _inputs(1, 8, 8, 512, 512, 64, torch.bfloat16, seed=10)
    q.copy_(q2); k.copy_(k2); v.copy_(v2); lens.fill_(129)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_fast, flashcore.attention(q2, k2, v2, causal=True))
    assert torch.equal(out_sec, flashcore.attention(q2, k2, v2, secure=True, seqlens_k=lens))


def test_torch_compile_fullgraph_inductor():
    q, k, v = _inputs(2, 8, 2, 256, 256, 64, torch.float16, seed=11)

    @torch.compile(fullgraph=True)
    def f(q, k, v):
        return flashcore.attention(q * 1.0, k, v, causal=True) + 1

    out = f(q, k, v)
    ref = flashcore.reference.attention(q, k, v, causal=True) + 1
    assert rel_err(out, ref) < TOL[torch.float16]


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_replayed_calls_read_new_tensors(layout):
    """Repeat calls replay a cached plan through the compiled kernel directly (plan.cache.PLANS): each
    must still compute on its own inputs."""
    shape = (2, 8, 2, 600, 600, 128)
    lens = torch.tensor([600, 77], dtype=torch.int32, device="cuda")
    for seed in (20, 21, 22):
        q, k, v = _inputs(*shape, torch.bfloat16, seed=seed)
        if layout == "bshd":
            q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        fast = flashcore.attention(q, k, v, causal=True, layout=layout)
        sec = flashcore.attention(q, k, v, causal=True, layout=layout, secure=True, seqlens_k=lens)
        torch.cuda.synchronize()
        assert rel_err(fast, flashcore.reference.attention(q, k, v, causal=True, layout=layout)) < TOL[torch.bfloat16]
        ref_sec = flashcore.reference.attention(q, k, v, causal=True, layout=layout, seqlens_k=lens)
        assert rel_err(sec, ref_sec) < TOL[torch.bfloat16]


@pytest.mark.parametrize("causal", [False, True])
def test_secure_v_prepass_and_in_loop_select_agree_bitwise(causal):
    from dataclasses import replace
    from flashcore import ops
    from flashcore.plan import tables

    B, Hq, Hkv, S, D = 3, 8, 2, 1000, 128
    q, k, v = _inputs(B, Hq, Hkv, S, S, D, torch.bfloat16, seed=30 + causal)
    lens = torch.tensor([1000, 333, 0], dtype=torch.int32, device="cuda")
    for b, n in enumerate(lens.tolist()):
        q[b, :, n:] = float("nan"); k[b, :, n:] = float("-inf"); v[b, :, n:] = float("nan")
    base = tables.hopper_triton(D, 2, causal, True, S, S)  # the Triton kernel has both variants
    outs = [ops._dense_impl(q, k, v, None, lens, causal, D ** -0.5, False, True, False,
                            config=replace(base, v_prepass=p))[0] for p in (True, False)]
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1])
    ref = flashcore.reference.attention(q, k, v, causal=causal, seqlens_k=lens)
    assert not torch.isnan(outs[0]).any() and rel_err(outs[0], ref) < TOL[torch.bfloat16]
