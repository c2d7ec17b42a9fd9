"""No silent wrong answer: gradients that would be dropped, rows that no sequence owns, and the
interpreter's broken bf16 each get a documented behaviour, on every backend."""
import os

import pytest
import torch

import flashcore
from flashcore import reference

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
interp = pytest.mark.interp


def rnd(*shape, dtype=torch.float32, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    return torch.randn(*shape, generator=g).to(dtype)


# -- 1. gradients ------------------------------------------------------------------------------------

@interp
def test_kernel_path_keeps_the_gradient_of_a_training_chain():
    """Wq -> q -> attention -> Wo: Wq's gradient was silently None before the backward pass existed (2026-11-25)."""
    x = rnd(1, 2, 16, 32)
    w = torch.randn(32, 32, requires_grad=True)
    (flashcore.attention(x @ w, x, x, backend="triton") @ torch.randn(32, 8)).square().sum().backward()
    assert w.grad is not None and torch.isfinite(w.grad).all() and w.grad.abs().sum() > 0
    with torch.no_grad():  # inference with weights that require grad records nothing
        assert not flashcore.attention(x @ w, x, x, backend="triton").requires_grad


@interp
def test_a_cached_plan_does_not_bypass_the_backward():
    """A no-grad call plans and caches this shape; a later call wanting gradients must still record a backward."""
    x = rnd(1, 2, 16, 32)
    flashcore.attention(x, x, x, causal=True, backend="triton")
    q = x.clone().requires_grad_()
    out = flashcore.attention(q, x, x, causal=True, backend="triton")
    assert out.grad_fn is not None
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@interp
def test_varlen_kernel_path_keeps_gradients():
    q = rnd(10, 2, 32).requires_grad_()
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    out = flashcore.attention_varlen(q, q.detach(), q.detach(), cu, cu, 6, 6, backend="triton")
    assert out.grad_fn is not None
    out.square().sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0


def test_reference_path_keeps_gradients_dense_and_varlen():
    q, k, v = (rnd(12, 2, 32).requires_grad_() for _ in range(3))
    cu = torch.tensor([0, 12], dtype=torch.int32)
    out = flashcore.attention_varlen(q, k, v, cu, cu, 12, 12, causal=True, backend="reference")
    out.square().sum().backward()
    grads_varlen = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    dense = flashcore.attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), causal=True, backend="reference")
    dense.square().sum().backward()
    for gv, t in zip(grads_varlen, (q, k, v)):
        assert t.grad is not None and torch.isfinite(t.grad).all()
        torch.testing.assert_close(gv, t.grad, rtol=1e-5, atol=1e-6)
        assert t.grad.abs().sum() > 0


# -- 2. rows that no sequence owns ---------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference"] + (["triton"] if INTERP else []))
def test_varlen_rows_past_the_last_sequence_are_zero(backend):
    q, k = rnd(20, 2, 32), rnd(15, 2, 32)
    cu = torch.tensor([0, 8, 15], dtype=torch.int32)
    ref = reference.attention_varlen(q, k, k, cu, cu, 8, 8, return_lse=True)
    for _ in range(2):  # fresh output memory, then a caller's poisoned buffer
        out = torch.full_like(q, float("nan"))
        got, lse = flashcore.attention_varlen(q, k, k, cu, cu, 8, 8, backend=backend, return_lse=True, out=out)
        assert got.data_ptr() == out.data_ptr()
        assert torch.equal(got[15:], torch.zeros_like(got[15:]))
        assert torch.equal(lse[:, 15:], torch.full_like(lse[:, 15:], float("-inf")))
        assert (got[:15].double() - ref[0][:15]).abs().max() < 1e-5
    again = flashcore.attention_varlen(q, k, k, cu, cu, 8, 8, backend=backend)
    assert torch.equal(again[15:], torch.zeros_like(again[15:]))


# -- 3. the interpreter's bf16 -------------------------------------------------------------------------

@interp
def test_bf16_under_the_interpreter_is_refused_with_the_reason():
    q = rnd(1, 2, 16, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16.*interpreter.*float16 or float32"):
        flashcore.attention(q, q, q, backend="triton")
    cu = torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match="bfloat16.*interpreter"):
        flashcore.attention_varlen(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1), cu, cu, 16, 16,
                                   backend="triton")
    flashcore.attention(q, q, q, backend="reference")  # bf16 on CPU still has a correct route


# -- torch.compile of the varlen reference ------------------------------------------------------------

def test_compile_fullgraph_varlen_reference_path():
    q, k = rnd(10, 2, 32), rnd(12, 2, 32)
    cu_q, cu_k = torch.tensor([0, 4, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)

    def f(q, k, v):
        return flashcore.attention_varlen(q, k, v, cu_q, cu_k, 6, 7, causal=True, backend="reference")

    got = torch.compile(f, fullgraph=True, backend="eager")(q, k, k)
    torch.testing.assert_close(got, f(q, k, k))


@pytest.mark.interp
def test_varlen_rows_past_the_last_query_sequence_are_zero_when_keys_end_later():
    """The eager tail clearing starts where the *query* sequences end, even when the key sequences end later
    (mutation survivor 199 of _checks.py took the end from cu_seqlens_k and left rows 6-8 unwritten)."""
    q, k = torch.randn(10, 2, 16), torch.randn(12, 1, 16)
    out = torch.full_like(q, float("nan"))
    res, lse = flashcore.attention_varlen(q, k, k.clone(), torch.tensor([0, 3, 6], dtype=torch.int32),
                                          torch.tensor([0, 5, 9], dtype=torch.int32), 3, 5, out=out,
                                          return_lse=True, backend="triton")
    assert bool((res[6:] == 0).all()) and bool(torch.isneginf(lse[:, 6:]).all())
    assert not torch.isnan(res).any()
