"""The Triton kernels on CPU (interpreter), fp16/fp32, against the float64 reference."""
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck

import flashcore
from conftest import rel_err

pytestmark = pytest.mark.interp
warnings.filterwarnings("ignore", category=RuntimeWarning)

TOL = {torch.float16: 2e-3, torch.float32: 1e-5}


def _rand(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)


def _check(out, lse, ref, ref_lse, dtype):
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[dtype], rel_err(out, ref)
    seen = torch.isfinite(ref_lse)
    assert torch.allclose(lse[seen].double(), ref_lse[seen], atol=1e-4, rtol=1e-5)
    assert bool((lse[~seen] == float("-inf")).all())
    # rows that see no key are exact zeros
    assert bool((out.double()[~seen] == 0).all()) if out.dim() == lse.dim() + 1 and out.shape[:-1] == lse.shape else True


CASES = [
    # B, Hq, Hkv, Sq, Sk, D, causal
    (1, 2, 2, 37, 53, 64, False),
    (1, 2, 2, 53, 37, 64, True),    # Sq > Sk causal: first rows see nothing
    (2, 4, 2, 70, 70, 32, True),    # GQA, causal square
    (1, 4, 1, 33, 100, 40, True),   # MQA, non-power-of-two D, Sk > Sq
    (1, 1, 1, 1, 1, 8, False),      # the smallest shape
    (1, 2, 1, 17, 16, 128, True),
    (1, 1, 1, 9, 40, 256, False),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("B,Hq,Hkv,Sq,Sk,D,causal", CASES)
def test_dense_matches_reference(B, Hq, Hkv, Sq, Sk, D, causal, dtype):
    gen = torch.Generator().manual_seed(hash((B, Hq, Sq, Sk, D, causal)) % 2**31)
    q, k, v = (_rand(B, h, s, D, dtype=dtype, gen=gen) for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True, backend="triton")
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=causal, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    _check(out, lse, ref, ref_lse, dtype)
    if causal and Sq > Sk:
        assert bool((out[:, :, : Sq - Sk] == 0).all())


def test_custom_scale_and_bshd_strided_views():
    gen = torch.Generator().manual_seed(7)
    base_q = _rand(2, 40, 3, 64, dtype=torch.float16, gen=gen)
    q = base_q[..., :48]                                           # strided rows, D=48
    k = _rand(2, 4, 50, 1, 48, dtype=torch.float16, gen=gen).select(1, 2)  # [B, S, 1, D], non-contiguous batch
    v = _rand(2, 50, 1, 96, dtype=torch.float16, gen=gen)[..., 48:]
    assert not q.is_contiguous() and not k.is_contiguous() and not v.is_contiguous()
    out = flashcore.attention(q, k, v, layout="bshd", causal=True, scale=0.3, backend="triton")
    ref = flashcore.reference.attention(q, k, v, layout="bshd", causal=True, scale=0.3)
    assert out.shape == q.shape and out.is_contiguous()
    assert rel_err(out, ref) < TOL[torch.float16]


def test_bhsd_transposed_view_is_not_copied():
    gen = torch.Generator().manual_seed(8)
    q = _rand(1, 24, 2, 32, dtype=torch.float32, gen=gen).transpose(1, 2)  # bhsd view of bshd storage
    k = _rand(1, 30, 2, 32, dtype=torch.float32, gen=gen).transpose(1, 2)
    v = _rand(1, 30, 2, 32, dtype=torch.float32, gen=gen).transpose(1, 2)
    out = flashcore.attention(q, k, v, backend="triton")
    assert rel_err(out, flashcore.reference.attention(q, k, v)) < TOL[torch.float32]


def test_out_buffer_is_fully_written():
    gen = torch.Generator().manual_seed(9)
    q, k, v = (_rand(1, 2, 45, 32, dtype=torch.float32, gen=gen) for _ in range(3))
    out = torch.full_like(q, float("nan"))  # poison
    res = flashcore.attention(q, k, v, causal=True, backend="triton", out=out)
    assert res is out and not torch.isnan(out).any()
    assert rel_err(out, flashcore.reference.attention(q, k, v, causal=True)) < TOL[torch.float32]


def _pack(lens, H, D, dtype, gen):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return _rand(int(cu[-1]), H, D, dtype=dtype, gen=gen), cu


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_varlen_with_empty_sequences(causal, dtype):
    gen = torch.Generator().manual_seed(11 + causal)
    lens_q, lens_k = [5, 0, 33, 17, 1], [9, 4, 33, 0, 20]
    q, cu_q = _pack(lens_q, 4, 32, dtype, gen)
    k, cu_k = _pack(lens_k, 2, 32, dtype, gen)
    v, _ = _pack(lens_k, 2, 32, dtype, gen)
    out, lse = flashcore.attention_varlen(q, k, v, cu_q, cu_k, 33, 33, causal=causal, return_lse=True, backend="triton")
    ref, ref_lse = flashcore.reference.attention_varlen(q, k, v, cu_q, cu_k, 33, 33, causal=causal, return_lse=True)
    assert lse.shape == (4, q.shape[0])
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[dtype]
    seen = torch.isfinite(ref_lse)
    assert torch.allclose(lse[seen].double(), ref_lse[seen], atol=1e-4)
    assert bool((lse[~seen] == float("-inf")).all())
    # sequence 3 has no keys: its rows are zeros
    assert bool((out[cu_q[3]:cu_q[4]] == 0).all())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(B=st.integers(1, 2), groups=st.sampled_from([(1, 1), (2, 1), (4, 2)]), Sq=st.integers(1, 48),
       Sk=st.integers(1, 48), D=st.sampled_from([8, 16, 24, 64, 80]), causal=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_property_random_shapes(B, groups, Sq, Sk, D, causal, seed):
    Hq, Hkv = groups
    gen = torch.Generator().manual_seed(seed)
    q = _rand(B, Hq, Sq, D, dtype=torch.float32, gen=gen) * 3
    k = _rand(B, Hkv, Sk, D, dtype=torch.float32, gen=gen) * 3
    v = _rand(B, Hkv, Sk, D, dtype=torch.float32, gen=gen)
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True, backend="triton")
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=causal, return_lse=True)
    _check(out, lse, ref, ref_lse, torch.float32)


