"""Property test of the public API: any call either matches the float64 reference or raises the
documented exception (ValueError/TypeError naming an argument). Random shapes, non-contiguous views,
both layouts, GQA ratios, causal with Sq != Sk, varlen with empty sequences, secure lengths; fp32 and
fp16, on the reference and (under the interpreter) on the kernels. A fixed example budget keeps it
inside CI time."""
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashcore
from flashcore import reference

from conftest import rel_err

BACKENDS = ["reference"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else [])
TOL = {torch.float32: 2e-5, torch.float16: 2e-3}
SETTINGS = settings(max_examples=int(os.environ.get("FLASHCORE_PROPERTY_EXAMPLES", "25")), deadline=None,
                    derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _tensor(g, shape, dtype, view):
    """A random tensor of ``shape``, made non-contiguous when ``view`` says so (the unit last stride kept)."""
    if view == "padded_heads":  # a slice of a wider tensor: strides with gaps
        base = torch.randn(*shape[:-2], shape[-2] + 3, shape[-1], generator=g)
        return base[..., 1:shape[-2] + 1, :].to(dtype)
    if view == "permuted":  # the memory order of the first two dims swapped
        return torch.randn(shape[1], shape[0], *shape[2:], generator=g).transpose(0, 1).to(dtype)
    return torch.randn(*shape, generator=g).to(dtype)


@st.composite
def dense_calls(draw):
    B = draw(st.integers(1, 3))
    Hkv = draw(st.integers(1, 3))
    Hq = Hkv * draw(st.sampled_from([1, 2, 4]))
    Sq, Sk = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    D = draw(st.sampled_from([16, 32, 40, 64]))
    layout = draw(st.sampled_from(["bhsd", "bshd"]))
    causal = draw(st.booleans())
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    views = [draw(st.sampled_from(["contiguous", "padded_heads", "permuted"])) for _ in range(3)]
    secure = draw(st.booleans())
    lens = None
    if secure:
        if Sq != Sk:
            lens = (draw(st.lists(st.integers(0, Sq), min_size=B, max_size=B)),
                    draw(st.lists(st.integers(0, Sk), min_size=B, max_size=B)))
        else:
            lens = (None, draw(st.lists(st.integers(0, Sk), min_size=B, max_size=B)))
    scale = draw(st.sampled_from([None, 0.05, 0.3]))
    return dict(B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D, layout=layout, causal=causal, dtype=dtype, views=views,
                secure=secure, lens=lens, scale=scale, seed=draw(st.integers(0, 2**31 - 1)))


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(c=dense_calls())
def test_dense_calls_match_the_reference(backend, c):
    g = torch.Generator().manual_seed(c["seed"])
    def shape(H, S):
        return (c["B"], H, S, c["D"]) if c["layout"] == "bhsd" else (c["B"], S, H, c["D"])
    q = _tensor(g, shape(c["Hq"], c["Sq"]), c["dtype"], c["views"][0])
    k = _tensor(g, shape(c["Hkv"], c["Sk"]), c["dtype"], c["views"][1])
    v = _tensor(g, shape(c["Hkv"], c["Sk"]), c["dtype"], c["views"][2])
    kw = dict(causal=c["causal"], scale=c["scale"], layout=c["layout"])
    if c["secure"]:
        lq, lk = c["lens"]
        kw.update(secure=True, seqlens_k=torch.tensor(lk, dtype=torch.int32),
                  seqlens_q=None if lq is None else torch.tensor(lq, dtype=torch.int32))
    out, lse = flashcore.attention(q, k, v, backend=backend, return_lse=True, **kw)
    ref, ref_lse = reference.attention(q, k, v, return_lse=True, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and torch.isfinite(out).all()
    assert rel_err(out, ref) < TOL[c["dtype"]], c
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() < 1e-3 if finite.any() else True


@st.composite
def varlen_calls(draw):
    n = draw(st.integers(1, 4))
    lq = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    lk = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    Hkv = draw(st.integers(1, 2))
    return dict(lq=lq, lk=lk, Hkv=Hkv, Hq=Hkv * draw(st.sampled_from([1, 3])), D=draw(st.sampled_from([16, 64])),
                causal=draw(st.booleans()), dtype=draw(st.sampled_from([torch.float32, torch.float16])),
                extra_q=draw(st.integers(0, 3)), slack=draw(st.integers(0, 5)), seed=draw(st.integers(0, 2**31 - 1)))


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(c=varlen_calls())
def test_varlen_calls_match_the_reference(backend, c):
    g = torch.Generator().manual_seed(c["seed"])
    cu_q = torch.tensor([0] + torch.tensor(c["lq"]).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(c["lk"]).cumsum(0).tolist(), dtype=torch.int32)
    tq, tk = int(cu_q[-1]) + c["extra_q"], int(cu_k[-1])  # extra q rows that no sequence owns
    q = torch.randn(tq, c["Hq"], c["D"], generator=g).to(c["dtype"])
    k = torch.randn(tk, c["Hkv"], c["D"], generator=g).to(c["dtype"])
    v = torch.randn(tk, c["Hkv"], c["D"], generator=g).to(c["dtype"])
    mq, mk = max(c["lq"]) + c["slack"], max(c["lk"]) + c["slack"]
    if tq == 0 or tk == 0:
        return
    out, lse = flashcore.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=c["causal"], backend=backend,
                                          return_lse=True)
    ref, ref_lse = reference.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=c["causal"], return_lse=True)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < TOL[c["dtype"]] or ref.abs().max() == 0 and out.abs().max() == 0, c
    assert torch.equal(torch.isfinite(lse), torch.isfinite(ref_lse))


BAD = [  # (argument overrides, exception, the argument the message must name)
    (dict(causal="yes"), TypeError, "causal"),
    (dict(scale=-2.0), ValueError, "scale"),
    (dict(layout="sbhd"), ValueError, "layout"),
    (dict(secure=True), ValueError, "seqlens_k"),
    (dict(secure=True, seqlens_k=torch.tensor([99], dtype=torch.int32)), ValueError, "seqlens_k"),
    (dict(return_lse="no"), TypeError, "return_lse"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=12, deadline=None, derandomize=True)
@given(i=st.integers(0, len(BAD) - 1), S=st.integers(1, 40), dtype=st.sampled_from([torch.float32, torch.float16]))
def test_bad_calls_raise_the_documented_exception(backend, i, S, dtype):
    kw, exc, name = BAD[i]
    q = torch.randn(1, 2, S, 32).to(dtype)
    with pytest.raises(exc, match=name):
        flashcore.attention(q, q, q, backend=backend, **kw)
