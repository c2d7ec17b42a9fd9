"""The Triton kernel touches exactly the memory of its arguments (interpreter, fp32 and fp16).

Two nets, used together:

* every launch runs in a strict interpreter (``conftest.strict_interpreter``): an unmasked load or store
  outside the storage of the launch's tensor arguments fails at once (a loop that runs one key tile past
  the padded length, a row bound one off on the last head), and the lanes a masked load leaves undefined
  (no ``other=``) are NaN, as garbage may be on a GPU, instead of the interpreter's zeros;
* q, k and v are strided views into larger buffers whose every other element is NaN: columns past the
  head dim, rows past the sequence length, the gaps between heads and batches. A load that reaches one
  element too far inside the buffer pulls a NaN into a score or into P·V, where ``0 · NaN = NaN`` survives
  even a zero softmax weight. The output must be finite and match the float64 reference computed on
  clean contiguous copies.
"""
import warnings

import pytest
import torch

import flashcore
from conftest import rel_err

pytestmark = pytest.mark.interp
warnings.filterwarnings("ignore", category=RuntimeWarning)


@pytest.fixture(autouse=True)
def _checked(strict_interpreter):
    yield strict_interpreter
    assert strict_interpreter, "no kernel ran under the strict interpreter"

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
    (2, 2, 1, 21, 37, 32, True, "bhsd"),    # power-of-two D, a partial key tile: row-masked loads only
    (1, 2, 2, 50, 19, 64, False, "bshd"),
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
    """Secure mode, padded length a multiple of the key tile (no load masks on keys) but not of the row tile
    (a partial last row tile: the public-diagonal loop must stop at the padded length), D not a power of
    two: the padding rows hold Inf/NaN, the views' hidden columns and rows NaN."""
    gen = torch.Generator().manual_seed(7 + causal)
    plan = flashcore.plan_attention(torch.empty(1, 1, 64, 40), torch.empty(1, 1, 64, 40), torch.empty(1, 1, 64, 40),
                                    causal=True, backend="triton", secure=True,
                                    seqlens_k=torch.full((1,), 64, dtype=torch.int32))
    bm, bn = plan.selection.config.block_m, plan.selection.config.block_n
    B, H, S, D = 3, 2, 2 * bm + bn, 40
    assert S % bn == 0 and S % bm != 0
    q, k, v = (_poisoned_view(B, H, S, D, torch.float32, gen, "bhsd") for _ in range(3))
    lens = torch.tensor([S, bm, 17], dtype=torch.int32)
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


def _tiles(secure=False):
    x = torch.empty(1, 1, 64, 40)
    kw = dict(secure=True, seqlens_k=torch.full((1,), 64, dtype=torch.int32)) if secure else {}
    cfg = flashcore.plan_attention(x, x, x, causal=True, backend="triton", **kw).selection.config
    return cfg.block_m, cfg.block_n


@pytest.mark.parametrize("zeroing", ["prepass", "in_loop"])
@pytest.mark.parametrize("causal,self_attention", [(False, True), (True, True), (True, False)])
def test_secure_contiguous_tensors_partial_row_tile(causal, self_attention, zeroing, monkeypatch):
    """Contiguous tensors (nothing past them but the allocator's neighbours): the padded length a multiple of
    the key tile, not of the row tile, so the last row tile's key loop must stop at the padded length."""
    from flashcore.plan import knobs

    monkeypatch.setenv(knobs.SECURE_V_ZEROING_ENV, zeroing)
    bm, bn = _tiles(secure=True)
    B, H, S, D = 2, 2, 2 * bm + bn, 40
    gen = torch.Generator().manual_seed(3 + causal)
    q, k, v = (torch.randn(B, H, S, D, generator=gen) for _ in range(3))
    lk = torch.tensor([S, bm + 3], dtype=torch.int32)
    lq = lk if self_attention else torch.tensor([bm, S], dtype=torch.int32)
    out = flashcore.attention(q, k, v, causal=causal, backend="triton", secure=True, seqlens_k=lk,
                              seqlens_q=None if self_attention else lq)
    ref = flashcore.reference.attention(q, k, v, causal=causal, seqlens_q=lq, seqlens_k=lk)
    assert rel_err(out, ref) < TOL[torch.float32]


@pytest.mark.parametrize("causal", [False, True])
def test_fast_and_varlen_contiguous_tensors(causal):
    bm, bn = _tiles()
    gen = torch.Generator().manual_seed(5 + causal)
    for Sq, Sk in ((2 * bm + bn, 2 * bm + bn), (bm + 1, 3 * bn), (3 * bn, bm - 1)):
        q = torch.randn(1, 2, Sq, 24, generator=gen)
        k, v = (torch.randn(1, 1, Sk, 24, generator=gen) for _ in range(2))
        out = flashcore.attention(q, k, v, causal=causal, backend="triton")
        assert rel_err(out, flashcore.reference.attention(q, k, v, causal=causal)) < TOL[torch.float32]
    lens = [bm + bn, 0, 5, 2 * bm]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    q, k, v = (torch.randn(int(cu[-1]), 2, 24, generator=gen) for _ in range(3))
    out = flashcore.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal, backend="triton")
    ref = flashcore.reference.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    assert rel_err(out, ref) < TOL[torch.float32]


def test_the_strict_interpreter_sees_an_access_past_the_end_and_undefined_lanes():
    import triton
    import triton.language as tl

    @triton.jit
    def k_over(X, Y, N: tl.constexpr, EXTRA: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(Y + offs, tl.load(X + offs + EXTRA))

    x, y = torch.arange(16.0), torch.zeros(16)
    k_over[(1,)](x, y, N=16, EXTRA=0)
    assert torch.equal(x, y)
    with pytest.raises(Exception, match="outside every argument's storage"):
        k_over[(1,)](x, y, N=16, EXTRA=1)

    @triton.jit
    def k_masked(X, Y, N: tl.constexpr, OTHER: tl.constexpr):
        offs = tl.arange(0, N)
        if OTHER:
            v = tl.load(X + offs, mask=offs < 8, other=0.0)
        else:
            v = tl.load(X + offs, mask=offs < 8)
        tl.store(Y + offs, v)

    k_masked[(1,)](x, y, N=16, OTHER=True)
    assert torch.equal(y[:8], x[:8]) and bool((y[8:] == 0).all())
    k_masked[(1,)](x, y, N=16, OTHER=False)
    assert torch.equal(y[:8], x[:8]) and bool(y[8:].isnan().all())