# ---- secure mode -----------------------------------------------------------------------------

def _poison_padding(q, k, v, lq, lk):
    for b in range(q.shape[0]):
        q[b, :, int(lq[b]):] = float("nan")
        k[b, :, int(lk[b]):] = float("inf")
        v[b, :, int(lk[b]):] = float("nan")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("same_lengths", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_secure_matches_reference_with_poisoned_padding(causal, same_lengths, dtype):
    gen = torch.Generator().manual_seed(21 + 2 * causal + same_lengths)
    B, H, S, D = 4, 2, 45, 32
    q, k, v = (_rand(B, H, S, D, dtype=dtype, gen=gen) for _ in range(3))
    lk = torch.tensor([45, 20, 0, 1], dtype=torch.int32)
    lq = lk if same_lengths else torch.tensor([30, 45, 3, 0], dtype=torch.int32)
    _poison_padding(q, k, v, lq, lk)
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True, backend="triton", secure=True,
                                   seqlens_q=None if same_lengths else lq, seqlens_k=lk)
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=causal, return_lse=True, seqlens_q=lq, seqlens_k=lk)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[dtype]
    for b in range(B):
        assert bool((out[b, :, int(lq[b]):] == 0).all())
        assert bool((lse[b, :, int(lq[b]):] == float("-inf")).all())


