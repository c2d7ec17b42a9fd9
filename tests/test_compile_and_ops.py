"""torch.compile traces through the custom ops (fake impls), and auto dispatch picks the reference on CPU
(which the tests check by what ran, not by comparing the reference with itself)."""
import pytest
import torch

import flashcore
from conftest import rel_err


def test_auto_backend_on_cpu_is_reference(ran):
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    assert flashcore.plan_attention(q, k, v, causal=True) is None  # no kernel plan: the reference runs
    out = flashcore.attention(q, k, v, causal=True)
    assert ran.reference == 1 and ran.kernels == []
    assert out.dtype == q.dtype and rel_err(out, flashcore.reference.attention(q, k, v, causal=True)) < 1e-6
    flashcore.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                               torch.tensor([0, 9], dtype=torch.int32), torch.tensor([0, 9], dtype=torch.int32), 9, 9)
    assert ran.reference == 2 and ran.kernels == []


@pytest.mark.interp
def test_triton_backend_on_cpu_runs_the_kernel(ran):
    """backend="triton" under the interpreter: the kernel runs (the planned one), not the reference, and
    matches the float64 reference."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, s, 16, generator=gen) for s in (9, 13, 13))
    plan = flashcore.plan_attention(q, k, v, causal=True, backend="triton")
    out = flashcore.attention(q, k, v, causal=True, backend="triton")
    assert [name for name, _ in ran.kernels] == [plan.selection.kernel] == ["triton_fwd"]
    assert ran.reference == 0 and ran.kernels[0][1].causal and ran.kernels[0][1].seqlen_k == 13
    assert rel_err(out, flashcore.reference.attention(q, k, v, causal=True)) < 1e-5


def test_custom_ops_are_registered_with_fake_impls():
    import flashcore.ops  # noqa: F401
    assert hasattr(torch.ops.flashcore, "attention_fwd")
    assert hasattr(torch.ops.flashcore, "attention_varlen_fwd")
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2, 7, 4, 64, dtype=torch.float16)  # bshd
        k = torch.empty(2, 9, 2, 64, dtype=torch.float16)
        out, lse = torch.ops.flashcore.attention_fwd(q, k, k, None, None, True, 0.125, True, False, True, True)
        assert out.shape == q.shape and lse.shape == (2, 4, 7) and lse.dtype == torch.float32


@pytest.mark.interp
def test_torch_compile_fullgraph_traces_the_op(ran):
    q, k, v = (torch.randn(1, 2, 20, 32) for _ in range(3))

    def f(q, k, v):
        return flashcore.attention(q, k, v, causal=True, backend="triton", return_lse=True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, v)
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=True, return_lse=True)
    assert ran.kernels and {name for name, _ in ran.kernels} == {"triton_fwd"} and ran.reference == 0
    assert rel_err(out, ref) < 1e-5
    assert torch.allclose(lse.double(), ref_lse, atol=1e-4)


@pytest.mark.interp
def test_torch_compile_fullgraph_with_an_out_buffer(ran):
    """out= under torch.compile: the overlap check cannot read fake tensors' addresses while tracing (it raised
    a TypeError inside dynamo); the op runs and its result lands in the caller's buffer."""
    q, k, v = (torch.randn(1, 2, 20, 32) for _ in range(3))

    def f(q, k, v, o):
        return flashcore.attention(q, k, v, causal=True, backend="triton", out=o)

    o = torch.full_like(q, float("nan"))
    res = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, o)
    assert {name for name, _ in ran.kernels} == {"triton_fwd"} and not torch.isnan(o).any()
    assert rel_err(o, flashcore.reference.attention(q, k, v, causal=True)) < 1e-5 and rel_err(res, o) == 0
