"""What the secure pre-passes put where the caller's padding was (docs/security.md 3.1 and 5.4): the
tensor cores' time follows how many operands are zero or repeated, so the padding the kernel multiplies
must look like data whatever the length, and still leave the output exact. Runs the pre-pass kernels
in the interpreter (fp16: its bf16 results are wrong) and checks the secure Gluon kernel's arithmetic
on their outputs in float64 (the kernel itself needs a GPU: tests/test_secure_gluon.py)."""
from __future__ import annotations

import pytest
import torch

from conftest import rel_err
from flashcore.kernels.secure.prepass import W_ROWS, attn_secure_fill_rows_kernel, attn_secure_sanitize_kv_kernel
from flashcore.launch.secure_prepass import PREPASS_WARPS, build_fill_rows, build_prepass_kv, key_weights_shape
from flashcore.plan import knobs

EPS = 1.0 / 16  # kernels.secure.prepass.K_PAD_EPS


def _run_kv(k, v, lens):
    B, Hkv, S, D = v.shape
    ks, vs = (torch.full((B, Hkv, S, D), 7.0, dtype=k.dtype) for _ in range(2))
    w = torch.full(key_weights_shape(B, S), 7.0, dtype=k.dtype)
    grid, args, ce = build_prepass_kv(k, v, ks, vs, w, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv,
                                      k_strides=k.stride()[:3], v_strides=v.stride()[:3])
    attn_secure_sanitize_kv_kernel[grid](*args, **ce, num_warps=PREPASS_WARPS)
    return ks, vs, w


def _run_fill(x, lens):
    B, H, S, D = x.shape
    xs = torch.full((B, H, S, D), 7.0, dtype=x.dtype)
    grid, args, ce = build_fill_rows(x, xs, lens, seqlen=S, batch=B, num_heads=H, x_strides=x.stride()[:3])
    attn_secure_fill_rows_kernel[grid](*args, **ce, num_warps=PREPASS_WARPS)
    return xs


def _gluon_noncausal(q, ks, vs, w, scale):
    """The secure Gluon kernel's non-causal arithmetic in float64: no key mask, the row max over every key,
    P rounded to the input dtype for the MMAs, the row sum as P W."""
    s = q.double() @ ks.double().transpose(-1, -2) * scale
    p = torch.exp(s - s.amax(-1, keepdim=True)).to(q.dtype).double()
    return (p @ vs.double()) / (p @ w.double())


def _reference(q, k, v, n, scale):
    s = q.double() @ k[..., :n, :].double().transpose(-1, -2) * scale
    return torch.softmax(s, -1) @ v[..., :n, :].double()


@pytest.fixture
def scaled_pad(monkeypatch):
    monkeypatch.setenv(knobs.SECURE_PAD_ENV, "k_scaled,w_pairs")


def test_scaled_padding_keys_are_pairs_of_shrunk_first_keys(scaled_pad):
    """k_scaled: padding keys are pairs of public shrinks of key 0 (each element the same sign, at most
    its magnitude, at least (1 - EPS) of it), so scores vary from key to key yet stay within EPS of key
    0's; a pair's two keys are equal, so their probabilities are. Valid rows untouched; length 0 keeps
    the public pattern."""
    gen = torch.Generator().manual_seed(101)
    B, Hkv, S, D = 3, 2, 70, 64
    k = torch.randn(B, Hkv, S, D, generator=gen).half()
    v = torch.randn(B, Hkv, S, D, generator=gen).half()
    lens = torch.tensor([70, 5, 0], dtype=torch.int32)
    k[1, :, 5:] = float("nan")
    ks, vs, w = _run_kv(k, v, lens)
    assert torch.equal(ks[0], k[0]) and torch.equal(ks[1, :, :5], k[1, :, :5])
    pad, k0 = ks[1, :, 5:].float(), k[1, :, :1].float()
    assert bool(((pad * k0) >= 0).all()) and bool((pad.abs() <= k0.abs()).all())
    assert bool((pad.abs() >= (1 - EPS - 2 ** -10) * k0.abs()).all())
    pairs = pad[:, :64].reshape(Hkv, 32, 2, D)
    assert torch.equal(pairs[:, :, 0], pairs[:, :, 1])
    assert len({tuple(r.tolist()) for r in pairs[0, :, 0]}) > 16  # not one repeated key
    assert bool(torch.isfinite(ks[2].float()).all()) and ks[2].float().std() > 0.5