@pytest.mark.parametrize("causal", [False, True])
def test_secure_logsumexp_matches_the_fast_path(causal):
    """The secure epilogue computes the logsumexp from max(row sum, 2^-125) so that log2 needs no denormal
    rescaling (a predicated multiply on the secret row sum): the values must be the fast path's. Rows that see
    no key (a zero true key length) give -inf, rows past the true query length -inf, and a NaN in a visible
    key gives NaN, as on the fast path (the clamp must not turn a NaN row sum into a finite logsumexp; the
    interpreter's row maximum propagates the NaN too, so here this checks the result, not that mechanism)."""
    gen = torch.Generator().manual_seed(31 + causal)
    B, H, S, D = 3, 2, 24, 16
    q, k, v = (_rand(B, H, S, D, dtype=torch.float32, gen=gen) for _ in range(3))
    k[2, 1, 5] = float("nan")  # batch 2, head 1: a NaN key every row from 5 on sees (causal), or every row
    full = torch.full((B,), S, dtype=torch.int32)
    _, sec = flashcore.attention(q, k, v, causal=causal, return_lse=True, backend="triton", secure=True,
                                 seqlens_k=full)
    _, fast = flashcore.attention(q, k, v, causal=causal, return_lse=True, backend="triton")
    assert torch.equal(torch.isnan(sec), torch.isnan(fast)) and bool(torch.isnan(sec[2, 1]).any())
    ok = ~torch.isnan(fast)
    assert torch.allclose(sec[ok], fast[ok], rtol=1e-6, atol=1e-6)
    lens = torch.tensor([S, 0, 7], dtype=torch.int32)
    _, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True, backend="triton", secure=True,
                                 seqlens_k=lens, seqlens_q=torch.tensor([S, S, 7], dtype=torch.int32))
    assert bool((lse[1] == float("-inf")).all()) and bool((lse[2, :, 7:] == float("-inf")).all())
    assert torch.allclose(lse[0], fast[0], rtol=1e-6, atol=1e-6)


def test_secure_padding_contents_do_not_change_output():
    gen = torch.Generator().manual_seed(5)
    B, H, S, D = 2, 2, 40, 16
    q, k, v = (_rand(B, H, S, D, dtype=torch.float32, gen=gen) for _ in range(3))
    lens = torch.tensor([23, 7], dtype=torch.int32)
    base = flashcore.attention(q, k, v, backend="triton", secure=True, seqlens_k=lens, causal=True)
    for fill in (0.0, float("nan"), float("inf"), -1e30):
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        for b in range(B):
            for t in (q2, k2, v2):
                t[b, :, int(lens[b]):] = fill
        again = flashcore.attention(q2, k2, v2, backend="triton", secure=True, seqlens_k=lens, causal=True)
        assert torch.equal(again, base), fill


def test_secure_full_length_equals_fast_path():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (_rand(2, 2, 33, 32, dtype=torch.float32, gen=gen) for _ in range(3))
    lens = torch.full((2,), 33, dtype=torch.int32)
    sec = flashcore.attention(q, k, v, backend="triton", secure=True, seqlens_k=lens, causal=True)
    fast = flashcore.attention(q, k, v, backend="triton", causal=True)
    assert rel_err(sec, fast.double()) < 1e-6


def test_secure_without_validation_clamps_out_of_range_lengths():
    gen = torch.Generator().manual_seed(12)
    q, k, v = (_rand(2, 2, 20, 16, dtype=torch.float32, gen=gen) for _ in range(3))
    wild = torch.tensor([99, -5], dtype=torch.int32)
    out = flashcore.attention(q, k, v, backend="triton", secure=True, seqlens_k=wild, validate_seqlens=False)
    clamped = flashcore.attention(q, k, v, backend="triton", secure=True, seqlens_k=torch.tensor([20, 0], dtype=torch.int32))
    assert torch.equal(out, clamped)
    assert bool((out[1] == 0).all())


def test_secure_self_attention_public_diagonal_matches_explicit_lengths():
    gen = torch.Generator().manual_seed(13)
    q, k, v = (_rand(2, 2, 50, 32, dtype=torch.float32, gen=gen) for _ in range(3))
    lens = torch.tensor([50, 17], dtype=torch.int32)
    self_attn = flashcore.attention(q, k, v, backend="triton", secure=True, causal=True, seqlens_k=lens)
    explicit = flashcore.attention(q, k, v, backend="triton", secure=True, causal=True, seqlens_k=lens,
                                   seqlens_q=lens.clone())  # not the same tensor: full loop, same answer
    assert rel_err(self_attn, explicit.double()) < 1e-6


