"""Secure mode on the interpreter where the other CPU tests do not go: true lengths (``seqlens_q`` /
``seqlens_k``) that are exact tile multiples, padded lengths that are tile multiples (the kernel's
``EVEN_N`` form: no load masks, only the secret-length select), and GQA (Hq = 2·Hkv, 4·Hkv), causal and
not, self-attention (public diagonal) and explicit query lengths.

Each output is checked against the float64 reference run on the *unpadded* tensors (the true lengths
only), row by row, and must not depend on the padding's contents at all (bitwise).
"""
import warnings

import pytest
import torch

import flashcore
from conftest import INTERPRET, rel_err

pytestmark = pytest.mark.interp
warnings.filterwarnings("ignore", category=RuntimeWarning)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
ROW_TOL = {torch.float32: 1e-4, torch.float16: 1e-2}
D = 32


def _plan(q, k, **kw):
    plan = flashcore.plan_attention(q, k, k, backend="triton", secure=True, return_lse=True, **kw)
    assert plan is not None and plan.selection.kernel == "triton_fwd", plan and plan.selection.explain()
    return plan


def _tiles() -> tuple[int, int]:
    if not INTERPRET:  # collected without the interpreter: the tests are skipped
        from flashcore.plan.tables import INTERPRETER
        return INTERPRETER.block_m, INTERPRETER.block_n
    q = torch.empty(1, 2, 64, D)
    cfg = _plan(q, q[:, :1], causal=True, seqlens_k=torch.full((1,), 64, dtype=torch.int32)).selection.config
    return cfg.block_m, cfg.block_n


BLOCK_M, BLOCK_N = _tiles()


def _inputs(B, Hq, Hkv, Sq, Sk, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=gen).to(dtype)
    k = torch.randn(B, Hkv, Sk, D, generator=gen).to(dtype)
    v = torch.randn(B, Hkv, Sk, D, generator=gen).to(dtype)
    return q, k, v


def _fill_padding(q, k, v, lq, lk, fill):
    q, k, v = q.clone(), k.clone(), v.clone()
    for b in range(q.shape[0]):
        for t, n in ((q, int(lq[b])), (k, int(lk[b])), (v, int(lk[b]))):
            pad = t[b, :, n:]
            if fill == "random":
                pad.copy_(torch.randn(pad.shape, generator=torch.Generator().manual_seed(b)) * 100)
            else:
                pad.fill_(fill)
    return q, k, v


def _secure(q, k, v, lq, lk, causal, self_attention):
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    res, lse = flashcore.attention(q, k, v, causal=causal, backend="triton", secure=True, return_lse=True, out=out,
                                   seqlens_q=None if self_attention else lq, seqlens_k=lk)
    assert res is out
    return res, lse