def test_key_weight_padding_cancels_in_pairs(scaled_pad):
    """w_pairs: the key weights are 1 on valid keys and, on padding, pairs (c, -c) with c != 0 (an odd last
    padding key, and keys past S, weigh 0): with equal probabilities per pair the row sum is exact."""
    gen = torch.Generator().manual_seed(102)
    B, Hkv, S, D = 3, 1, 77, 64
    k = torch.randn(B, Hkv, S, D, generator=gen).half()
    lens = torch.tensor([77, 6, 0], dtype=torch.int32)
    _, _, w = _run_kv(k, k.clone(), lens)
    assert w.shape == (B, W_ROWS, 80)
    for b, n in enumerate(lens.tolist()):
        row = w[b, 0].float()
        assert torch.equal(w[b], w[b, :1].expand(W_ROWS, -1))
        assert bool((row[:n] == 1).all()) and bool((row[S:] == 0).all())
        pad = row[n:S]
        n_pairs = (S - n) // 2
        pairs = pad[:2 * n_pairs].reshape(n_pairs, 2)
        assert torch.equal(pairs[:, 0], -pairs[:, 1]) and bool((pairs != 0).all())
        if (S - n) % 2:
            assert pad[-1] == 0


@pytest.mark.parametrize("lens", [[64, 1, 37], [2, 63, 64]])
def test_scaled_padding_keeps_the_secure_kernels_output_exact(scaled_pad, lens):
    """The kernel's arithmetic on the pre-pass outputs (no key mask, row max over padding keys too) gives
    attention over the valid keys only, to fp16 rounding, whatever the padding held."""
    gen = torch.Generator().manual_seed(103)
    B, H, S, D = 3, 2, 64, 64
    q, k, v = (torch.randn(B, H, S, D, generator=gen).half() for _ in range(3))
    lt = torch.tensor(lens, dtype=torch.int32)
    for b, n in enumerate(lens):
        k[b, :, n:], v[b, :, n:] = float("nan"), float("inf")
    ks, vs, w = _run_kv(k, v, lt)
    out = _gluon_noncausal(q, ks, vs, w[:, :1, :S].unsqueeze(1).transpose(-1, -2), D ** -0.5)
    for b, n in enumerate(lens):
        assert rel_err(out[b], _reference(q[b], k[b], v[b], n, D ** -0.5)) < 2e-3


def test_filled_rows_are_signed_permutations_of_row_zero(monkeypatch):
    """fill_q / fill_k: every padding row holds row 0's values in a public order with public signs (the
    magnitudes of real data, no zero unless row 0 has one), valid rows are untouched, nothing of the
    caller's padding survives, and with length 0 the rows are the public pattern."""
    gen = torch.Generator().manual_seed(104)
    B, H, S, D = 3, 2, 70, 64
    x = torch.randn(B, S, H, D, generator=gen).half().transpose(1, 2)  # a strided [B, H, S, D] view
    lens = torch.tensor([70, 9, 0], dtype=torch.int32)
    x[1, :, 9:] = 0.0
    xs = _run_fill(x, lens)
    assert torch.equal(xs[0], x[0]) and torch.equal(xs[1, :, :9], x[1, :, :9])
    row0 = x[1, :, 0].float().abs().sort(-1).values
    pad = xs[1, :, 9:].float()
    assert torch.equal(pad.abs().sort(-1).values, row0[:, None, :].expand(-1, S - 9, -1))
    assert len({tuple(r.tolist()) for r in pad[0]}) == S - 9  # every stand-in row differs
    assert bool(torch.isfinite(xs[2].float()).all()) and xs[2].float().std() > 0.5
    x2 = x.clone()
    x2[1, :, 9:] = float("nan")
    assert torch.equal(_run_fill(x2, lens), xs)


@pytest.mark.parametrize("dtype,head_dim", [(torch.float16, 128), (torch.float16, 72), (torch.float16, 256),
                                            (torch.float32, 128), (torch.float16, 64)])