@pytest.mark.parametrize("causal", [False, True])
def test_secure_v_zeroing_prepass_and_in_loop_agree_bitwise(causal):
    """The two ways of zeroing V's padding (pre-pass copy, or a select in the loop) are the same
    arithmetic, so they must give the same bits, and both must match the reference."""
    from dataclasses import replace
    from flashcore import ops
    from flashcore.plan.tables import INTERPRETER

    gen = torch.Generator().manual_seed(31 + causal)
    B, H, S, D = 3, 2, 37, 24
    q, k, v = (_rand(B, H, S, D, dtype=torch.float16, gen=gen) for _ in range(3))
    lens = torch.tensor([37, 11, 0], dtype=torch.int32)
    _poison_padding(q, k, v, lens, lens)
    outs = []
    for prepass in (True, False):
        cfg = replace(INTERPRETER, v_prepass=prepass)
        out, _ = ops._dense_impl(q, k, v, None, lens, causal, D ** -0.5, False, True, False, config=cfg)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    ref = flashcore.reference.attention(q, k, v, causal=causal, seqlens_q=lens, seqlens_k=lens)
    assert not torch.isnan(outs[0]).any() and rel_err(outs[0], ref) < TOL[torch.float16]


def test_secure_prepass_replaces_exactly_the_padding():
    from flashcore.launch.secure_prepass import PREPASS_WARPS, build_prepass
    from flashcore.kernels.secure.prepass import attn_secure_zero_v_padding_kernel

    gen = torch.Generator().manual_seed(41)
    B, S, Hkv, D = 3, 70, 2, 40                       # S not a block multiple, D not a power of two
    v = _rand(B, S, Hkv, D, dtype=torch.float32, gen=gen).transpose(1, 2)  # [B, H, S, D] view of bshd
    lens = torch.tensor([70, 5, 0], dtype=torch.int32)
    for b in range(B):
        v[b, :, int(lens[b]):] = float("nan")
    vs = torch.full((B, Hkv, S, D), 7.0)               # poisoned: every element must be written
    grid, args, ce = build_prepass(v, vs, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv, v_strides=v.stride()[:3])
    attn_secure_zero_v_padding_kernel[grid](*args, **ce, num_warps=PREPASS_WARPS)
    for b in range(B):
        n = int(lens[b])
        assert torch.equal(vs[b, :, :n], v[b, :, :n])
        pad = vs[b, :, n:]
        # padding: a public finite pattern, non-zero almost everywhere, never the poison
        assert bool(torch.isfinite(pad).all()) and bool((pad.abs() <= 2).all())
        if pad.numel():
            assert (pad != 0).float().mean() > 0.99 and pad.std() > 0.5
    # the pattern depends on position only: the same for any contents of V
    vs2 = torch.full_like(vs, -3.0)
    v2 = v.clone()
    for b in range(B):
        v2[b, :, int(lens[b]):] = 5.0
    grid, args, ce = build_prepass(v2, vs2, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv, v_strides=v2.stride()[:3])
    attn_secure_zero_v_padding_kernel[grid](*args, **ce, num_warps=PREPASS_WARPS)
    for b in range(B):
        n = int(lens[b])
        assert torch.equal(vs2[b, :, n:], vs[b, :, n:])