def _check_true_lengths(out, lse, q, k, v, lq, lk, causal, dtype):
    """Against the reference on the true lengths only (the padding sliced away); padding rows are zero."""
    failures = []
    for b in range(q.shape[0]):
        nq, nk = int(lq[b]), int(lk[b])
        tag = f"b={b} len_q={nq} len_k={nk}"
        if not bool((out[b, :, nq:] == 0).all()) or not bool((lse[b, :, nq:] == float("-inf")).all()):
            failures.append(f"{tag}: padding rows not zero / lse not -inf")
        if nq == 0:
            continue
        o, l = out[b:b + 1, :, :nq], lse[b:b + 1, :, :nq]
        if nk == 0:
            if not bool((o == 0).all()) or not bool((l == float("-inf")).all()):
                failures.append(f"{tag}: no keys, yet the rows are not zero")
            continue
        ref, ref_lse = flashcore.reference.attention(q[b:b + 1, :, :nq], k[b:b + 1, :, :nk], v[b:b + 1, :, :nk],
                                                     causal=causal, return_lse=True)
        if torch.isnan(o).any():
            failures.append(f"{tag}: NaN")
            continue
        e = rel_err(o, ref)
        rows = (o.double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
        seen = torch.isfinite(ref_lse)
        if e >= TOL[dtype] or rows.max() >= ROW_TOL[dtype]:
            failures.append(f"{tag}: rel err {e:.2e}, worst row {rows.max():.2e}")
        if not torch.equal(torch.isfinite(l), seen) or not torch.allclose(l[seen].double(), ref_lse[seen],
                                                                          atol=1e-3, rtol=1e-4):
            failures.append(f"{tag}: lse differs")
        if not bool((o[~seen] == 0).all()):
            failures.append(f"{tag}: rows that see no key are not zero")
    assert not failures, "\n".join(failures)


def _lengths(S):
    """Key lengths that are tile multiples (and the extremes): the full padded length, one row tile, one key
    tile, a key tile short of the end, nothing."""
    lk = [S, BLOCK_M, BLOCK_N, S - BLOCK_N, 0]
    return torch.tensor([min(max(x, 0), S) for x in lk], dtype=torch.int32)


GROUPS = [(2, 1), (4, 1), (4, 2)]  # Hq, Hkv: GQA 2 and 4


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hq,Hkv", GROUPS[:2])
@pytest.mark.parametrize("pad", ["even", "odd"])
def test_secure_self_attention_tile_multiple_lengths_gqa(pad, Hq, Hkv, causal):
    """seqlens_q omitted (self-attention; causal: the public-diagonal form). ``even``: the padded length is a
    multiple of both tiles (no load masks in the kernel); ``odd``: it is not, the true lengths still are."""
    S = 2 * BLOCK_M if pad == "even" else 2 * BLOCK_M + BLOCK_N // 2 + 1
    q, k, v = _inputs(5, Hq, Hkv, S, S, torch.float32, seed=11 + Hq + 2 * causal + (pad == "odd"))
    lk = _lengths(2 * BLOCK_M)
    assert all(int(n) % BLOCK_N == 0 for n in lk)
    q, k, v = _fill_padding(q, k, v, lk, lk, float("nan"))
    out, lse = _secure(q, k, v, lk, lk, causal, self_attention=True)
    _check_true_lengths(out, lse, q, k, v, lk, lk, causal, torch.float32)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hq,Hkv", [GROUPS[0], GROUPS[2]])
def test_secure_explicit_query_lengths_tile_multiples_gqa(Hq, Hkv, causal):
    """Separate query lengths (the diagonal is secret: full key loop), padded Sq != Sk, all tile multiples."""
    Sq, Sk = 2 * BLOCK_M, 2 * BLOCK_M + 2 * BLOCK_N
    q, k, v = _inputs(5, Hq, Hkv, Sq, Sk, torch.float32, seed=31 + Hq + causal)
    lq = torch.tensor([Sq, BLOCK_M, BLOCK_N, 0, Sq - BLOCK_N], dtype=torch.int32)
    lk = torch.tensor([Sk, BLOCK_N, Sk - BLOCK_N, BLOCK_M, 0], dtype=torch.int32)
    q, k, v = _fill_padding(q, k, v, lq, lk, float("inf"))
    out, lse = _secure(q, k, v, lq, lk, causal, self_attention=False)
    _check_true_lengths(out, lse, q, k, v, lq, lk, causal, torch.float32)


@pytest.mark.parametrize("causal", [False, True])
def test_secure_fp16_even_tiles_gqa4(causal):
    S = 2 * BLOCK_M
    q, k, v = _inputs(5, 4, 1, S, S, torch.float16, seed=41 + causal)
    lk = _lengths(S)
    q, k, v = _fill_padding(q, k, v, lk, lk, float("nan"))
    out, lse = _secure(q, k, v, lk, lk, causal, self_attention=True)
    _check_true_lengths(out, lse, q, k, v, lk, lk, causal, torch.float16)


@pytest.mark.parametrize("zeroing", ["prepass", "in_loop"])
@pytest.mark.parametrize("causal,self_attention", [(False, True), (True, True), (True, False)])
def test_secure_output_is_independent_of_padding_contents(causal, self_attention, zeroing, monkeypatch):
    """Bitwise the same output and lse whatever the padding holds (zeros, NaN, Inf, large random), on the
    even-tile path with GQA, for both ways of zeroing V's padding."""
    from flashcore.plan import knobs

    monkeypatch.setenv(knobs.SECURE_V_ZEROING_ENV, zeroing)
    S = 2 * BLOCK_M
    q, k, v = _inputs(5, 2, 1, S, S, torch.float32, seed=51 + causal)
    lk = _lengths(S)
    lq = lk if self_attention else torch.tensor([BLOCK_M, S, 0, BLOCK_N, S], dtype=torch.int32)
    assert _plan(q, k, causal=causal, seqlens_q=None if self_attention else lq, seqlens_k=lk) \
        .selection.config.v_prepass == (zeroing == "prepass")
    runs = []
    for fill in (0.0, float("nan"), float("inf"), "random"):
        runs.append((fill, _secure(*_fill_padding(q, k, v, lq, lk, fill), lq, lk, causal, self_attention)))
    (_, (out0, lse0)) = runs[0]
    for fill, (out, lse) in runs[1:]:
        assert torch.equal(out, out0) and torch.equal(lse, lse0), f"padding {fill} changed the output"
    _check_true_lengths(out0, lse0, q, k, v, lq, lk, causal, torch.float32)
