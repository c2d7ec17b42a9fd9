"""torch.compile traces through the custom ops (fake impls), and auto dispatch picks the reference on CPU."""
import pytest
import torch

import flashcore
from conftest import rel_err


def test_auto_backend_on_cpu_is_reference():
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    out = flashcore.attention(q, k, v, causal=True)
    assert rel_err(out, flashcore.reference.attention(q, k, v, causal=True)) < 1e-6


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
def test_torch_compile_fullgraph_traces_the_op():
    q, k, v = (torch.randn(1, 2, 20, 32) for _ in range(3))

    def f(q, k, v):
        return flashcore.attention(q, k, v, causal=True, backend="triton", return_lse=True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, v)
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=True, return_lse=True)
    assert rel_err(out, ref) < 1e-5
    assert torch.allclose(lse.double(), ref_lse, atol=1e-4)