def test_secure_kv_prepass_makes_padding_keys_copies_and_weights_them_zero(monkeypatch):
    """The secure Gluon kernel's non-causal pre-pass (it masks no key) with the audit knob's plain forms
    (``-k_scaled,-w_pairs``; the defaults are in tests/test_secure_padding.py): every padding key becomes the
    sequence's first key (so its score equals a valid one), padding V rows cancel in pairs, and the
    key weights are 1 exactly on the valid keys, in all W_ROWS rows; with no valid key, K's rows are
    a finite public pattern. Nothing of the padding's contents survives."""
    from flashcore.plan import knobs
    monkeypatch.setenv(knobs.SECURE_PAD_ENV, "-k_scaled,-w_pairs")
    from flashcore.launch.secure_prepass import PREPASS_WARPS, build_prepass_kv
    from flashcore.kernels.secure.prepass import W_ROWS, attn_secure_sanitize_kv_kernel
    from flashcore.launch.secure_prepass import key_weights_shape

    gen = torch.Generator().manual_seed(43)
    B, S, Hkv, D = 3, 70, 2, 40                       # S not a block multiple, D not a power of two
    k = _rand(B, S, Hkv, D, dtype=torch.float16, gen=gen).transpose(1, 2)  # [B, H, S, D] view of bshd
    v = _rand(B, Hkv, S, D, dtype=torch.float16, gen=gen)
    lens = torch.tensor([70, 5, 0], dtype=torch.int32)

    def run(k, v):
        ks, vs = torch.full((B, Hkv, S, D), 7.0, dtype=k.dtype), torch.full((B, Hkv, S, D), 7.0, dtype=k.dtype)
        w = torch.full(key_weights_shape(B, S), 7.0, dtype=k.dtype)  # poisoned: every element must be written
        grid, args, ce = build_prepass_kv(k, v, ks, vs, w, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv,
                                          k_strides=k.stride()[:3], v_strides=v.stride()[:3])
        attn_secure_sanitize_kv_kernel[grid](*args, **ce, num_warps=PREPASS_WARPS)
        return ks, vs, w

    for b in range(B):
        n = int(lens[b])
        k[b, :, n:] = float("nan") if b != 2 else float("inf")
        v[b, :, n:] = float("nan")
    ks, vs, w = run(k, v)
    assert w.shape == (B, W_ROWS, 72)
    for b in range(B):
        n = int(lens[b])
        assert torch.equal(ks[b, :, :n], k[b, :, :n]) and torch.equal(vs[b, :, :n], v[b, :, :n])
        # V's padding: pairs of a small pattern and its exact negation (so equal probabilities cancel),
        # non-zero almost everywhere; an odd last padding row is zero
        pad = vs[b, :, n:].float()
        n_pairs = (S - n) // 2
        pairs = pad[:, :2 * n_pairs].reshape(Hkv, n_pairs, 2, D)
        assert torch.equal(pairs[:, :, 0], -pairs[:, :, 1]) and bool((pad.abs() <= 1 / 32).all())
        if n_pairs:
            assert (pairs != 0).float().mean() > 0.99
        if (S - n) % 2:
            assert bool((pad[:, -1] == 0).all())
        if n:
            assert torch.equal(ks[b, :, n:], k[b, :, :1].expand(-1, S - n, -1))
        else:
            pad = ks[b].float()
            assert bool(torch.isfinite(pad).all()) and pad.std() > 0.5
        expect = (torch.arange(72) < n).to(w.dtype)
        assert torch.equal(w[b], expect.expand(W_ROWS, -1))
    # the audit knob's zero padding (for timing comparisons): same K and weights, V's padding exactly zero
    with pytest.MonkeyPatch.context() as mp:
        from flashcore.plan import knobs
        mp.setenv(knobs.SECURE_V_PAD_ENV, "zeros")
        ks0, vs0, w0 = run(k, v)
    assert torch.equal(ks0, ks) and torch.equal(w0, w)
    for b in range(B):
        n = int(lens[b])
        assert torch.equal(vs0[b, :, :n], vs[b, :, :n]) and bool((vs0[b, :, n:] == 0).all())
    # the outputs depend on the valid rows only
    k2, v2 = k.clone(), v.clone()
    for b in range(B):
        n = int(lens[b])
        k2[b, :, n:] = -5.0
        v2[b, :, n:] = 3.0
    for x, y in zip(run(k2, v2), (ks, vs, w)):
        assert torch.equal(x, y)
