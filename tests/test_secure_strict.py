"""``secure="strict"`` (docs/security.md §2): secure mode whose kernels never multiply the caller's padding. The
value goes through the one validation layer (bad values name ``secure``), keys its own plans, and puts the
row-fill pre-passes of q and k in front of whichever kernel runs, with the same output as ``secure=True`` bit for
bit. Runs the Triton kernel in the interpreter (fp16/fp32: its bf16 results are wrong); the Gluon kernel's strict
form is timed on the GPU (flashcore audit timing --secure strict)."""
from __future__ import annotations

import pytest
import torch

import flashcore
from flashcore.launch.secure_prepass import SecureRowFill


def _inputs(B, H, Sq, Sk, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Sq, D, generator=g).to(dtype)
    k, v = (torch.randn(B, H, Sk, D, generator=g).to(dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("bad,err", [("yes", ValueError), ("Strict", ValueError), (1, TypeError), (None, TypeError)])
def test_secure_takes_a_bool_or_strict(bad, err):
    q, k, v = _inputs(1, 2, 16, 16, 64, torch.float16, 1)
    lens = torch.tensor([16], dtype=torch.int32)
    with pytest.raises(err, match="secure must be a bool or 'strict'"):
        flashcore.attention(q, k, v, seqlens_k=lens, secure=bad)


def test_the_kvcache_path_refuses_strict():
    q = torch.randn(1, 1, 2, 64, dtype=torch.float16)
    cache = torch.randn(1, 32, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="secure='strict'.*no strict form"):
        flashcore.attention_with_kvcache(q, cache, cache, cache_seqlens=5, secure="strict")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("explicit_q", [False, True])
def test_strict_fills_q_and_k_first_and_changes_no_output_bit(causal, explicit_q):
    B, H, S, D = 2, 2, 48, 64
    q, k, v = _inputs(B, H, S, S, D, torch.float16, 7 + causal + 2 * explicit_q)
    lens = torch.tensor([48, 19], dtype=torch.int32)
    lens_q = torch.tensor([30, 19], dtype=torch.int32) if explicit_q else None
    kw = dict(causal=causal, seqlens_q=lens_q, seqlens_k=lens, backend="triton")
    plan = flashcore.plan_attention(q, k, v, secure="strict", **kw)
    assert plan is not flashcore.plan_attention(q, k, v, secure=True, **kw)  # its own plan key
    fills = [s for s in plan.steps if isinstance(s, SecureRowFill)]
    assert [f.name for f in fills[:2]] == ["q_clean", "k_clean"], plan.steps
    assert plan.problem.strict and plan.problem.secure
    ref = flashcore.attention(q, k, v, secure=True, **kw)
    out = flashcore.attention(q, k, v, secure="strict", **kw)
    assert torch.equal(out, ref)
    # the caller's padding (NaN, Inf) reaches no kernel's product: still the same bits
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for b in range(B):
        q2[b, :, int((lens_q if explicit_q else lens)[b]):] = float("nan")
        k2[b, :, int(lens[b]):] = float("inf")
        v2[b, :, int(lens[b]):] = float("nan")
    assert torch.equal(flashcore.attention(q2, k2, v2, secure="strict", **kw), ref)
    exact = flashcore.reference.attention(q, k, v, causal=causal, seqlens_q=lens_q, seqlens_k=lens)
    valid = (lens_q if explicit_q else lens)
    for b in range(B):
        n = int(valid[b])
        assert (out[b, :, :n].double() - exact[b, :, :n]).abs().max() < 5e-3
