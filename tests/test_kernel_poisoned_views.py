"""The Triton kernel reads exactly the elements of its views (interpreter, fp32 and fp16).

q, k and v are strided views into larger buffers whose every other element is NaN: columns past the
head dim, rows past the sequence length, the gaps between heads and batches. A load that reaches one
element too far (a head-dim or length bound one off, a dropped load mask) pulls a NaN into a score or
into P·V, where ``0 · NaN = NaN`` survives even a zero softmax weight. The output must be finite and
match the float64 reference computed on clean contiguous copies.
"""
import warnings

import pytest
import torch

import flashcore
from conftest import rel_err

pytestmark = pytest.mark.interp
warnings.filterwarnings("ignore", category=RuntimeWarning)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def _poisoned_view(B, H, S, D, dtype, gen, layout):
    """A [B, H, S, D] (bhsd) or [B, S, H, D] (bshd) view with unit last stride inside a NaN buffer."""
    data = torch.randn(B, H, S, D, generator=gen).to(dtype)
    if layout == "bhsd":
        big = torch.full((B, H + 1, S + 5, D + 8), float("nan"), dtype=dtype)
        view = big[:, :H, :S, :D]
        view.copy_(data)
    else:
        big = torch.full((B, S + 5, H + 1, D + 8), float("nan"), dtype=dtype)
        view = big[:, :S, :H, :D]
        view.copy_(data.transpose(1, 2))
    assert view.stride(-1) == 1 and not view.is_contiguous()
    return view


CASES = [
    # B, Hq, Hkv, Sq, Sk, D, causal, layout
    (2, 2, 1, 37, 53, 40, False, "bhsd"),   # D not a power of two: the head-dim mask matters
    (1, 4, 2, 45, 29, 24, True, "bhsd"),    # Sq > Sk, causal
    (2, 2, 2, 33, 64, 40, True, "bshd"),    # Sk a tile multiple: the unmasked key loads
    (1, 2, 1, 17, 16, 64, False, "bshd"),   # power-of-two D
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("B,Hq,Hkv,Sq,Sk,D,causal,layout", CASES)
def test_loads_stay_inside_the_views(B, Hq, Hkv, Sq, Sk, D, causal, layout, dtype):
    gen = torch.Generator().manual_seed(B * 100 + Sq + Sk + D)
    q = _poisoned_view(B, Hq, Sq, D, dtype, gen, layout)
    k = _poisoned_view(B, Hkv, Sk, D, dtype, gen, layout)
    v = _poisoned_view(B, Hkv, Sk, D, dtype, gen, layout)
    out, lse = flashcore.attention(q, k, v, causal=causal, layout=layout, backend="triton", return_lse=True)
    ref, ref_lse = flashcore.reference.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal,
                                                 layout=layout, return_lse=True)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert rel_err(out, ref) < TOL[dtype]
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen)


@pytest.mark.parametrize("causal", [False, True])
def test_secure_loads_stay_inside_the_views(causal):
    """Secure mode, padded length a tile multiple (no load masks on keys), D not a power of two: the padding
    rows hold Inf/NaN and the views' hidden columns NaN."""
    gen = torch.Generator().manual_seed(7 + causal)
    B, H, S, D = 3, 2, 64, 40
    q, k, v = (_poisoned_view(B, H, S, D, torch.float32, gen, "bhsd") for _ in range(3))
    lens = torch.tensor([64, 32, 17], dtype=torch.int32)
    for b in range(B):
        n = int(lens[b])
        q[b, :, n:] = float("nan")
        k[b, :, n:] = float("inf")
        v[b, :, n:] = float("nan")
    out = flashcore.attention(q, k, v, causal=causal, backend="triton", secure=True, seqlens_k=lens)
    ref = flashcore.reference.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal,
                                        seqlens_k=lens)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[torch.float32]
