"""The float64 reference itself, against an independent float64 implementation: PyTorch's
``scaled_dot_product_attention`` (its math path on CPU float64), with masks built by hand (explicit
boolean loops, not the reference's index arithmetic), at ~1e-12.

Every kernel test trusts ``flashcore.reference``; an error there (a causal offset of the wrong sign, a
length mask one off) would be shared by the kernels it is meant to check.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import flashcore

TOL = 1e-12


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _hand_mask(Sq, Sk, causal, len_q=None, len_k=None):
    """Boolean [Sq, Sk] built element by element: query i sees key j iff j < len_k, i < len_q and, causal,
    j <= i + (len_k - len_q) (bottom-right alignment of the true lengths)."""
    len_q = Sq if len_q is None else len_q
    len_k = Sk if len_k is None else len_k
    m = torch.zeros(Sq, Sk, dtype=torch.bool)
    for i in range(len_q):
        for j in range(len_k):
            if not causal or j - i <= len_k - len_q:
                m[i, j] = True
    return m


def _sdpa(q, k, v, mask, scale):
    """SDPA (float64) with an explicit mask; rows that see no key are zeros (SDPA gives NaN there)."""
    group = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=group > 1)
    seen = mask.any(-1)
    return torch.where(seen[..., None], out, torch.zeros_like(out)), seen


def _lse(q, k, mask, scale):
    group = q.shape[1] // k.shape[1]
    s = torch.einsum("bhid,bhjd->bhij", q, k.repeat_interleave(group, dim=1)) * scale
    return torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1)


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _compare(out, lse, ref, ref_lse, seen):
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert _rel(out, ref) < TOL, _rel(out, ref)
    assert bool((out[~seen.expand_as(out[..., 0])] == 0).all())
    s = seen.expand_as(lse)
    assert torch.allclose(lse[s], ref_lse[s], rtol=TOL, atol=TOL)
    assert bool((lse[~s] == float("-inf")).all())


CASES = [
    # B, Hq, Hkv, Sq, Sk, D, causal
    (2, 3, 3, 17, 29, 16, False),
    (2, 3, 3, 23, 23, 16, True),    # square: SDPA's is_causal is the same mask
    (1, 2, 2, 11, 30, 8, True),     # Sk > Sq: bottom-right, every query sees Sk - Sq extra keys
    (1, 2, 2, 30, 11, 8, True),     # Sq > Sk: the first 19 queries see nothing
    (2, 8, 2, 19, 25, 32, True),    # GQA 4
    (1, 6, 3, 9, 9, 24, False),     # GQA 2
    (1, 4, 1, 1, 40, 64, True),     # decode-like, MQA
]


@pytest.mark.parametrize("B,Hq,Hkv,Sq,Sk,D,causal", CASES)
def test_reference_matches_sdpa_with_a_hand_built_mask(B, Hq, Hkv, Sq, Sk, D, causal):
    seed = B * 1000 + Hq * 100 + Sq * 7 + Sk
    q, k, v = _rand(B, Hq, Sq, D, seed=seed), _rand(B, Hkv, Sk, D, seed=seed + 1), _rand(B, Hkv, Sk, D, seed=seed + 2)
    scale = 0.37 if D == 16 else D ** -0.5
    out, lse = flashcore.reference.attention(q, k, v, causal=causal, scale=scale if D == 16 else None,
                                             return_lse=True)
    mask = _hand_mask(Sq, Sk, causal)
    ref, seen = _sdpa(q, k, v, mask, scale)
    _compare(out, lse, ref, _lse(q, k, mask, scale), seen)
    if causal and Sq == Sk:  # and SDPA's own causal mask agrees
        assert _rel(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                        enable_gqa=Hq != Hkv)) < TOL


def test_hand_mask_is_bottom_right():
    m = _hand_mask(3, 5, causal=True)
    assert m.tolist() == [[True, True, True, False, False],
                          [True, True, True, True, False],
                          [True, True, True, True, True]]
    assert _hand_mask(4, 2, causal=True).sum(-1).tolist() == [0, 0, 1, 2]


def test_reference_bshd_layout_and_default_scale():
    q, k, v = _rand(2, 13, 4, 32, seed=1), _rand(2, 21, 2, 32, seed=2), _rand(2, 21, 2, 32, seed=3)  # [B, S, H, D]
    out = flashcore.reference.attention(q, k, v, causal=True, layout="bshd")
    ref, _ = _sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), _hand_mask(13, 21, True), 32 ** -0.5)
    assert out.shape == q.shape and _rel(out, ref.transpose(1, 2)) < TOL


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("explicit_q", [False, True])
def test_reference_true_lengths_match_sdpa_on_the_unpadded_tensors(causal, explicit_q):
    """Secure-mode semantics: padded to S, true lengths per batch; the padding holds NaN/Inf and must not
    reach the output. Checked against SDPA run on each sequence's unpadded slice, and against the
    hand-built padded mask."""
    B, Hq, Hkv, Sq, Sk, D = 5, 4, 2, 24, 31, 16
    q, k, v = _rand(B, Hq, Sq, D, seed=7), _rand(B, Hkv, Sk, D, seed=8), _rand(B, Hkv, Sk, D, seed=9)
    lk = torch.tensor([31, 10, 0, 1, 24], dtype=torch.int32)
    lq = torch.tensor([24, 17, 5, 0, 9], dtype=torch.int32) if explicit_q else None
    eff_q = lq if explicit_q else torch.minimum(lk, torch.tensor(Sq))  # self-attention: len_q = len_k (clamped)
    for b in range(B):
        q[b, :, int(eff_q[b]):] = float("nan")
        k[b, :, int(lk[b]):] = float("inf")
        v[b, :, int(lk[b]):] = float("nan")
    out, lse = flashcore.reference.attention(q, k, v, causal=causal, return_lse=True, seqlens_q=lq, seqlens_k=lk)
    assert not torch.isnan(out).any()
    scale = D ** -0.5
    for b in range(B):
        nq, nk = int(eff_q[b]), int(lk[b])
        assert bool((out[b, :, nq:] == 0).all()) and bool((lse[b, :, nq:] == float("-inf")).all())
        if nq == 0:
            continue
        qs, ks, vs = q[b:b + 1, :, :nq], k[b:b + 1, :, :nk], v[b:b + 1, :, :nk]
        if nk == 0:
            assert bool((out[b, :, :nq] == 0).all()) and bool((lse[b, :, :nq] == float("-inf")).all())
            continue
        mask = _hand_mask(nq, nk, causal)
        ref, seen = _sdpa(qs, ks, vs, mask, scale)
        _compare(out[b:b + 1, :, :nq], lse[b:b + 1, :, :nq], ref, _lse(qs, ks, mask, scale), seen)
        # the same through the padded mask (the true lengths' bottom-right diagonal, inside the padding)
        pad_mask = _hand_mask(Sq, Sk, causal, nq, nk)
        assert torch.equal(pad_mask[:nq, :nk], mask) and not pad_mask[nq:].any() and not pad_mask[:, nk:].any()


@pytest.mark.parametrize("causal", [False, True])
def test_reference_varlen_matches_sdpa_per_sequence(causal):
    lens_q, lens_k = [5, 0, 13, 7, 1], [9, 4, 13, 0, 20]
    Hq, Hkv, D = 4, 2, 16
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q, k, v = _rand(sum(lens_q), Hq, D, seed=4), _rand(sum(lens_k), Hkv, D, seed=5), _rand(sum(lens_k), Hkv, D, seed=6)
    out, lse = flashcore.reference.attention_varlen(q, k, v, cu_q, cu_k, 13, 20, causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == (Hq, q.shape[0])
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        o, l = out[q0:q0 + nq], lse[:, q0:q0 + nq]
        if nq == 0:
            continue
        if nk == 0:
            assert bool((o == 0).all()) and bool((l == float("-inf")).all())
            continue
        qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q[q0:q0 + nq], k[k0:k0 + nk], v[k0:k0 + nk]))
        mask = _hand_mask(nq, nk, causal)
        ref, seen = _sdpa(qs, ks, vs, mask, D ** -0.5)
        _compare(o.transpose(0, 1).unsqueeze(0), l.unsqueeze(0), ref, _lse(qs, ks, mask, D ** -0.5), seen)


def test_reference_is_float64_and_exact_on_a_closed_form():
    """One key: the output is that key's value row whatever the scores; two equal keys: their mean."""
    q = _rand(1, 1, 3, 8, seed=10)
    k, v = _rand(1, 1, 1, 8, seed=11), _rand(1, 1, 1, 8, seed=12)
    out, lse = flashcore.reference.attention(q, k, v, return_lse=True)
    assert torch.equal(out, v.expand(1, 1, 3, 8))
    s = (q @ k.transpose(-1, -2)).squeeze(-1) / math.sqrt(8)
    assert torch.allclose(lse, s, rtol=0, atol=1e-15)
    k2, v2 = k.repeat(1, 1, 2, 1), torch.cat([v, -3 * v], dim=2)
    assert torch.allclose(flashcore.reference.attention(q, k2, v2), (-v).expand(1, 1, 3, 8), rtol=0, atol=1e-15)