def test_pre_pass_tiles_change_no_output_bit(dtype, head_dim):
    """The V and K/V pre-passes run the planned rows per program (``prepass_block_s``: 16 at D=128 in 16 bits, 8 at
    D=256 or in fp32, 64 up to D=64; perf-notes v45) and give the bits of 64-row tiles: every value is a function of
    its position, the length and the head, never of the tiling; every row and every key weight up to w_len written
    (outputs poisoned first)."""
    from flashcore.kernels.secure.prepass import attn_secure_zero_v_padding_kernel
    from flashcore.launch.secure_prepass import PREPASS_BLOCK_S, build_prepass, prepass_block_s

    expected = {(torch.float16, 128): 16, (torch.float16, 72): 16, (torch.float16, 256): 8,
                (torch.float32, 128): 8, (torch.float16, 64): 64}[(dtype, head_dim)]
    assert prepass_block_s(head_dim, torch.empty(0, dtype=dtype).element_size()) == expected
    gen = torch.Generator().manual_seed(head_dim * 7 + len(str(dtype)))
    B, Hkv, S = 3, 2, 100
    k, v = (torch.randn(B, Hkv, S, head_dim, generator=gen).to(dtype) for _ in range(2))
    lens = torch.tensor([0, 37, S], dtype=torch.int32)

    def run(rows=None):
        ks, vs = (torch.full((B, Hkv, S, head_dim), float("nan"), dtype=dtype) for _ in range(2))
        w = torch.full(key_weights_shape(B, S), float("nan"), dtype=dtype)
        grid, args, ce = build_prepass_kv(k, v, ks, vs, w, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv,
                                          k_strides=k.stride()[:3], v_strides=v.stride()[:3])
        vs1 = torch.full_like(vs, float("nan"))
        grid1, args1, ce1 = build_prepass(v, vs1, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv,
                                          v_strides=v.stride()[:3])
        assert ce["BLOCK_S"] == ce1["BLOCK_S"] == expected
        if rows is not None:
            ce, ce1 = dict(ce, BLOCK_S=rows), dict(ce1, BLOCK_S=rows)
            grid, grid1 = (-(-S // rows), grid[1]), (-(-S // rows), grid1[1])
        attn_secure_sanitize_kv_kernel[grid](*args, **ce, num_warps=PREPASS_WARPS)
        attn_secure_zero_v_padding_kernel[grid1](*args1, **ce1, num_warps=PREPASS_WARPS)
        return ks, vs, w, vs1

    planned, wide = run(), run(PREPASS_BLOCK_S)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    for a, b in zip(planned, wide):
        assert not torch.isnan(a).any()
        assert torch.equal(a.view(bits), b.view(bits))


@pytest.mark.parametrize("dtype,head_dim,page", [(torch.float16, 128, 16), (torch.float16, 64, 32),
                                                 (torch.float32, 128, 64), (torch.float16, 128, 256)])
def test_paged_v_pre_pass_copies_what_the_contiguous_one_copies(dtype, head_dim, page):
    """The V pre-pass through a paged cache's table (secure chunked prefill's V_PREPASS form, perf-notes v46) writes the
    contiguous pre-pass's bits for the same logical V: each row from its page (pages shuffled, unused table entries -1
    and past the cache's pages, which the pass clamps), the rows past each secret length the public pattern; every row
    of the copy written (poisoned first), and nothing a stale slot holds (NaN, Inf) reaches it."""
    from flashcore.kernels.secure.prepass import attn_secure_gather_v_padding_kernel, attn_secure_zero_v_padding_kernel
    from flashcore.launch.secure_prepass import build_prepass, build_prepass_paged

    gen = torch.Generator().manual_seed(page + head_dim)
    B, Hkv, width = 3, 2, 5
    S = width * page  # the capacity
    lens = torch.tensor([0, page + 3, S], dtype=torch.int32)
    v = torch.randn(B, S, Hkv, head_dim, generator=gen).to(dtype)  # the logical cache, [B, S, Hkv, D]
    for b in range(B):
        v[b, int(lens[b]):] = float("nan") if b % 2 else float("inf")
    pages = B * width + 2
    order = torch.randperm(pages, generator=gen)[:B * width].view(B, width)
    paged = torch.randn(pages, page, Hkv, head_dim, generator=gen).to(dtype)
    for b in range(B):
        for c in range(width):
            paged[order[b, c]] = v[b, c * page:(c + 1) * page]
    table = order.int().contiguous()
    table[0, 1:] = -1  # sequence 0 is empty: its unused entries point nowhere
    table[0, 0] = pages + 7

    vs = torch.full((B, Hkv, S, head_dim), float("nan"), dtype=dtype)
    grid, args, ce = build_prepass_paged(paged, vs, lens, table, seqlen_k=S, batch=B, num_heads_kv=Hkv,
                                         page_size=page, table_stride=table.stride(0))
    attn_secure_gather_v_padding_kernel[grid](*args, **ce, num_warps=PREPASS_WARPS)
    view = v.transpose(1, 2)
    ref = torch.full_like(vs, float("nan"))
    grid1, args1, ce1 = build_prepass(view, ref, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv,
                                      v_strides=view.stride()[:3])
    attn_secure_zero_v_padding_kernel[grid1](*args1, **ce1, num_warps=PREPASS_WARPS)
    assert torch.isfinite(vs).all()
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(vs.view(bits), ref.view(bits))
