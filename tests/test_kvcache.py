"""``flashcore.attention_with_kvcache`` on CPU: the Triton kernels (split, combine, append) under the interpreter,
fp16 and fp32, against the float64 reference (``flashcore.reference.attention_with_kvcache``); the reference
route (``backend="auto"`` on CPU, bf16); secure mode's contract; torch.compile.

Every input is random (never zeros), every output buffer is poisoned with NaN before a kernel writes it, and
each test draws its own seed (from its node id, printed on failure)."""
import math
import os
import re
import types
import warnings
import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashcore
from flashcore._checks import SECURE_PAGE_SIZES
from flashcore import reference as R
from conftest import INTERPRET, rel_err

warnings.filterwarnings("ignore", category=RuntimeWarning)

TOL = {torch.float16: 2e-3, torch.float32: 1e-5}  # whole-tensor relative error against the float64 reference
ROW_TOL = {torch.float16: 1e-2, torch.float32: 1e-5}  # per query row (one wrong row must not hide in the mean)
DTYPES = [torch.float16, torch.float32]
kernel = pytest.mark.interp  # tests that run the kernels (backend="triton" on CPU tensors)


@pytest.fixture
def gen(request):
    """A generator seeded from the test's node id: a different seed for every test and parameter set."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return torch.Generator().manual_seed(seed)  # gen.initial_seed() names it in failure messages


def rnd(*shape, dtype=torch.float32, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def lengths(*values):
    return torch.tensor(values, dtype=torch.int32)


def nan_like(t):
    return torch.full_like(t, float("nan"))


def to_paged(cache, page_size, gen, extra_pages=3, pages=None, table=None):
    """A paged copy of the logical cache ``cache`` [B, capacity, H, D] (capacity a multiple of the page size):
    pages in a shuffled order, ``extra_pages`` pages that no sequence uses (random contents). With ``table``
    given, reuse that page assignment (and the page pool ``pages``)."""
    B, cap, H, D = cache.shape
    width = cap // page_size
    assert width * page_size == cap
    if table is None:
        n = B * width + extra_pages
        table = torch.randperm(n, generator=gen)[: B * width].view(B, width).to(torch.int32)
        pages = rnd(n, page_size, H, D, dtype=cache.dtype, gen=gen)
    pages[table.view(-1).long()] = cache.reshape(B * width, page_size, H, D)
    return pages, table


def check(out, lse, ref, ref_lse, dtype, packed=False, what=""):
    """out/lse of a kernel call against the reference's (float64); ``what`` names the case in failures."""
    assert out.dtype == dtype and out.shape == ref.shape, what
    assert not torch.isnan(out).any(), f"{what}: NaN in the output (a row left unwritten?)"
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"{what}: relative error {err:.3g}"
    row_err = (out.double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1.0)
    bad = (row_err > ROW_TOL[dtype]).nonzero()
    assert bad.numel() == 0, f"{what}: rows {bad[:8].tolist()} off by up to {row_err.max().item():.3g}"
    seen = torch.isfinite(ref_lse)
    rows_seen = seen.t() if packed else seen.transpose(1, 2)  # [total_q, Hq] / [B, Sq, Hq], like out[..., 0]
    assert bool((out[~rows_seen] == 0).all()), f"{what}: a row that sees no key is not exactly 0"
    if lse is not None:
        assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape, what
        assert torch.equal(torch.isfinite(lse), seen), f"{what}: lse finite where the reference's is not (or -inf)"
        assert bool((lse[~seen] == float("-inf")).all()), f"{what}: a row that sees no key has lse != -inf"
        assert torch.allclose(lse[seen].double(), ref_lse[seen], atol=1e-4, rtol=1e-5), what


def run_both(q, k_cache, v_cache, *, backend="triton", **kw):
    """The call (on copies of the caches, output poisoned) and the reference (on other copies): returns
    (out, lse, caches after), (ref, ref_lse, reference's caches after)."""
    kc, vc = k_cache.clone(), v_cache.clone()
    out = nan_like(q)
    res, lse = flashcore.attention_with_kvcache(q, kc, vc, backend=backend, return_lse=True, out=out, **kw)
    assert res is out
    kr, vr = k_cache.clone(), v_cache.clone()
    ref, ref_lse = R.attention_with_kvcache(q, kr, vr, return_lse=True, **kw)
    return (res, lse, kc, vc), (ref, ref_lse, kr, vr)


# ---- contiguous cache: lengths, Sq, causal, GQA -----------------------------------------------------------


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Sq", [1, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hq,Hkv", [(4, 1), (2, 2)])
def test_contiguous_matches_reference(dtype, Sq, causal, Hq, Hkv, gen):
    """cache_seqlens 0, 1, the full capacity and random values in one batch."""
    B, S, D = 5, 96, 32
    q = rnd(B, Sq, Hq, D, dtype=dtype, gen=gen)
    kc, vc = (rnd(B, S, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    L = lengths(0, 1, S, *torch.randint(2, S, (2,), generator=gen).tolist())
    (out, lse, kc2, vc2), (ref, ref_lse, _, _) = run_both(q, kc, vc, cache_seqlens=L, causal=causal)
    check(out, lse, ref, ref_lse, dtype, what=f"seed {gen.initial_seed()} L={L.tolist()}")
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)  # no k/v: the caches are read only
    assert bool((out[0] == 0).all()) and bool((lse[0] == float("-inf")).all())  # L=0: no key at all
    if causal and Sq > 1:  # L=1: only the last query row sees the one key
        assert bool((out[1, :-1] == 0).all()) and bool(torch.isfinite(lse[1, :, -1]).all())


@kernel
@pytest.mark.parametrize("Hq,Sq,L", [
    # when GROUP does not divide BLOCK_M a tile's last row is token ((m_tile+1)*BLOCK_M - 1) // GROUP: a bound one
    # token short lost that token's last key whenever it started a new key tile (found by these cases, fixed)
    (3, 32, 43),
    (6, 11, 33),
    (3, 4, 40),
])
def test_gqa_group_not_dividing_the_query_tile(Hq, Sq, L, gen):
    """GQA groups of 3 and 6 (Hq/Hkv not a power of two): the packed query rows (token x group head) of a tile
    end in the middle of a token."""
    S, D = 64, 16
    q = rnd(1, Sq, Hq, D, gen=gen)
    kc, vc = (rnd(1, S, 1, D, gen=gen) for _ in range(2))
    (out, lse, _, _), (ref, ref_lse, _, _) = run_both(q, kc, vc, cache_seqlens=lengths(L), causal=True)
    check(out, lse, ref, ref_lse, torch.float32, what=f"Hq={Hq} Sq={Sq} L={L}")


@kernel
@pytest.mark.parametrize("causal", [False, True])
def test_sq_longer_than_cache(causal, gen):
    """Sq > cache_seqlens without append: under causal the first rows see no key (zeros, lse -inf)."""
    B, Sq, Hq, Hkv, S, D = 2, 6, 2, 1, 32, 16
    q = rnd(B, Sq, Hq, D, gen=gen)
    kc, vc = (rnd(B, S, Hkv, D, gen=gen) for _ in range(2))
    L = lengths(2, 3)
    (out, lse, _, _), (ref, ref_lse, _, _) = run_both(q, kc, vc, cache_seqlens=L, causal=causal)
    check(out, lse, ref, ref_lse, torch.float32)
    if causal:
        assert bool((lse[0, :, :4] == float("-inf")).all()) and bool(torch.isfinite(lse[0, :, 4:]).all())


# ---- paged cache ----------------------------------------------------------------------------------------

@kernel
@pytest.mark.parametrize("dtype,page_size", [
    (torch.float16, 1), (torch.float16, 16), (torch.float16, 48),
    (torch.float16, 64), (torch.float16, 128), (torch.float32, 1), (torch.float32, 16), (torch.float32, 48),
    (torch.float32, 64),
])
@pytest.mark.parametrize("Sq", [1, 3])
def test_paged_equals_contiguous(dtype, page_size, Sq, gen):
    """The same logical cache, contiguous and paged (shuffled pages, spare pages, unused table entries naming
    pages out of range): the same answer as the reference and as the contiguous cache. Page sizes that are and
    are not multiples of the key tile (a page per tile, or a page lookup per key)."""
    B, Hq, Hkv, D = 3, 4, 2, 32
    width = max(1, 144 // page_size)
    cap = width * page_size
    q = rnd(B, Sq, Hq, D, dtype=dtype, gen=gen)
    kc, vc = (rnd(B, cap, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    L = lengths(cap, int(torch.randint(1, cap, (1,), generator=gen)), min(page_size, cap - 1) or 1)
    kp, table = to_paged(kc, page_size, gen)
    vp, _ = to_paged(vc, page_size, gen, pages=rnd(*kp.shape, dtype=dtype, gen=gen), table=table)
    # entries past each sequence's last page are never read (non-secure): make them invalid
    used = (L + page_size - 1) // page_size
    table = table.clone()
    for b in range(B):
        table[b, int(used[b]):] = torch.tensor([-1, 10**6], dtype=torch.int32).repeat(width)[: width - int(used[b])]
    (out, lse, kp2, vp2), (ref, ref_lse, _, _) = run_both(q, kp, vp, cache_seqlens=L, page_table=table, causal=True)
    check(out, lse, ref, ref_lse, dtype, what=f"page {page_size} L={L.tolist()} seed {gen.initial_seed()}")
    assert torch.equal(kp2, kp) and torch.equal(vp2, vp)
    contiguous = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=L, backend="triton", out=nan_like(q))
    assert rel_err(out, contiguous.double()) < TOL[dtype]


@kernel
@pytest.mark.parametrize("paged", [False, True])
def test_cache_batch_idx_and_page_table_select_the_rows(paged, gen):
    """cache_batch_idx picks rows of a larger contiguous cache (in any order, a row twice); the same content in
    pages gives the same answer."""
    B, Sq, Hq, Hkv, S, D = 3, 2, 4, 2, 64, 32
    rows = 5
    q = rnd(B, Sq, Hq, D, gen=gen)
    kc, vc = (rnd(rows, S, Hkv, D, gen=gen) for _ in range(2))
    idx = lengths(4, 0, 4)
    L = lengths(50, 9, 64)
    (out, lse, kc2, vc2), (ref, ref_lse, _, _) = run_both(q, kc, vc, cache_seqlens=L, cache_batch_idx=idx)
    check(out, lse, ref, ref_lse, torch.float32)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
    gathered = flashcore.attention_with_kvcache(q, kc[idx.long()], vc[idx.long()], cache_seqlens=L,
                                                backend="triton", out=nan_like(q))
    assert rel_err(out, gathered.double()) < 1e-6
    if paged:
        kp, table = to_paged(kc[idx.long()], 16, gen)
        vp, _ = to_paged(vc[idx.long()], 16, gen, pages=rnd(*kp.shape, gen=gen), table=table)
        res = flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=L, page_table=table, backend="triton",
                                               out=nan_like(q))
        assert rel_err(res, ref) < TOL[torch.float32]


# ---- append, then attend --------------------------------------------------------------------------------


def _appended_slots(L, n, cap, B, table=None, page_size=None, idx=None, rows=None):
    """Boolean mask over the physical cache's [rows, tokens] of the slots the append writes."""
    if table is None:
        m = torch.zeros(rows, cap, dtype=torch.bool)
        for b in range(B):
            r = int(idx[b]) if idx is not None else b
            m[r, int(L[b]): int(L[b]) + int(n[b])] = True
        return m
    m = torch.zeros(rows, page_size, dtype=torch.bool)
    for b in range(B):
        for p in range(int(L[b]), int(L[b]) + int(n[b])):
            m[int(table[b, p // page_size]), p % page_size] = True
    return m


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Sq", [1, 4])
@pytest.mark.parametrize("layout", ["contiguous", "batch_idx", "paged16", "paged1"])
def test_append_then_attend(dtype, Sq, layout, gen):
    """k/v are written at cache_seqlens (up to the cache's last slot) and attended; the caches afterwards are
    the reference's, and nothing outside the appended slots changed."""
    B, Hq, Hkv, D, cap = 3, 4, 2, 32, 48
    q = rnd(B, Sq, Hq, D, dtype=dtype, gen=gen)
    k, v = (rnd(B, Sq, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    L = lengths(0, 17, cap - Sq)  # empty, middle, ends at the capacity
    kw = dict(cache_seqlens=L, k=k, v=v, causal=True)
    logical_k, logical_v = (rnd(B, cap, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    table = page_size = idx = None
    if layout == "contiguous":
        kc, vc = logical_k, logical_v
    elif layout == "batch_idx":
        idx = lengths(2, 4, 0)
        kc, vc = (rnd(5, cap, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
        kw["cache_batch_idx"] = idx
    else:
        page_size = int(layout[5:])
        kc, table = to_paged(logical_k, page_size, gen)
        vc, _ = to_paged(logical_v, page_size, gen, pages=rnd(*kc.shape, dtype=dtype, gen=gen), table=table)
        kw["page_table"] = table
    L_before = L.clone()
    (out, lse, kc2, vc2), (ref, ref_lse, kr, vr) = run_both(q, kc, vc, **kw)
    check(out, lse, ref, ref_lse, dtype, what=f"{layout} seed {gen.initial_seed()}")
    assert torch.equal(L, L_before), "cache_seqlens was modified"
    assert torch.equal(kc2, kr) and torch.equal(vc2, vr), "the caches after the call differ from the reference's"
    slots = _appended_slots(L, [Sq] * B, cap, B, table, page_size, idx, rows=kc.shape[0])
    assert torch.equal(kc2[~slots], kc[~slots]) and torch.equal(vc2[~slots], vc[~slots])
    assert not torch.equal(kc2[slots], kc[slots])
    # the new tokens are in the cache: attending to it without k/v gives the same answer
    again = flashcore.attention_with_kvcache(q, kc2, vc2, backend="triton", out=nan_like(q),
                                             **dict(kw, k=None, v=None, cache_seqlens=L + Sq))
    assert torch.equal(again, out)


@kernel
@pytest.mark.parametrize("paged", [False, True])
def test_every_append_lands_before_any_sequence_attends(paged, gen):
    """"k/v are first written into the cache, then attended": where sequences share a cache row (or page),
    a sequence sees the tokens another one appends inside its visible range, whatever the batch order; the
    reference agrees with the kernels."""
    Hq, Hkv, D, S = 2, 1, 16, 32
    q = rnd(2, 1, Hq, D, gen=gen)
    k, v = (rnd(2, 1, Hkv, D, gen=gen) for _ in range(2))
    kc, vc = (rnd(1, S, Hkv, D, gen=gen) for _ in range(2))
    L = lengths(10, 4)  # sequence 1 appends at slot 4, which sequence 0 (length 10) sees
    share = dict(page_table=lengths(0, 1, 0, 1).view(2, 2)) if paged else dict(cache_batch_idx=lengths(0, 0))
    if paged:
        kc, vc = kc.view(2, S // 2, Hkv, D), vc.view(2, S // 2, Hkv, D)
    (out, lse, kc2, vc2), (ref, ref_lse, kr, vr) = run_both(q, kc, vc, cache_seqlens=L, k=k, v=v, **share)
    check(out, lse, ref, ref_lse, torch.float32)
    assert torch.equal(kc2, kr) and torch.equal(vc2, vr)
    after = flashcore.attention_with_kvcache(q[:1], kc2, vc2, cache_seqlens=lengths(11), backend="triton",
                                             **({"page_table": share["page_table"][:1]} if paged else {}))
    assert rel_err(out[:1], after.double()) < 1e-6


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 3])
def test_chunked_prefill_several_query_tiles(dtype, splits, gen):
    """A chunk of 24 new tokens x a group of 4 heads = 96 query rows: two query tiles with different causal key
    bounds, split or not, appended into a paged cache first. Sequence 1's first tile of 64 rows (tokens 0-15)
    sees keys up to 127 and its second tile up to 135: a bound taken from the wrong tile stops at a multiple of
    every key-tile size."""
    B, Sq, Hq, Hkv, D, ps, width = 2, 24, 8, 2, 32, 16, 9
    q = rnd(B, Sq, Hq, D, dtype=dtype, gen=gen)
    k, v = (rnd(B, Sq, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    kc, table = to_paged(rnd(B, ps * width, Hkv, D, dtype=dtype, gen=gen), ps, gen)
    vc, _ = to_paged(rnd(B, ps * width, Hkv, D, dtype=dtype, gen=gen), ps, gen,
                     pages=rnd(*kc.shape, dtype=dtype, gen=gen), table=table)
    (out, lse, kc2, vc2), (ref, ref_lse, kr, vr) = run_both(q, kc, vc, cache_seqlens=lengths(0, 112), k=k, v=v,
                                                            page_table=table, num_splits=splits)
    check(out, lse, ref, ref_lse, dtype, what=f"seed {gen.initial_seed()}")
    assert torch.equal(kc2, kr) and torch.equal(vc2, vr)


@kernel
def test_append_at_the_last_slot_of_a_full_cache(gen):
    """cache_seqlens + Sq == capacity exactly, one sequence appending into its last page's last slot."""
    B, Sq, Hq, Hkv, D, ps, width = 2, 1, 2, 2, 16, 16, 3
    cap = ps * width
    q = rnd(B, Sq, Hq, D, gen=gen)
    k, v = (rnd(B, Sq, Hkv, D, gen=gen) for _ in range(2))
    kp, table = to_paged(rnd(B, cap, Hkv, D, gen=gen), ps, gen)
    vp, _ = to_paged(rnd(B, cap, Hkv, D, gen=gen), ps, gen, pages=rnd(*kp.shape, gen=gen), table=table)
    L = lengths(cap - 1, 0)
    (out, lse, kc2, vc2), (ref, ref_lse, kr, vr) = run_both(q, kp, vp, cache_seqlens=L, k=k, v=v,
                                                            page_table=table)
    check(out, lse, ref, ref_lse, torch.float32)
    assert torch.equal(kc2, kr) and torch.equal(vc2, vr)
    assert torch.equal(kc2[int(table[0, -1]), ps - 1], k[0, 0])


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_odd_head_counts_head_dim_and_scale(dtype, gen):
    """Hkv=3 (the append kernel's head block is padded to 4), D=40 (not a power of two), an explicit scale."""
    B, Sq, Hq, Hkv, D, S = 2, 3, 6, 3, 40, 50
    q = rnd(B, Sq, Hq, D, dtype=dtype, gen=gen)
    kc, vc = (rnd(B, S, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    k, v = (rnd(B, Sq, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    (out, lse, kc2, vc2), (ref, ref_lse, kr, vr) = run_both(q, kc, vc, cache_seqlens=lengths(47, 12), k=k, v=v,
                                                            scale=0.3, num_splits=2)
    check(out, lse, ref, ref_lse, dtype)
    assert torch.equal(kc2, kr) and torch.equal(vc2, vr)


@kernel
@pytest.mark.parametrize("case", ["contiguous", "paged1", "paged16", "paged64-secure", "packed-append",
                                  "leftpad-splits", "fp8-append-paged16"])
def test_kernels_stay_inside_their_buffers(case, strict_interpreter, gen):
    """Under the strict interpreter (every unmasked access inside an argument's storage, masked-off lanes
    undefined): each layout's kernels (append, split, combine) touch only their own buffers and never depend
    on a masked-off lane."""
    B, Sq, Hq, Hkv, D, cap = 2, 2, 4, 2, 32, 64
    dtype = torch.float16 if "fp8" in case else torch.float32
    kw = dict(cache_seqlens=lengths(cap - Sq, 9), causal=True, num_splits=3 if "splits" in case else 0)
    q = rnd(B, Sq, Hq, D, dtype=dtype, gen=gen)
    logical = [rnd(B, cap, Hkv, D, gen=gen) for _ in range(2)]
    if "fp8" in case:
        logical = [t.to(torch.float8_e4m3fn) for t in logical]
        kw.update(k_descale=torch.rand(B, Hkv, generator=gen) + 0.5, v_descale=torch.rand(B, Hkv, generator=gen) + 0.5)
    kc, vc = logical
    if "paged" in case:
        ps = int(re.search(r"paged(\d+)", case).group(1))
        kc, table = to_paged(logical[0], ps, gen, extra_pages=0)
        vc, _ = to_paged(logical[1], ps, gen, pages=torch.empty_like(kc), table=table)
        kw["page_table"] = table
    if "packed" in case:
        q, cu = _pack([2, 1], Hq, D, dtype=dtype, gen=gen)
        kw.update(cu_seqlens_q=cu, max_seqlen_q=2)
    if "append" in case:
        n = q.shape[0] if "packed" in case else None
        shape = (n, Hkv, D) if n is not None else (B, Sq, Hkv, D)
        kw["k"], kw["v"] = (rnd(*shape, gen=gen).to(kc.dtype) for _ in range(2))
    if "secure" in case:
        kw["secure"] = True
    if "leftpad" in case:
        kw["cache_leftpad"] = lengths(5, 9)
    (out, lse, kc2, vc2), (ref, ref_lse, kr, vr) = run_both(q, kc, vc, **kw)
    check(out, lse, ref, ref_lse, dtype, packed="packed" in case)
    assert torch.equal(kc2.view(torch.uint8), kr.view(torch.uint8))
    assert strict_interpreter and set(strict_interpreter) <= {"kv_append_kernel", "decode_split_kernel",
                                                              "decode_combine_kernel"}


@kernel
@pytest.mark.parametrize("page_size", [None, 64, 5])  # contiguous; a page per key tile; a page lookup per key
def test_unvalidated_wild_values_stay_inside_the_cache(page_size, strict_interpreter, gen):
    """validate=False (what CUDA-graph replays and torch.compile get): lengths, leftpads, page-table entries and
    batch indices out of range give some answer, never an access outside the cache (the kernels clamp), and
    the append writes nothing outside the cache."""
    B, Sq, Hq, Hkv, D, width = 3, 2, 2, 1, 16, 2
    ps = page_size or 16
    q = rnd(B, Sq, Hq, D, gen=gen)
    k, v = (rnd(B, Sq, Hkv, D, gen=gen) for _ in range(2))
    L = lengths(10**6, -7, 2 * ps - 1)
    if page_size:
        kc, vc = (rnd(5, ps, Hkv, D, gen=gen) for _ in range(2))
        kw = dict(page_table=torch.tensor([[0, 99], [-3, 1], [2, 10**6]], dtype=torch.int32))
    else:
        kc, vc = (rnd(2, ps * width, Hkv, D, gen=gen) for _ in range(2))
        kw = dict(cache_batch_idx=lengths(5, -1, 1), cache_leftpad=lengths(-4, 10**5, 40))
    for secure in (False, True) if page_size in (None, *SECURE_PAGE_SIZES) else (False,):
        out = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=L, backend="triton", validate=False,
                                               secure=secure, num_splits=2, out=nan_like(q), **kw)
        assert not torch.isnan(out).any()
    kc0 = kc.clone()
    flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=L, k=k, v=v, backend="triton", validate=False, **kw)
    changed = (kc != kc0).any(-1).any(-1)
    assert changed.sum() <= 2 * Sq  # at most the slots of sequences with an in-range position
    assert set(strict_interpreter) <= {"kv_append_kernel", "decode_split_kernel", "decode_combine_kernel"}


@kernel
@pytest.mark.parametrize("append", [False, True])
def test_unvalidated_wild_cu_seqlens_q_stay_inside_q(append, strict_interpreter, gen):
    q = rnd(5, 2, 16, gen=gen)
    kc, vc = (rnd(2, 32, 1, 16, gen=gen) for _ in range(2))
    kw = dict(k=rnd(5, 1, 16, gen=gen), v=rnd(5, 1, 16, gen=gen)) if append else {}
    flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths(3, 9), cu_seqlens_q=lengths(0, 3, 50),
                                     max_seqlen_q=3, backend="triton", validate=False, **kw)


# ---- packed queries, leftpad ----------------------------------------------------------------------------


def _pack(lens, *rest, dtype, gen):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return rnd(int(cu[-1]), *rest, dtype=dtype, gen=gen), cu


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("append", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_packed_queries(dtype, append, paged, gen):
    """q [total_q, Hq, D] with cu_seqlens_q (a zero-length sequence among them); lse [Hq, total_q]; with append
    each sequence writes its own number of tokens."""
    lens_q = [3, 0, 5, 1]
    B, Hq, Hkv, D, cap = len(lens_q), 4, 2, 32, 64
    q, cu = _pack(lens_q, Hq, D, dtype=dtype, gen=gen)
    kw = dict(cu_seqlens_q=cu, max_seqlen_q=5, causal=True)
    L = lengths(20, 7, 0, cap - 1)  # with append, sequence 3 writes its one token into the last slot
    if append:
        kw["k"], kw["v"] = (rnd(q.shape[0], Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    kc, vc = (rnd(B, cap, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    table = None
    if paged:
        kc, table = to_paged(kc, 16, gen)
        vc, _ = to_paged(vc, 16, gen, pages=rnd(*kc.shape, dtype=dtype, gen=gen), table=table)
        kw["page_table"] = table
    (out, lse, kc2, vc2), (ref, ref_lse, kr, vr) = run_both(q, kc, vc, cache_seqlens=L, **kw)
    assert lse.shape == (Hq, q.shape[0])
    check(out, lse, ref, ref_lse, dtype, packed=True, what=f"seed {gen.initial_seed()}")
    assert torch.equal(kc2, kr) and torch.equal(vc2, vr)
    if append:
        slots = _appended_slots(L, lens_q, cap, B, table, 16 if paged else None, rows=kc.shape[0])
        assert torch.equal(kc2[~slots], kc[~slots])
    # the same as one padded call per sequence
    for b, n in enumerate(lens_q):
        if n == 0 or append:
            continue
        sl = slice(int(cu[b]), int(cu[b + 1]))
        one = flashcore.attention_with_kvcache(
            q[sl].unsqueeze(0), kc if paged else kc[b:b + 1], vc if paged else vc[b:b + 1], cache_seqlens=L[b:b + 1],
            page_table=table[b:b + 1] if paged else None, backend="triton", out=nan_like(q[sl].unsqueeze(0)))
        assert rel_err(out[sl], one[0].double()) < TOL[dtype]


@kernel
def test_packed_rows_past_the_last_sequence_are_zero(gen):
    Hq, Hkv, D = 2, 1, 16
    q = rnd(7, Hq, D, gen=gen)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)  # q has 7 rows, the sequences end at 5
    kc, vc = (rnd(2, 32, Hkv, D, gen=gen) for _ in range(2))
    (out, lse, _, _), (ref, ref_lse, _, _) = run_both(q, kc, vc, cache_seqlens=lengths(10, 32), cu_seqlens_q=cu,
                                                      max_seqlen_q=3)
    check(out, lse, ref, ref_lse, torch.float32, packed=True)


@kernel
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Sq", [1, 4])
@pytest.mark.parametrize("append", [False, True])
def test_cache_leftpad(causal, Sq, append, gen):
    """Sequence b attends to [cache_leftpad[b], L_b): leftpad 0, inside, equal to the length (no key); the
    left padding holds NaN, which must not reach the output."""
    B, Hq, Hkv, D, S = 4, 4, 2, 32, 80
    q = rnd(B, Sq, Hq, D, gen=gen)
    kc, vc = (rnd(B, S, Hkv, D, gen=gen) for _ in range(2))
    L = lengths(40, 70, 5, 33)
    pad = lengths(0, 37, 5, 32)
    for b in range(B):
        kc[b, : int(pad[b])] = float("nan")
        vc[b, : int(pad[b])] = float("inf")
    kw = dict(cache_seqlens=L, cache_leftpad=pad, causal=causal)
    if append:
        kw["k"], kw["v"] = (rnd(B, Sq, Hkv, D, gen=gen) for _ in range(2))
    (out, lse, kc2, vc2), (ref, ref_lse, kr, vr) = run_both(q, kc, vc, **kw)
    check(out, lse, ref, ref_lse, torch.float32, what=f"seed {gen.initial_seed()}")
    assert torch.equal(kc2.nan_to_num(), kr.nan_to_num()) and torch.equal(vc2.nan_to_num(), vr.nan_to_num())
    if not append:
        assert bool((out[2] == 0).all())  # leftpad == length: sees nothing
        split, split_lse = flashcore.attention_with_kvcache(q, kc, vc, backend="triton", num_splits=3,
                                                            return_lse=True, out=nan_like(q), **kw)
        check(split, split_lse, ref, ref_lse, torch.float32, what="3 splits")


# ---- split-KV -------------------------------------------------------------------------------------------


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "paged", "packed"])
def test_split_counts_agree(dtype, layout, gen):
    """num_splits 1, 3, 7 (more splits than some sequences have tiles) and auto give the same output and lse."""
    B, Sq, Hq, Hkv, D, cap = 3, 2, 4, 2, 32, 192
    L = lengths(cap, 70, 3)
    kc, vc = (rnd(B, cap, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    kw = dict(cache_seqlens=L, causal=True)
    if layout == "packed":
        q, cu = _pack([2, 1, 2], Hq, D, dtype=dtype, gen=gen)
        kw.update(cu_seqlens_q=cu, max_seqlen_q=2)
    else:
        q = rnd(B, Sq, Hq, D, dtype=dtype, gen=gen)
    if layout == "paged":
        kc, table = to_paged(kc, 64, gen)
        vc, _ = to_paged(vc, 64, gen, pages=rnd(*kc.shape, dtype=dtype, gen=gen), table=table)
        kw["page_table"] = table
    ref, ref_lse = R.attention_with_kvcache(q, kc, vc, return_lse=True, **kw)
    outs = {}
    for splits in (1, 3, 7, 0):
        out, lse = flashcore.attention_with_kvcache(q, kc, vc, backend="triton", num_splits=splits, return_lse=True,
                                                   out=nan_like(q), **kw)
        check(out, lse, ref, ref_lse, dtype, packed=layout == "packed", what=f"num_splits={splits}")
        outs[splits] = (out, lse)
    for splits in (3, 7, 0):
        assert rel_err(outs[splits][0], outs[1][0].double()) < TOL[dtype]
        assert torch.allclose(outs[splits][1], outs[1][1], atol=1e-5, rtol=1e-5)


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D, splits, tiles", [(256, 40, 20), (16, 100, 80)])  # 3 and 2 chunks of BLOCK_S splits
def test_combine_merges_more_splits_than_one_chunk(dtype, D, splits, tiles, gen):
    """More splits than the combine reads at once: chunks merged into a running maximum, including chunks whose
    splits all saw no key (past the cache's tiles, or before a left pad) and a row that saw no key at all."""
    from flashcore.launch.triton_decode import combine_block_s

    assert splits > combine_block_s(D)
    B, Hq, Hkv, cap = 4, 2, 1, tiles * (64 if D > 128 else 128)  # a split per key tile (plan.decode.choose_config)
    kc, vc = (rnd(B, cap, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    q = rnd(B, 1, Hq, D, dtype=dtype, gen=gen)
    # sequence 1's keys end in the first chunk, sequence 3's start past it (its first chunk saw none), 2 has none
    kw = dict(cache_seqlens=lengths(cap, cap * 7 // 10, 0, cap * 15 // 16),
              cache_leftpad=lengths(0, cap // 2, 0, cap * 7 // 8), causal=True)
    ref, ref_lse = R.attention_with_kvcache(q, kc, vc, return_lse=True, **kw)
    out, lse = flashcore.attention_with_kvcache(q, kc, vc, backend="triton", num_splits=splits, return_lse=True,
                                               out=nan_like(q), **kw)
    check(out, lse, ref, ref_lse, dtype, what=f"num_splits={splits}")
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()


@kernel
def test_split_plans_launch_the_combine(ran):
    from flashcore.plan.decode import DecodePlan

    seen = []
    real = DecodePlan.__call__

    def spy(self, *a, **k):
        seen.append(self)
        return real(self, *a, **k)

    q = torch.randn(1, 1, 2, 16)
    kc, vc = torch.randn(1, 64, 2, 16), torch.randn(1, 64, 2, 16)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DecodePlan, "__call__", spy)
        for splits in (1, 3):
            flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths(50), num_splits=splits, backend="triton")
    assert [p.config.num_splits for p in seen] == [1, 3]
    assert seen[0].combine is None and seen[1].combine is not None
    assert [name for name, _ in ran.kernels] == ["triton_decode"] * 2 and ran.reference == 0


# ---- FP8 cache ------------------------------------------------------------------------------------------


@kernel
@pytest.mark.parametrize("append", [False, True])
def test_fp8_cache_with_descales(append, gen):
    B, Sq, Hq, Hkv, D, S = 2, 2, 4, 2, 32, 48
    q = rnd(B, Sq, Hq, D, dtype=torch.float16, gen=gen)
    kc, vc = (rnd(B, S, Hkv, D, gen=gen).to(torch.float8_e4m3fn) for _ in range(2))
    kd, vd = (torch.rand(B, Hkv, generator=gen) + 0.25 for _ in range(2))
    kw = dict(cache_seqlens=lengths(30, 9), k_descale=kd, v_descale=vd)
    if append:
        kw["k"], kw["v"] = (rnd(B, Sq, Hkv, D, gen=gen).to(torch.float8_e4m3fn) for _ in range(2))
    (out, lse, kc2, vc2), (ref, ref_lse, kr, vr) = run_both(q, kc, vc, **kw)
    check(out, lse, ref, ref_lse, torch.float16)
    assert torch.equal(kc2.view(torch.uint8), kr.view(torch.uint8))
    assert torch.equal(vc2.view(torch.uint8), vr.view(torch.uint8))


@kernel
@pytest.mark.parametrize("layout,D,splits,secure", [("paged", 40, 3, False), ("paged", 32, 1, True),
                                                   ("contiguous", 24, 2, True), ("contiguous", 40, 0, False)])
def test_fp8_cache_pairs_pages_splits_and_secure(layout, D, splits, secure, gen):
    """The kernel reads an e4m3 cache as uint16 pairs of head-dim columns and widens the even and the odd column
    apart: head dims whose pairs do not fill the tile (24 of 32, 40 of 64), shuffled pages, splits, secure mode,
    and values over e4m3's range (x 64: up to its largest, 448, and its subnormals at x 1/64)."""
    B, Sq, Hq, Hkv, cap = 2, 2, 4, 2, 64
    q = rnd(B, Sq, Hq, D, dtype=torch.float16, gen=gen)
    scale = torch.tensor([64.0, 1 / 64])[torch.randint(0, 2, (B, cap, Hkv, D), generator=gen)]
    kc, vc = ((rnd(B, cap, Hkv, D, gen=gen) * scale).to(torch.float8_e4m3fn) for _ in range(2))
    kd, vd = (torch.rand(B, Hkv, generator=gen) + 0.25 for _ in range(2))
    kw = dict(cache_seqlens=lengths(cap, 37), k_descale=kd, v_descale=vd, num_splits=splits, secure=secure)
    if layout == "paged":
        kc, table = to_paged(kc, 16, gen)
        vc, _ = to_paged(vc, 16, gen, pages=rnd(*kc.shape, gen=gen).to(torch.float8_e4m3fn), table=table)
        kw["page_table"] = table
    (out, lse, _, _), (ref, ref_lse, _, _) = run_both(q, kc, vc, **kw)
    check(out, lse, ref, ref_lse, torch.float16, what=f"{layout} D{D} splits {splits} secure {secure}")


@kernel
@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_fp8_cache_nan_where_a_key_is_seen_and_only_there(layout, secure, gen):
    """e4m3fn's NaN (0x7F/0xFF) in the cache: behind the lengths (stale slots) it must not reach the output; at a
    visible key it must, in the columns that hold it, as in the float64 reference. (Secure mode zeroes V's NaNs by
    value and counts the visible ones in a second product; a select on visibility cost a shared-memory round trip.)"""
    B, Sq, Hq, Hkv, D, cap = 2, 1, 4, 2, 32, 64
    q = rnd(B, Sq, Hq, D, dtype=torch.float16, gen=gen)
    kc, vc = (rnd(B, cap, Hkv, D, gen=gen).to(torch.float8_e4m3fn) for _ in range(2))
    nan = torch.tensor([0x7F, 0xFF], dtype=torch.uint8)
    kc.view(torch.uint8)[0, 50:, :, :] = nan[0]  # stale K behind sequence 0's length 40, both signs of V
    vc.view(torch.uint8)[0, 50:, 0, :] = nan[0]
    vc.view(torch.uint8)[0, 45, 1, 7] = nan[1]
    vc.view(torch.uint8)[1, 10, 1, 5] = nan[1]  # a visible NaN: sequence 1, K/V head 1, column 5
    vc.view(torch.uint8)[1, 20, 0, 12] = nan[0]  # and one in an even column of head 0
    kw = dict(cache_seqlens=lengths(40, cap), k_descale=torch.full((B, Hkv), 0.5),
              v_descale=torch.full((B, Hkv), 0.75), secure=secure)
    if layout == "paged":
        kc, table = to_paged(kc, 16, gen)
        vc, _ = to_paged(vc, 16, gen, pages=rnd(*kc.shape, gen=gen).to(torch.float8_e4m3fn), table=table)
        kw["page_table"] = table
    (out, _, _, _), (ref, _, _, _) = run_both(q, kc, vc, **kw)
    nan_out, nan_ref = torch.isnan(out), torch.isnan(ref)
    assert nan_ref[1, 0, 2:, 5].all() and nan_ref[1, 0, :2, 12].all() and int(nan_ref.sum()) == 4  # the premise
    assert torch.equal(nan_out, nan_ref), f"NaN at {nan_out.nonzero().tolist()}, reference {nan_ref.nonzero().tolist()}"
    fin = ~nan_ref
    assert rel_err(out[fin], ref[fin]) < TOL[torch.float16]


# ---- secure mode ----------------------------------------------------------------------------------------


def _secure_case(layout, dtype, gen, Sq=2, causal=True):
    """A secure call's inputs: (q, k_cache, v_cache, kw, L, how to poison the padding, table or None)."""
    B, Hq, Hkv, D, cap = 3, 4, 2, 32, 96
    q = rnd(B, Sq, Hq, D, dtype=dtype, gen=gen)
    L = lengths(cap, 41, 0)
    kw = dict(cache_seqlens=L, causal=causal, secure=True)
    kc, vc = (rnd(B, cap, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    table = None
    if layout == "paged":
        kc, table = to_paged(kc, 16, gen)
        vc, _ = to_paged(vc, 16, gen, pages=rnd(*kc.shape, dtype=dtype, gen=gen), table=table)
        used = (L + 15) // 16
        for b in range(B):  # unused entries: any real page (secure mode reads every entry)
            table[b, int(used[b]):] = torch.randint(0, kc.shape[0], (table.shape[1] - int(used[b]),), generator=gen,
                                                    dtype=torch.int32)
        kw["page_table"] = table
    elif layout == "batch_idx":
        kc, vc = (rnd(4, cap, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
        kw["cache_batch_idx"] = lengths(3, 0, 2)
    elif layout == "leftpad":
        kw["cache_leftpad"] = lengths(10, 40, 0)

    def padding_slots():
        """[rows, tokens] mask of the slots no sequence sees (past its length, before its leftpad, or unused
        pages)."""
        if table is not None:
            m = torch.ones(kc.shape[0], kc.shape[1], dtype=torch.bool)
            for b in range(B):
                for p in range(int(L[b])):
                    m[int(table[b, p // 16]), p % 16] = False
            return m
        m = torch.ones(kc.shape[0], cap, dtype=torch.bool)
        for b in range(B):
            r = int(kw["cache_batch_idx"][b]) if "cache_batch_idx" in kw else b
            lo = int(kw["cache_leftpad"][b]) if "cache_leftpad" in kw else 0
            m[r, lo:int(L[b])] = False
        return m

    return q, kc, vc, kw, padding_slots()


SECURE_LAYOUTS = ["contiguous", "paged", "batch_idx", "leftpad"]


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", SECURE_LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_secure_matches_reference(dtype, layout, causal, gen):
    q, kc, vc, kw, _ = _secure_case(layout, dtype, gen, causal=causal)
    (out, lse, kc2, vc2), (ref, ref_lse, _, _) = run_both(q, kc, vc, **kw)
    check(out, lse, ref, ref_lse, dtype, what=f"secure {layout} seed {gen.initial_seed()}")
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
    fast, fast_lse = flashcore.attention_with_kvcache(q, kc, vc, backend="triton", return_lse=True, out=nan_like(q),
                                                      **dict(kw, secure=False))
    assert rel_err(out, fast.double()) < TOL[dtype]


@kernel
@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("layout", SECURE_LAYOUTS)
def test_padding_contents_do_not_change_a_bit(secure, layout, gen):
    """Whatever the cache holds where no sequence looks (past the length, before the leftpad, pages no sequence
    uses): random values, NaN, +-Inf; and whatever real page the unused page-table entries name (secure mode
    reads every entry). The output and lse keep every bit (secure mode by contract; the fast path never loads
    those slots)."""
    q, kc, vc, kw, pad = _secure_case(layout, torch.float16, gen, Sq=3)
    kw["secure"] = secure

    def call(kc, vc, **over):
        return flashcore.attention_with_kvcache(q, kc, vc, backend="triton", return_lse=True, num_splits=3,
                                                out=nan_like(q), **dict(kw, **over))

    base, base_lse = call(kc, vc)
    assert not torch.isnan(base).any()
    fills = [lambda t: rnd(*t.shape, dtype=t.dtype, gen=gen, scale=100.0), float("nan"), float("inf"),
             float("-inf")]
    for fill in fills:
        k2, v2 = kc.clone(), vc.clone()
        for t in (k2, v2):
            t[pad] = fill(t)[pad] if callable(fill) else fill
        out, lse = call(k2, v2)
        assert torch.equal(out, base) and torch.equal(lse, base_lse), f"fill {fill}"
    if layout == "paged":
        table = kw["page_table"].clone()
        L = kw["cache_seqlens"]
        for b in range(table.shape[0]):
            used = (int(L[b]) + 15) // 16
            table[b, used:] = torch.randint(0, kc.shape[0], (table.shape[1] - used,), generator=gen,
                                            dtype=torch.int32)
        k2, v2 = kc.clone(), vc.clone()
        k2[pad], v2[pad] = float("nan"), float("inf")
        out, lse = call(k2, v2, page_table=table)
        assert torch.equal(out, base) and torch.equal(lse, base_lse)


@kernel
@pytest.mark.parametrize("layout", SECURE_LAYOUTS)
@pytest.mark.parametrize("splits,block_n", [(1, 16), (3, 16), (1, 64)])
def test_secure_v_select_from_loaded_tensors_gives_the_scalar_select_bit_for_bit(layout, splits, block_n, gen):
    """Secure decode zeroes V's rows outside each sequence's range by one of two selects (``DecodeConfig.seen_by_load``,
    docs/perf-notes.md v47): from loaded tensors (key positions from the public table, the raw lengths read as tensors)
    or from a range and the clamped scalar lengths. Both give every output and lse bit, with NaN and Inf in every slot
    no sequence sees, and also for lengths the host never checked (a CUDA-graph replay): past the capacity, negative,
    and a left pad past the length, where the raw values must select the rows their clamped values do (64-key tiles:
    the last tile reaches past the capacity of 96, rows the raw length selects and the clamped one does not)."""
    from flashcore import _checks as C
    from flashcore.launch.triton_decode import DecodeConfig
    from flashcore.plan.decode import plan_kvcache

    q, kc, vc, kw, pad = _secure_case(layout, torch.float16, gen, Sq=1)
    kc[pad], vc[pad] = float("nan"), float("inf")
    names = ("page_table", "cache_batch_idx", "cache_leftpad")
    opt = {n: kw.get(n) for n in names}
    a = C.check_kvcache(q, kc, vc, cache_seqlens=kw["cache_seqlens"], k=None, v=None, **opt, cu_seqlens_q=None,
                        max_seqlen_q=None, k_descale=None, v_descale=None, causal=True, scale=None, num_splits=0,
                        return_lse=True, out=None, secure=True, backend="triton")
    forms = [(False, False), (True, False), (False, True), (True, True)]  # (seen_by_load, hoisted)
    plans = {f: plan_kvcache(a, q, kc, vc, None, None, opt["page_table"], opt["cache_batch_idx"],
                             opt["cache_leftpad"], nan_like(q), config=DecodeConfig(16, block_n, 4, 2, splits,
                                                                                   seen_by_load=f[0], hoisted=f[1]))
             for f in forms}
    assert [plans[f].split.constexprs["SEEN_BY_LOAD"] for f in forms] == [False, True, False, True]
    # v48's addressing: one page per tile (every layout here but page 16 at 64-key tiles); whole tiles when the
    # capacity (96) is a multiple of the tile
    one_page = not (layout.startswith("paged") and block_n == 64)
    assert [plans[f].split.constexprs["HOISTED"] for f in forms] == [False, False, one_page, one_page]
    assert plans[(True, True)].split.constexprs["WHOLE_TILES"] == (one_page and block_n == 16)
    cap = 96
    cases = [(kw["cache_seqlens"], opt["cache_leftpad"]), (lengths(cap + 40, -5, 1 << 30), opt["cache_leftpad"])]
    if layout == "leftpad":
        cases += [(lengths(50, 70, 96), lengths(60, -3, 97)), (lengths(7, 90, 33), lengths(7, 89, 1 << 30))]
    for i, (L, lp) in enumerate(cases):
        t = dict({n: opt[n] for n in names if opt[n] is not None}, cache_seqlens=L)
        if lp is not None:
            t["cache_leftpad"] = lp
        res = {f: plans[f](q, kc, vc, t, nan_like(q)) for f in forms}
        o0, l0 = res[forms[0]]
        what = f"L={L.tolist()} leftpad={None if lp is None else lp.tolist()} seed {gen.initial_seed()}"
        for f in forms[1:]:
            o1, l1 = res[f]
            assert torch.equal(o0.view(torch.int16), o1.view(torch.int16)), (f, what)
            assert torch.equal(l0.view(torch.int32), l1.view(torch.int32)), (f, what)
        if i == 0:  # checked lengths: no stale slot reached the output (they hold NaN and Inf)
            assert not torch.isnan(o1).any() and not torch.isinf(o1).any(), what


def test_secure_fp8_gather_with_v_strides_of_its_own_keeps_the_form_before_v52():
    """v52's secure FP8 gather addresses V by K's offsets, so a V with strides of its own (a view into a wider
    buffer) cannot take it: the launch falls back to the form before (V's own offsets, masked copies, V's select on
    scalars), not to v52's loaded-tensor select without K's offsets, a form the SASS gate's list does not hold."""
    from flashcore.launch.triton_decode import DecodeConfig, DecodeShape, build_split

    shape = DecodeShape(batch=2, seqlen_q=1, num_heads_q=32, num_heads_kv=8, head_dim=128, page_size=16,
                        capacity=1024, num_pages=130, paged=True, packed=False, appended=False, has_batch_idx=False,
                        has_leftpad=False, causal=True, secure=True, fp8=True, return_lse=False, fp32=False, scale=0.1)
    q = torch.empty(2, 1, 32, 128, dtype=torch.bfloat16, device="meta")
    kc = torch.empty(130, 16, 8, 128, dtype=torch.float8_e4m3fn, device="meta")
    own = torch.empty(130, 16, 9, 128, dtype=torch.float8_e4m3fn, device="meta")[:, :, 1:]
    for splits in (1, 7):
        cfg = DecodeConfig(16, 128, 4, 3, splits)
        ce = {v: build_split(shape, cfg, q, kc, vc, q, 64)[3] for v, vc in (("same", kc), ("own", own))}
        assert ce["same"]["GATHER_KV_OFFSETS"] and ce["same"]["SEEN_BY_LOAD"] and ce["same"]["WHOLE_TILES"]
        assert not (ce["own"]["GATHER_KV_OFFSETS"] or ce["own"]["SEEN_BY_LOAD"] or ce["own"]["WHOLE_TILES"]), ce["own"]
        assert not ce["own"]["SAME_KV"] and not ce["own"]["HOISTED"]


def _secure_fp8_paged16(L, cap, Sq, causal, gen, Hq=4, Hkv=2, D=32):
    """A secure call's validated arguments over an FP8 cache in shuffled 16-key pages, NaN in every slot past each
    length (``L``): (q, k_cache, v_cache, page_table, descales, validated arguments)."""
    from flashcore import _checks as C

    B = L.shape[0]
    k_log, v_log = rnd(B, cap, Hkv, D, gen=gen), rnd(B, cap, Hkv, D, gen=gen)
    for b in range(B):
        k_log[b, int(L[b]):], v_log[b, int(L[b]):] = float("nan"), float("nan")
    kc, table = to_paged(k_log, 16, gen)
    vc, _ = to_paged(v_log, 16, gen, pages=rnd(*kc.shape, gen=gen), table=table)
    kc, vc = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
    q = rnd(B, Sq, Hq, D, dtype=torch.float16, gen=gen)
    descale = dict(k_descale=torch.rand(B, Hkv, generator=gen) + 0.5, v_descale=torch.rand(B, Hkv, generator=gen) + 0.5)
    a = C.check_kvcache(q, kc, vc, cache_seqlens=L, k=None, v=None, page_table=table, cache_batch_idx=None,
                        cache_leftpad=None, cu_seqlens_q=None, max_seqlen_q=None, **descale, causal=causal,
                        scale=None, num_splits=0, return_lse=True, out=None, secure=True, backend="triton")
    return q, kc, vc, table, descale, a


@kernel
@pytest.mark.parametrize("splits", [1, 2])
def test_secure_fp8_gather_with_v_by_k_offsets_and_unmasked_copies_gives_the_same_bits(splits, gen):
    """v52's secure FP8 page gather (``DecodeConfig.gather_kv_offsets``: V's tile addressed by K's per-key offsets;
    with it by default copies without a mask where the capacity is whole tiles, ``whole_tiles``, and V's select from
    loaded tensors, ``seen_by_load``) against the form before it, each part alone too: every output and lse bit, page
    16 under 32-key tiles (a gather), NaN in every slot no sequence sees, and lengths the host never checked (past the
    capacity, negative)."""
    from flashcore.launch.triton_decode import DecodeConfig
    from flashcore.plan.decode import plan_kvcache

    cap = 128
    L = lengths(cap - 3, 41, 0)
    q, kc, vc, table, descale, a = _secure_fp8_paged16(L, cap, 1, True, gen)
    res = []
    for kv_off, whole, by_load in ((None, None, None), (True, False, False), (True, True, False), (True, None, True)):
        plan = plan_kvcache(a, q, kc, vc, None, None, table, None, None, nan_like(q),
                            config=DecodeConfig(16, 32, 4, 2, splits, gather_kv_offsets=kv_off, whole_tiles=whole,
                                                seen_by_load=by_load))
        ce = plan.split.constexprs
        assert ce["GATHER_KV_OFFSETS"] is bool(kv_off) and not ce["HOISTED"]
        # the policy pairs V by K's offsets with unmasked copies (v52); V's select from loaded tensors as given (the
        # policy's D 128 only)
        assert ce["WHOLE_TILES"] is (whole if whole is not None else bool(kv_off))
        assert ce["SEEN_BY_LOAD"] is bool(by_load)
        for Lx in (L, lengths(cap + 40, -5, 1 << 30)):
            res.append(plan(q, kc, vc, dict(page_table=table, cache_seqlens=Lx, **descale), nan_like(q)))
    ref, ref_lse = R.attention_with_kvcache(q, kc, vc, cache_seqlens=L, page_table=table, return_lse=True, **descale)
    check(res[0][0], res[0][1], ref, ref_lse, torch.float16, what=f"splits {splits}")
    for i, (o, lse) in enumerate(res):
        o0, l0 = res[i % 2]
        assert torch.equal(o.view(torch.int16), o0.view(torch.int16)) and torch.equal(lse, l0), i


@kernel
@pytest.mark.parametrize("causal,Sq", [(True, 1), (False, 3)])
def test_secure_16bit_gather_with_v_by_k_offsets_gives_the_earlier_bits(causal, Sq, gen):
    """v57: the secure 16-bit page gather with splits on the FP8 gathers' form (``GATHER_KV_OFFSETS``: V's tile by K's
    per-key offsets, unmasked copies in whole tiles, V's select from loaded tensors as an AND, one-compare
    visibility), against v50's form at the same tiles (per-key pointers for K and V, masked copies, V's select on
    scalars): every output and lse bit, page 16 under 32-key tiles, NaN in every slot no sequence sees, and lengths
    the host never checked; the first against the float64 reference."""
    from flashcore import _checks as C
    from flashcore.launch.triton_decode import DecodeConfig
    from flashcore.plan.decode import plan_kvcache

    cap, Hq, Hkv, D = 128, 4, 2, 32
    L = lengths(cap - 3, 41, 0)
    B = L.shape[0]
    k_log, v_log = rnd(B, cap, Hkv, D, dtype=torch.float16, gen=gen), rnd(B, cap, Hkv, D, dtype=torch.float16, gen=gen)
    for b in range(B):
        k_log[b, int(L[b]):], v_log[b, int(L[b]):] = float("nan"), float("nan")
    kc, table = to_paged(k_log, 16, gen)
    vc, _ = to_paged(v_log, 16, gen, pages=rnd(*kc.shape, dtype=torch.float16, gen=gen), table=table)
    q = rnd(B, Sq, Hq, D, dtype=torch.float16, gen=gen)
    a = C.check_kvcache(q, kc, vc, cache_seqlens=L, k=None, v=None, page_table=table, cache_batch_idx=None,
                        cache_leftpad=None, cu_seqlens_q=None, max_seqlen_q=None, k_descale=None, v_descale=None,
                        causal=causal, scale=None, num_splits=0, return_lse=True, out=None, secure=True,
                        backend="triton")
    res = []
    # v57's form; its audit control (FLASHCORE_SECURE_V_SEEN=scalars: V's select on scalars); v50's form
    for kv_off, by_load in ((True, True), (True, False), (False, False)):
        plan = plan_kvcache(a, q, kc, vc, None, None, table, None, None, nan_like(q),
                            config=DecodeConfig(16, 32, 4, 2, 2, gather_kv_offsets=kv_off, seen_by_load=by_load))
        ce = plan.split.constexprs
        assert (ce["GATHER_KV_OFFSETS"], ce["WHOLE_TILES"], ce["SEEN_BY_LOAD"]) == (kv_off, kv_off, by_load)
        assert not ce["HOISTED"] and not ce["FP8"]
        for Lx in (L, lengths(cap + 40, -5, 1 << 30)):
            res.append(plan(q, kc, vc, dict(page_table=table, cache_seqlens=Lx), nan_like(q)))
    ref, ref_lse = R.attention_with_kvcache(q, kc, vc, cache_seqlens=L, page_table=table, causal=causal,
                                            return_lse=True)
    check(res[0][0], res[0][1], ref, ref_lse, torch.float16, what=f"causal {causal} Sq {Sq}")
    for i, (o, lse) in enumerate(res):
        o0, l0 = res[i % 2]
        assert torch.equal(o.view(torch.int16), o0.view(torch.int16)) and torch.equal(lse, l0), i


@kernel
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Sq", [1, 3])
def test_secure_fp8_gather_visibility_by_one_compare_gives_the_earlier_bits(causal, Sq, gen):
    """v53: the secure FP8 gather (``GATHER_KV_OFFSETS``) decides a score's visibility by one unsigned compare, the
    key's index from the first visible key against its row's count of visible keys, instead of the range, real-row
    and causal compares of the form before. Against that form, every output and lse bit: causal and not, one and
    three query tokens (a causal bound per row; rows past the real ones), NaN in every slot no sequence sees, and lengths the host never checked (past the capacity, negative); the first
    against the float64 reference."""
    from flashcore.launch.triton_decode import DecodeConfig
    from flashcore.plan.decode import plan_kvcache

    cap = 128
    L = lengths(cap - 3, 41, 3, 77)
    q, kc, vc, table, descale, a = _secure_fp8_paged16(L, cap, Sq, causal, gen)
    res = []
    for kv_off in (False, True):
        plan = plan_kvcache(a, q, kc, vc, None, None, table, None, None, nan_like(q),
                            config=DecodeConfig(16, 32, 4, 2, 2, gather_kv_offsets=kv_off))
        assert plan.split.constexprs["GATHER_KV_OFFSETS"] is kv_off and plan.split.constexprs["CAUSAL"] is causal
        for Lx in (L, lengths(cap + 40, -5, 1 << 30, 60)):
            res.append(plan(q, kc, vc, dict(page_table=table, cache_seqlens=Lx, **descale), nan_like(q)))
    ref, ref_lse = R.attention_with_kvcache(q, kc, vc, cache_seqlens=L, page_table=table, causal=causal,
                                            return_lse=True, **descale)
    check(res[0][0], res[0][1], ref, ref_lse, torch.float16, what=f"causal {causal} Sq {Sq}")
    for i in range(2):
        (o0, l0), (o1, l1) = res[i], res[i + 2]
        assert torch.equal(o1.view(torch.int16), o0.view(torch.int16)) and torch.equal(l1, l0), i


@kernel
@pytest.mark.parametrize("layout", ["contiguous", "leftpad", "page1", "paged16_full_tiles"])
@pytest.mark.parametrize("causal,Sq", [(True, 3), (False, 1)])
def test_fast_one_compare_visibility_gives_the_three_selects_bits(layout, causal, Sq, gen):
    """v54: the fast path's masked key loops (``_attend_tiles``) with visibility by one unsigned compare per score
    (``DecodeConfig.one_compare``: the key's index from the first visible key against its row's count of visible
    keys, and one compare for what each copy loads) against the three selects (key range, real row, causal): every
    output and lse bit, one and three query tokens (rows past the real ones, a causal bound per row), a left pad,
    pages of one key, the masked loops around the unmasked one (``FULL_TILES``), one split and two, NaN in every slot
    no sequence sees, and lengths the host never checked (past the capacity, negative); the first against the float64
    reference. The planner takes it for 16-bit contiguous and page-1 caches at D 128 only (measured, perf-notes v54)."""
    from flashcore import _checks as C
    from flashcore.launch.triton_decode import DecodeConfig, DecodeShape, one_compare
    from flashcore.plan.decode import plan_kvcache

    B, Hq, Hkv, D, cap = 3, 4, 2, 32, 96
    L = lengths(cap - 3, 41, 1)
    kc, vc = (rnd(B, cap, Hkv, D, dtype=torch.float16, gen=gen) for _ in range(2))
    for b in range(B):
        kc[b, int(L[b]):], vc[b, int(L[b]):] = float("nan"), float("inf")
    table = None
    if layout in ("page1", "paged16_full_tiles"):
        kc, table = to_paged(kc, 1 if layout == "page1" else 16, gen)
        vc, _ = to_paged(vc, 1 if layout == "page1" else 16, gen, pages=nan_like(kc), table=table)
    q = rnd(B, Sq, Hq, D, dtype=torch.float16, gen=gen)
    leftpad = lengths(10, 40, 0) if layout == "leftpad" else None
    a = C.check_kvcache(q, kc, vc, cache_seqlens=L, k=None, v=None, page_table=table, cache_batch_idx=None,
                        cache_leftpad=leftpad, cu_seqlens_q=None, max_seqlen_q=None, k_descale=None, v_descale=None,
                        causal=causal, scale=None, num_splits=0, return_lse=True, out=None, secure=False,
                        backend="triton")
    tensors = {n: x for n, x in dict(page_table=table, cache_leftpad=leftpad).items() if x is not None}
    full = layout == "paged16_full_tiles"
    res = {}
    for splits in (1, 2):
        for one in (False, True):
            plan = plan_kvcache(a, q, kc, vc, None, None, table, None, leftpad, nan_like(q),
                                config=DecodeConfig(16, 16, 4, 2, splits, full_tiles=full, one_compare=one))
            ce = plan.split.constexprs
            assert ce["ONE_COMPARE"] is one and ce["FULL_TILES"] is full and ce["CAUSAL"] is causal
            for Lx in (L, lengths(cap + 40, -5, 1 << 30)):
                res[splits, one, tuple(Lx.tolist())] = plan(q, kc, vc, dict(tensors, cache_seqlens=Lx), nan_like(q))
    ref, ref_lse = R.attention_with_kvcache(q, kc, vc, cache_seqlens=L, page_table=table, cache_leftpad=leftpad,
                                            causal=causal, return_lse=True)
    check(*res[1, True, tuple(L.tolist())], ref, ref_lse, torch.float16, what=f"{layout} causal {causal} Sq {Sq}")
    for (splits, one, Lx), (o, lse) in res.items():
        o0, l0 = res[splits, False, Lx]
        what = f"{layout} causal={causal} Sq={Sq} splits={splits} L={Lx} seed {gen.initial_seed()}"
        assert torch.equal(o.view(torch.int16), o0.view(torch.int16)), what
        assert torch.equal(lse.view(torch.int32), l0.view(torch.int32)), what

    def shape(**kw):
        base = dict(batch=1, seqlen_q=1, num_heads_q=32, num_heads_kv=8, head_dim=128, page_size=65536,
                    capacity=65536, num_pages=1, paged=False, packed=False, appended=False, has_batch_idx=False,
                    has_leftpad=False, causal=True, secure=False, fp8=False, return_lse=False, fp32=False, scale=0.1)
        return DecodeShape(**dict(base, **kw))

    cfg = DecodeConfig(16, 128, 8, 3, 16)
    assert one_compare(shape(), cfg) and one_compare(shape(paged=True, page_size=1, num_pages=65536), cfg)
    for s in (shape(paged=True, page_size=16, num_pages=4096), shape(fp8=True), shape(secure=True), shape(head_dim=64),
              shape(fp32=True)):
        assert not one_compare(s, cfg), s
    assert not one_compare(shape(), DecodeConfig(64, 128, 8, 3, 1))


@kernel
@pytest.mark.parametrize("layout", ["contiguous", "rows", "leftpad", "paged32"])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("own_v_strides", [False, True])
def test_secure_hoisted_loop_gives_the_earlier_loop_bit_for_bit(layout, fp8, own_v_strides, gen):
    """v48's hoisted secure loop (``DecodeConfig.hoisted``: tile addresses as a per-tile scalar plus per-key offsets
    from before the loop, visibility compared relative to the tile's start, unmasked copies in whole tiles) against the
    earlier loop, with either select of V's rows: every output and lse bit, two query tokens (the causal compare
    matters), V with strides of its own (its offsets not K's), FP8 pairs (halved strides), capacities of whole tiles
    (96: unmasked copies) and not (100), one split and two, NaN in every slot no sequence sees, and lengths the host
    never checked (past the capacity, negative). The interpreter runs V's select where the GPU runs the AND
    (``_keep_rows``); the GPU test compares those."""
    from flashcore import _checks as C
    from flashcore.launch.triton_decode import DecodeConfig
    from flashcore.plan.decode import plan_kvcache

    B, Hq, Hkv, D, Sq = 3, 4, 2, 32, 2
    cap = 128 if layout == "paged32" else (100 if own_v_strides else 96)
    rows = 4 if layout == "rows" else B
    L = lengths(cap - 3, 41, 0)
    k_log = rnd(rows, cap, Hkv, D, gen=gen)
    v_log = rnd(rows, cap, Hkv, D, gen=gen)
    for b in range(B):  # stale slots: NaN (K) and Inf (V) past each length; the FP8 cache's NaN is e4m3's
        r = b + 1 if layout == "rows" else b
        k_log[r, int(L[b]):], v_log[r, int(L[b]):] = float("nan"), float("inf")
    dt = torch.float8_e4m3fn if fp8 else torch.float16

    def v_view(n, page):  # V in a buffer with a wider head axis: strides of its own
        return rnd(n, page, Hkv + 1, D, gen=gen).to(dt)[:, :, 1:, :] if own_v_strides else None

    table = None
    if layout == "paged32":
        kc, table = to_paged(k_log.to(dt) if not fp8 else k_log, 32, gen)
        kc = kc.to(dt)
        vc = v_view(kc.shape[0], 32)
        if vc is None:
            vc = rnd(*kc.shape, gen=gen).to(dt)
        vc.view(torch.uint8 if fp8 else torch.int16)[table.view(-1).long()] = (
            v_log.to(dt).reshape(-1, 32, Hkv, D).view(torch.uint8 if fp8 else torch.int16))
    else:
        kc = k_log.to(dt)
        vc = v_view(rows, cap)
        if vc is None:
            vc = v_log.to(dt)
        else:
            vc.view(torch.uint8 if fp8 else torch.int16)[:] = v_log.to(dt).view(torch.uint8 if fp8 else torch.int16)
    assert (vc.stride() != kc.stride()) is own_v_strides
    q = rnd(B, Sq, Hq, D, dtype=torch.float16, gen=gen)
    descale = dict(k_descale=torch.rand(B, Hkv, generator=gen) + 0.5, v_descale=torch.rand(B, Hkv, generator=gen) + 0.5)
    if not fp8:
        descale = dict(k_descale=None, v_descale=None)
    opt = dict(page_table=table, cache_batch_idx=lengths(1, 2, 3) if layout == "rows" else None,
               cache_leftpad=lengths(10, 40, 0) if layout == "leftpad" else None)
    a = C.check_kvcache(q, kc, vc, cache_seqlens=L, k=None, v=None, **opt, cu_seqlens_q=None, max_seqlen_q=None,
                        **descale, causal=True, scale=None, num_splits=0, return_lse=True, out=None, secure=True,
                        backend="triton")
    tensors = dict({n: x for n, x in opt.items() if x is not None}, **{n: x for n, x in descale.items() if x is not None})
    for block_n, splits in ((16, 1), (32, 2)):
        res = {}
        for hoisted in (False, True):
            for by_load, per_key in ((False, False), (True, False), (True, True)):
                plan = plan_kvcache(a, q, kc, vc, None, None, table, opt["cache_batch_idx"], opt["cache_leftpad"],
                                    nan_like(q), config=DecodeConfig(16, block_n, 4, 2, splits, seen_by_load=by_load,
                                                                    hoisted=hoisted, seen_per_key=per_key))
                ce = plan.split.constexprs
                assert ce["HOISTED"] is hoisted and ce["SAME_KV"] is not own_v_strides
                assert ce["WHOLE_TILES"] is (hoisted and cap % block_n == 0)
                assert ce["SEEN_PER_KEY"] is per_key  # v49: each key's position read every tile
                for Lx in (L, lengths(cap + 40, -5, 1 << 30)):
                    res[hoisted, by_load, per_key, tuple(Lx.tolist())] = plan(
                        q, kc, vc, dict(tensors, cache_seqlens=Lx), nan_like(q))
        for (hoisted, by_load, per_key, Lx), (o, lse) in res.items():
            o0, l0 = res[False, False, False, Lx]
            what = (f"hoisted={hoisted} seen_by_load={by_load} seen_per_key={per_key} L={Lx} block_n={block_n} "
                    f"seed {gen.initial_seed()}")
            assert torch.equal(o.view(torch.int16), o0.view(torch.int16)), what
            assert torch.equal(lse.view(torch.int32), l0.view(torch.int32)), what
        for per_key in (False, True):
            o, _ = res[True, True, per_key, tuple(L.tolist())]
            assert not torch.isnan(o).any() and not torch.isinf(o).any()  # no stale slot reached the output


def test_secure_decode_takes_the_select_from_loaded_tensors_only_in_the_audited_forms(monkeypatch):
    """The planner gives V's select from loaded tensors (``launch.triton_decode.seen_by_load``) to secure decode with
    16-row query tiles and D 128: at one split (a 16-bit cache, or an FP8 one not paged; since v51 hoisted there, on
    128-key tiles, 4 warps, 4 stages) and, since v49, with splits
    where the key loop is hoisted (each tile in one page; a 16-bit cache reading each key's position every tile,
    ``seen_per_key``); to no other form: outside them the static gate found ptxas folding that select into the
    predicate of V's element-wise loads (D 72, 64-row tiles: docs/security.md §5.14). The audit list holds exactly the
    planner's forms of it, each beside its controls (``FLASHCORE_SECURE_V_SEEN=scalars``,
    ``FLASHCORE_SECURE_HOISTED=off``)."""
    from flashcore.audit.specs import decode_specs
    from flashcore.launch.triton_decode import (DecodeConfig, DecodeShape, gather_kv_offsets, hoisted, seen_by_load,
                                                seen_per_key)

    def shape(**kw):
        base = dict(batch=64, seqlen_q=1, num_heads_q=32, num_heads_kv=8, head_dim=128, page_size=16, capacity=8192,
                    num_pages=64 * 512, paged=True, packed=False, appended=False, has_batch_idx=False,
                    has_leftpad=False, causal=True, secure=True, fp8=False, return_lse=False, fp32=False, scale=0.1)
        return DecodeShape(**dict(base, **kw))

    one = DecodeConfig(16, 32, 4, 4, 1)
    contiguous = dict(paged=False, page_size=8192)
    assert seen_by_load(shape(), one) and seen_by_load(shape(**contiguous), one)
    assert seen_by_load(shape(fp8=True, **contiguous), one)
    # the hoisted loop: each tile in one page; a 16-bit cache at one split (v48), any cache with splits (v49), an FP8
    # cache at one split where it is not paged (v51)
    split = DecodeConfig(16, 128, 4, 3, 7)
    for s, c in [(shape(**contiguous), DecodeConfig(16, 128, 4, 3, 1)), (shape(page_size=128), DecodeConfig(16, 128, 4, 3, 1)),
                 (shape(fp8=True, **contiguous), one), (shape(fp8=True, has_batch_idx=True, **contiguous), one),
                 (shape(page_size=32), DecodeConfig(16, 32, 4, 4, 1)), (shape(page_size=64), DecodeConfig(16, 64, 4, 4, 1)),
                 (shape(**contiguous), split), (shape(page_size=128), split), (shape(fp8=True, **contiguous), split),
                 (shape(fp8=True, page_size=256), split)]:
        assert hoisted(s, c) and seen_by_load(s, c), (s, c)
        # each key's position per tile: with splits, a 16-bit cache (FP8 reads the tile's start: perf-notes v49)
        assert seen_per_key(s, c) is (c.num_splits > 1 and not s.fp8), (s, c)
    for s, c in [(shape(fp8=True, page_size=128), DecodeConfig(16, 64, 8, 3, 1)), (shape(), one), (shape(head_dim=72), one),
                 (shape(), DecodeConfig(64, 32, 4, 4, 1)), (shape(fp32=True), one),
                 (shape(secure=False, **contiguous), DecodeConfig(16, 128, 4, 3, 1)), (shape(page_size=64), split),
                 (shape(head_dim=64, **contiguous), split), (shape(fp32=True, **contiguous), split)]:
        assert not hoisted(s, c), (s, c)
    for s, c in [(shape(secure=False), one), (shape(fp8=True), one), (shape(head_dim=72), one),
                 (shape(), DecodeConfig(64, 32, 4, 4, 1)), (shape(), DecodeConfig(16, 32, 4, 4, 7)),
                 (shape(page_size=64), split), (shape(fp32=True), one), (shape(head_dim=72, **contiguous), split)]:
        assert not seen_by_load(s, c) and not seen_per_key(s, c), (s, c)
    # v57: the 16-bit gathers with splits (tiles over pages below the tile) take the FP8 gathers' form (V by K's
    # offsets, the select from loaded tensors as an AND), reading the tile's start (not hoisted)
    for s, c in [(shape(), DecodeConfig(16, 64, 4, 3, 7)), (shape(page_size=32), DecodeConfig(16, 64, 4, 3, 7))]:
        assert gather_kv_offsets(s, c) and seen_by_load(s, c) and not seen_per_key(s, c) and not hoisted(s, c), (s, c)
    # one split, another head dim, other tiles than v50's
    for s, c in [(shape(), one), (shape(head_dim=64), DecodeConfig(16, 64, 4, 3, 7)),
                 (shape(), DecodeConfig(16, 32, 4, 4, 7)), (shape(page_size=64), split)]:
        assert not gather_kv_offsets(s, c), (s, c)
    assert not seen_per_key(shape(**contiguous), DecodeConfig(16, 128, 4, 3, 1))
    monkeypatch.setenv("FLASHCORE_SECURE_HOISTED", "off")  # the control: the loop before v48, and with splits the
    assert not hoisted(shape(**contiguous), DecodeConfig(16, 128, 4, 3, 1))  # select on scalars (before v49)
    assert not hoisted(shape(**contiguous), split) and not seen_by_load(shape(**contiguous), split)
    monkeypatch.delenv("FLASHCORE_SECURE_HOISTED")
    monkeypatch.setenv("FLASHCORE_SECURE_V_SEEN", "scalars")
    assert not seen_by_load(shape(), one) and not seen_by_load(shape(**contiguous), split)
    assert hoisted(shape(**contiguous), split) and not seen_per_key(shape(**contiguous), split)
    monkeypatch.delenv("FLASHCORE_SECURE_V_SEEN")
    specs = {s["name"]: s["constexprs"] for s in decode_specs(True) if "combine" not in s["name"]}
    by_load = sorted(n for n, ce in specs.items() if ce["SEEN_BY_LOAD"])
    assert by_load and all("_d128_" in n and "_16x" in n for n in by_load), by_load
    # FP8 paged at one split: only v52's gathers (pages below 64 on 128-key tiles, V by K's offsets, unmasked copies;
    # page 16 on 2 stages since v53)
    fp8_paged_one = [n for n in by_load if "_fp8_" in n and "paged" in n and "_splits1_" in n]
    assert fp8_paged_one and all(("_16x128w4s2" if "_paged16_" in n else "_16x128w4s3") in n
                                 and specs[n]["GATHER_KV_OFFSETS"] and specs[n]["WHOLE_TILES"]
                                 for n in fp8_paged_one), fp8_paged_one
    assert all(int(re.search(r"_paged(\d+)_", n).group(1)) < 64 for n in fp8_paged_one), fp8_paged_one
    # with splits: hoisted (each key's position read per tile for a 16-bit cache) or v52's FP8 gathers; at one split
    # and for FP8 the tile's start read per tile
    assert any("_splits1_" not in n for n in by_load), by_load
    for n in by_load:
        assert specs[n]["SEEN_PER_KEY"] is ("_splits1_" not in n and specs[n]["HOISTED"]
                                            and not n.startswith("secure_decode_fp8_")), n
        assert "_splits1_" in n or specs[n]["HOISTED"] or specs[n]["GATHER_KV_OFFSETS"], n
    gathers = sorted(n for n, ce in specs.items() if ce["GATHER_KV_OFFSETS"])
    assert gathers and all("_d128_" in n and not specs[n]["HOISTED"] for n in gathers), gathers
    fp8_gathers = [n for n in gathers if n.startswith("secure_decode_fp8_")]
    assert any("_splits1_" not in n for n in fp8_gathers) and any("_splits1_" in n for n in fp8_gathers), gathers
    # v57: 16-bit gathers only with splits
    wide = [n for n in gathers if not n.startswith("secure_decode_fp8_")]
    assert wide and all("_splits1_" not in n for n in wide), gathers
    assert any(specs[n]["SEEN_PER_KEY"] for n in by_load), by_load
    # the hoisted loop: in the list at one split (16-bit caches) and with splits (FP8 too), with and without whole
    # tiles, each beside its control
    on = sorted(n for n, ce in specs.items() if ce["HOISTED"])
    assert on and {specs[n]["WHOLE_TILES"] for n in on} == {False, True}
    assert all(n.startswith("secure_decode_bf16_") or n.startswith("secure_decode_fp16_") or "_splits1_" not in n
               or "_paged" not in n for n in on), on
    assert any(n.startswith("secure_decode_fp8_") and "_splits1_16x128w4s4" in n for n in on), on  # v51
    assert any(n.startswith("secure_decode_fp8_") for n in on), on
    assert all("_d128_" in n and "_16x" in n for n in on), on
    controls = sorted(n for n in specs if n.endswith("_unhoisted"))
    assert controls == sorted(n + "_unhoisted" for n in on if not n.endswith("_vscalars"))
    assert not any(specs[n]["HOISTED"] for n in controls)
    assert not any(specs[n]["SEEN_BY_LOAD"] for n in controls if "_splits1_" not in n)
    assert sorted(n for n in specs if n.endswith("_vscalars")) == sorted(n + "_vscalars" for n in by_load)
    assert not any(specs[n + "_vscalars"]["SEEN_BY_LOAD"] for n in by_load)


def test_secure_16_bit_page_gathers_with_splits_take_64_key_tiles_and_the_gate_lists_them(monkeypatch):
    """Secure decode with splits over pages of fewer than 64 keys (each tile spans pages: the per-key gather, no
    hoisted loop) takes 64-key tiles on 4 warps and 3 stages for a 16-bit cache, its split count as chosen for
    128-key tiles: B1 64k page 16 at 1.02 of fast against 0.93, page 32 1.03 against 0.94, 4k page 16 1.09 against
    0.95 (H200, same-run A/Bs, docs/perf-notes.md v50). Since v51 page 64 too (a page per tile there: the hoisted
    loop; B1 64k 70.4 us against 79.0, fast 70.5). FP8 keeps 128-key tiles (64 measured slower), and so do pages of
    128 keys and up; and each form the planner gives is in the static gate's list."""
    import flashcore.plan.decode as plan_decode
    from flashcore.audit.specs import decode_specs
    from flashcore.launch.triton_decode import DecodeShape

    monkeypatch.setattr(plan_decode, "sm_count", lambda device: 132)

    def config(page, fp8=False, batch=1, capacity=65536):
        shape = DecodeShape(batch=batch, seqlen_q=1, num_heads_q=32, num_heads_kv=8, head_dim=128,
                            page_size=page, capacity=capacity, num_pages=batch * capacity // page, paged=True,
                            packed=False, appended=False, has_batch_idx=False, has_leftpad=False, causal=True,
                            secure=True, fp8=fp8, return_lse=False, fp32=False, scale=0.1)
        c = plan_decode.choose_config(shape, 0, torch.device("cpu"))
        return c.block_n, c.num_warps, c.num_stages, c.num_splits

    assert config(16) == (64, 4, 3, 33) and config(32) == (64, 4, 3, 33)
    assert config(16, capacity=4096)[:3] == (64, 4, 3)
    assert config(16, fp8=True)[:3] == (128, 4, 3) and config(128)[:3] == (128, 4, 3)
    # page 64 (v51): the same tiles, where each tile is one page (the hoisted loop, V's select from loaded tensors)
    assert config(64) == (64, 4, 3, 33)
    assert config(16, batch=64, capacity=8192)[3] == 1  # one split: the tiles of its own rule
    names = [s["name"] for s in decode_specs(True)]
    for page in (16, 32, 64):
        assert any(n.startswith("secure_decode_bf16_qbf16_d128_paged%d_" % page) and "_splits7_16x64w4s3" in n
                   for n in names), page


def test_fast_16_bit_page_gathers_with_splits_take_64_key_tiles_and_register_page_loads(monkeypatch):
    """The fast path with splits over pages of 16 to 127 keys (a 16-bit cache, D 128, 16-row query tiles) takes
    64-key tiles on 4 warps and 3 stages with register page loads, two programs per SM (its split count counted in
    64-key tiles): B1 64k page 16 70.1 us against 75.2-75.4 for the one-wave form, 4k page 16 8.8-8.9 against
    10.0-10.2 (H200 graph replays, contiguous 66.9 and 8.6-8.7, docs/perf-notes.md v51). At one split, gathers over
    pages below 64 keys take 32-key tiles on 4 warps and 3 stages with register page loads (B64 8k page 16 1.0%
    behind contiguous instead of 4.0%). Page 1 with splits, FP8, secure mode and D 64 keep their own forms; page 64
    with splits takes the contiguous cache's tiles since v53 (test_v53_...); the gate's list has the new forms."""
    import flashcore.plan.decode as plan_decode
    from flashcore.audit.specs import decode_specs
    from flashcore.launch.triton_decode import DecodeShape, full_tiles, reg_pages

    monkeypatch.setattr(plan_decode, "sm_count", lambda device: 132)

    def config(page, fp8=False, batch=1, capacity=65536, secure=False, d=128, splits=0):
        shape = DecodeShape(batch=batch, seqlen_q=1, num_heads_q=32, num_heads_kv=8, head_dim=d,
                            page_size=page, capacity=capacity, num_pages=batch * capacity // page, paged=True,
                            packed=False, appended=False, has_batch_idx=False, has_leftpad=False, causal=True,
                            secure=secure, fp8=fp8, return_lse=False, fp32=False, scale=0.1)
        c = plan_decode.choose_config(shape, splits, torch.device("cpu"))
        return c.block_n, c.num_warps, c.num_stages, c.num_splits, reg_pages(shape, c), full_tiles(shape, c)

    # 32 splits: 33 of 1,024 tiles would leave one empty (v58, test_v58_...)
    assert config(16) == (64, 4, 3, 32, True, False) and config(32) == (64, 4, 3, 32, True, False)
    assert config(16, capacity=4096) == (64, 4, 3, 16, True, False)  # v58: one program per SM at 4 tiles a split
    assert config(16, splits=4) == (64, 4, 3, 4, True, False)
    assert config(1) == (128, 8, 5, 16, False, False)  # page 1: the one-wave form (measured faster there)
    assert config(16, d=64)[:4] == (128, 8, 5, 16)
    assert config(16, fp8=True)[:3] == (128, 4, 3)  # v52's FP8 form (test_fast_fp8_decode_at_d128_takes_...)
    # one split (B64-like): 32-key tiles, 4 warps, 3 stages, register page loads, pages below 64 (page 1 too)
    assert config(16, batch=64, capacity=8192) == (32, 4, 3, 1, True, False)
    assert config(16, splits=1) == config(1, splits=1) == (32, 4, 3, 1, True, False)
    assert config(32, splits=1) == (32, 4, 3, 1, True, True)  # a page per 32-key tile: whole tiles unmasked
    assert config(64, batch=64, capacity=8192)[:4] == (128, 8, 3, 1)  # page 64: measured a tie, kept
    assert config(16, batch=64, capacity=8192, fp8=True)[:3] == (64, 4, 4)  # v52
    assert config(16, secure=True)[:4] == (64, 4, 3, 33)  # v50's secure form, its split count as before
    names = [s["name"] for s in decode_specs(False)]
    assert any(n.startswith("fast_decode_bf16_qbf16_d128_paged16_") and "_splits7_16x64w4s3" in n for n in names)
    assert any(n.startswith("fast_decode_bf16_qbf16_d128_paged16_") and "_splits1_16x32w4s3" in n for n in names)


def test_fast_fp8_decode_at_d128_takes_v52_tiles_and_runs_its_page_gathers_without_masks(monkeypatch):
    """A fast FP8 cache at D 128 (16-row query tiles): with splits (B1-like), every layout on 128-key tiles, 4 warps,
    3 stages, two programs per SM (B1 64k contiguous 40.4 us against 48.4 for 8 warps at one program per SM, H200
    graph replays interleaved, docs/perf-notes.md v52); a page gather (a page index per key) there runs its whole
    tiles without masks on register page loads (page 16 39.9 against 43.8), except where a split has fewer than 4
    tiles (B1 4k page 16 keeps the masked 5-stage gather: 8.4 against 9.1). At one split (B64-like) a gather takes
    64-key tiles, 4 warps, 4 stages, the same unmasked form (page 16 506.5 against 554.3, contiguous 496.7). Secure
    mode, 16-bit caches and D 64 keep their forms."""
    import flashcore.plan.decode as plan_decode
    from flashcore.launch.triton_decode import DecodeShape, full_tiles, reg_pages

    monkeypatch.setattr(plan_decode, "sm_count", lambda device: 132)

    def config(page, batch=1, capacity=65536, secure=False, d=128, splits=0, fp8=True):
        shape = DecodeShape(batch=batch, seqlen_q=1, num_heads_q=32, num_heads_kv=8, head_dim=d,
                            page_size=page or capacity, capacity=capacity,
                            num_pages=batch * capacity // max(page, 1), paged=page > 0, packed=False, appended=False,
                            has_batch_idx=False, has_leftpad=False, causal=True, secure=secure, fp8=fp8,
                            return_lse=False, fp32=False, scale=0.1)
        c = plan_decode.choose_config(shape, splits, torch.device("cpu"))
        return c.block_n, c.num_warps, c.num_stages, c.num_splits, reg_pages(shape, c), full_tiles(shape, c)

    # with splits: 128-key tiles, 4 warps, 3 stages, 32 splits (two programs per SM, every split with work: v58);
    # gathers unmasked
    assert config(0) == (128, 4, 3, 32, False, True)
    assert config(0, capacity=4096) == (128, 4, 3, 16, False, True)
    for page in (1, 16, 32, 64):  # page 64: a 128-key tile spans two pages, a gather too
        assert config(page) == (128, 4, 3, 32, True, True), page
    assert config(128) == config(256) == (128, 4, 3, 32, True, True)  # a page per tile
    assert config(16, capacity=4096) == (128, 4, 5, 16, False, False)  # two tiles per split: the masked gather
    assert config(16, capacity=8192, splits=16) == (128, 4, 3, 16, True, True)  # four tiles per split
    # one split: gathers on 64-key tiles, 4 warps, 4 stages, unmasked; pages of 64+ as before (a page per tile)
    for page in (1, 16, 32):
        assert config(page, batch=64, capacity=16384) == (64, 4, 4, 1, True, True), page
        assert config(page, splits=1) == (64, 4, 4, 1, True, True), page
    assert config(64, batch=64, capacity=16384) == (64, 4, 4, 1, True, True)
    assert config(0, batch=64, capacity=16384) == (64, 4, 4, 1, False, True)
    assert config(16, batch=64, capacity=128, splits=1) == (64, 4, 4, 1, False, False)  # 2 tiles: masked
    # not: secure mode, 16-bit caches, D 64
    assert config(16, secure=True)[:3] == (128, 4, 3) and config(16, secure=True)[5] is False
    assert config(16, batch=64, capacity=16384, secure=True)[:2] == (128, 4)  # v52's secure FP8 gather
    assert config(0, fp8=False)[:4] == (128, 8, 3, 16)
    assert config(16, d=64)[:4] == (128, 4, 5, 32) and config(16, d=64)[4:] == (False, False)


def test_v53_page_64_with_splits_and_the_secure_fp8_gathers_stages(monkeypatch):
    """v53's planner (H200 graph replays interleaved, docs/perf-notes.md v53): a fast 16-bit cache with splits over
    pages of 64 keys takes the contiguous cache's tiles (128 keys, 8 warps, 3 stages, one program per SM), each tile's
    two pages by register page loads, masked (B1 64k 69.0-69.3 us against 70.4-70.8; contiguous 67.1-67.3); at one
    split, page 64 as before. The secure FP8 gather (V by K's offsets, one-compare visibility) takes 2 stages at one
    split over pages of 16 keys (B64 16k 541.9-545.5 us against 576.8-579.0), 3 elsewhere (B64 page 32 682 against
    567 on 2 stages; with splits, where 2 stages failed the counters gate at B1 4k, docs/security.md §5.20). Secure
    FP8 with splits where the loop is hoisted (not paged) counts its splits for two programs per SM (B1 64k 43.2 us
    against 50.3; fast 41.6)."""
    import flashcore.plan.decode as plan_decode
    from flashcore.launch.triton_decode import DecodeShape, build_split

    monkeypatch.setattr(plan_decode, "sm_count", lambda device: 132)

    def plan(page, batch=1, capacity=65536, secure=False, fp8=False, splits=0):
        shape = DecodeShape(batch=batch, seqlen_q=1, num_heads_q=32, num_heads_kv=8, head_dim=128, page_size=page,
                            capacity=capacity, num_pages=batch * capacity // page, paged=True, packed=False,
                            appended=False, has_batch_idx=False, has_leftpad=False, causal=True, secure=secure,
                            fp8=fp8, return_lse=False, fp32=False, scale=0.1)
        c = plan_decode.choose_config(shape, splits, torch.device("cpu"))
        q = torch.empty(batch, 1, 32, 128, dtype=torch.bfloat16, device="meta")
        kc = torch.empty(shape.num_pages, page, 8, 128, dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16,
                         device="meta")
        ce = build_split(shape, c, q, kc, kc, q, capacity // page)[3]
        return (c.block_n, c.num_warps, c.num_stages, c.num_splits), ce

    for capacity, splits in ((65536, 16), (16384, 16), (4096, 16)):
        cfg, ce = plan(64, capacity=capacity)
        assert cfg == (128, 8, 3, splits), capacity
        assert ce["REG_PAGES"] and not ce["FULL_TILES"] and ce["PAGED"] and ce["PAGE_SIZE"] == 64
    assert plan(64, batch=8, capacity=16384)[0] == (128, 8, 3, 2)
    assert plan(64, batch=64, capacity=8192)[0] == (128, 8, 3, 1) and not plan(64, batch=64, capacity=8192)[1]["REG_PAGES"]
    assert plan(32)[0] == plan(16)[0] == (64, 4, 3, 32)  # pages below 64: v51's form (v58: every split with work)
    # the secure FP8 gather's stages
    sec = dict(secure=True, fp8=True)
    assert plan(16, batch=64, capacity=16384, **sec)[0] == (128, 4, 2, 1)
    assert plan(16, batch=64, capacity=16384, **sec)[1]["GATHER_KV_OFFSETS"]
    assert plan(32, batch=64, capacity=16384, **sec)[0] == (128, 4, 3, 1)
    assert plan(8, batch=64, capacity=16384, **sec)[0] == (128, 4, 3, 1)  # not measured: as before
    assert plan(16, capacity=4096, **sec)[0] == (128, 4, 3, 16)  # 2 tiles per split: 3 stages (gate 2)
    assert plan(32, capacity=16384, **sec)[0] == (128, 4, 3, 33)
    assert plan(16, **sec)[0] == (128, 4, 3, 33) and plan(16, batch=8, capacity=16384, **sec)[0] == (128, 4, 3, 4)
    assert plan(16, batch=64, capacity=16384, fp8=True)[0][:3] == (64, 4, 4)  # the fast form as before
    # secure FP8 with splits where the loop is hoisted (not paged): splits for two programs per SM, as the fast form
    # (secure mode keeps 33: its split count is an audited launch; the fast form's is every split with work, v58)
    for kw, splits in ((dict(secure=True, fp8=True), 33), (dict(fp8=True), 32), (dict(secure=True), 16)):
        shape = DecodeShape(batch=1, seqlen_q=1, num_heads_q=32, num_heads_kv=8, head_dim=128, page_size=65536,
                            capacity=65536, num_pages=1, paged=False, packed=False, appended=False,
                            has_batch_idx=False, has_leftpad=False, causal=True, return_lse=False, fp32=False,
                            scale=0.1, **dict(dict(secure=False, fp8=False), **kw))
        c = plan_decode.choose_config(shape, 0, torch.device("cpu"))
        assert (c.block_n, c.num_warps, c.num_stages, c.num_splits) == (128, 4 if kw.get("fp8") or kw.get("secure") else 8, 3, splits), kw


@kernel
@pytest.mark.parametrize("page,splits,cap", [(16, 1, 256), (1, 1, 256), (32, 1, 320), (16, 2, 1024), (1, 2, 1024)])
def test_fast_fp8_page_gather_without_masks_matches_the_reference(page, splits, cap, launches, gen):
    """v52's FP8 page gathers (D 128, 32/8 heads; the planner's tiles: 64 keys at one split, 128 with splits) run the
    tiles every row sees whole in a loop without masks, page indices by register loads, and the rest (the tail at
    each length) in the masked loop: lengths 0, full and between (not whole tiles), NaN in the stale slots behind each length (which no unmasked tile may reach), against the float64 reference."""
    B, Hq, Hkv, D = 4, 32, 8, 128
    q = rnd(B, 1, Hq, D, dtype=torch.float16, gen=gen)
    kc, vc = (rnd(B, cap, Hkv, D, gen=gen).to(torch.float8_e4m3fn) for _ in range(2))
    L = lengths(0, cap, cap - 37, 131)
    for b in range(B):  # stale slots behind each length: e4m3fn's NaN
        kc.view(torch.uint8)[b, int(L[b]):] = 0x7F
        vc.view(torch.uint8)[b, int(L[b]):] = 0xFF
    kc, table = to_paged(kc, page, gen)
    vc, _ = to_paged(vc, page, gen, pages=rnd(*kc.shape, gen=gen).to(torch.float8_e4m3fn), table=table)
    kw = dict(cache_seqlens=L, page_table=table, num_splits=splits,
              k_descale=torch.rand(B, Hkv, generator=gen) + 0.5, v_descale=torch.rand(B, Hkv, generator=gen) + 0.5)
    (out, lse, _, _), (ref, ref_lse, _, _) = run_both(q, kc, vc, **kw)
    check(out, lse, ref, ref_lse, torch.float16, what=f"page {page} splits {splits}")
    split = [dict(cx) for name, _, _, cx in launches[-1][1] if name == "decode_split_kernel"]
    assert len(split) == 1 and split[0]["FULL_TILES"] and split[0]["REG_PAGES"], split
    assert split[0]["BLOCK_N"] == (64 if splits == 1 else 128) and split[0]["PAGE_SIZE"] == page


@kernel
@pytest.mark.parametrize("splits,cap", [(0, 512), (3, 640)])
def test_fast_16_bit_page_64_gather_on_128_key_tiles_matches_the_reference(splits, cap, launches, gen):
    """v53's 16-bit gather with splits over pages of 64 keys (D 128, 32/8 heads) on the contiguous cache's 128-key
    tiles, each tile's two pages by register page loads, masked: lengths 0, full and between (a tile with one of its
    pages past the length, and one cut inside a page), NaN in the stale slots behind each length and shuffled pages,
    against the float64 reference."""
    B, Hq, Hkv, D = 4, 32, 8, 128
    q = rnd(B, 1, Hq, D, dtype=torch.float16, gen=gen)
    kc, vc = (rnd(B, cap, Hkv, D, dtype=torch.float16, gen=gen) for _ in range(2))
    L = lengths(0, cap, cap - 37, 64 + 3)
    for b in range(B):
        kc[b, int(L[b]):], vc[b, int(L[b]):] = float("nan"), float("nan")
    kc, table = to_paged(kc, 64, gen)
    vc, _ = to_paged(vc, 64, gen, pages=rnd(*kc.shape, dtype=torch.float16, gen=gen), table=table)
    (out, lse, _, _), (ref, ref_lse, _, _) = run_both(q, kc, vc, cache_seqlens=L, page_table=table,
                                                      num_splits=splits)
    check(out, lse, ref, ref_lse, torch.float16, what=f"splits {splits}")
    split = [dict(cx) for name, _, _, cx in launches[-1][1] if name == "decode_split_kernel"]
    assert len(split) == 1 and split[0]["REG_PAGES"] and not split[0]["FULL_TILES"], split
    assert split[0]["BLOCK_N"] == 128 and split[0]["PAGE_SIZE"] == 64 and split[0]["SPLIT"]


def test_v58_short_caches_take_64_key_splits_and_every_fast_split_has_work(monkeypatch):
    """v58's planner (the bench's timer per call, cold L2, H200, docs/perf-notes.md v58, B1 32/8 D128, every sequence
    full): a contiguous 16-bit cache whose chosen splits would hold two 128-key tiles or fewer takes 64-key tiles on 4
    warps and 3 stages, one program per SM, two tiles a split or more (1k 9.86 us against 11.30, 2k 10.78 against
    11.84, 4k 12.93 against 13.66, B2 2k 12.86 against 13.60); 8k and up keep 128-key tiles. The fast two-wave page
    gather fills each SM once where two programs per SM would hold fewer than 4 tiles each (4k page 16 13.95 against
    14.46). And the fast path's chosen split count leaves no split without work (33 splits of 1,024 tiles are 32 of
    32 and an empty one: 16k page 16 26.53 against 27.36, FP8 64k 51.89 against 52.90). An explicit ``num_splits``
    and secure mode keep their forms (secure: the split count is an audited launch)."""
    import flashcore.plan.decode as plan_decode
    from flashcore.launch.triton_decode import DecodeShape
    from flashcore.runtime import cdiv

    monkeypatch.setattr(plan_decode, "sm_count", lambda device: 132)

    def config(capacity, page=0, batch=1, splits=0, secure=False, fp8=False, hkv=8, d=128):
        shape = DecodeShape(batch=batch, seqlen_q=1, num_heads_q=4 * hkv, num_heads_kv=hkv, head_dim=d,
                            page_size=page or capacity, capacity=capacity, num_pages=batch * capacity // (page or capacity),
                            paged=page > 0, packed=False, appended=False, has_batch_idx=False, has_leftpad=False,
                            causal=True, secure=secure, fp8=fp8, return_lse=False, fp32=False, scale=0.1)
        c = plan_decode.choose_config(shape, splits, torch.device("cpu"))
        return c.block_n, c.num_warps, c.num_stages, c.num_splits

    assert config(1024) == (64, 4, 3, 8)
    assert config(2048) == config(4096) == (64, 4, 3, 16)
    assert config(2048, batch=2) == (64, 4, 3, 8)
    assert config(8192) == config(65536) == (128, 8, 3, 16)  # four tiles a split or more: as before
    assert config(4096, batch=2) == (128, 8, 3, 8)
    assert config(4096, splits=16) == (128, 8, 3, 16)  # an explicit split count: the tiles as before
    assert config(4096, secure=True) == (128, 4, 3, 16) and config(4096, fp8=True) == (128, 4, 3, 16)
    assert config(4096, d=64)[:3] == config(8192, d=64)[:3]  # D 64: not measured, as before
    # the two-wave page gather
    assert config(4096, page=16) == config(2048, page=16) == (64, 4, 3, 16)
    assert config(16384, page=16) == config(65536, page=32) == (64, 4, 3, 32)
    assert config(4096, page=64) == (128, 8, 3, 16)  # page 64 with splits: v53's tiles, as before
    # secure mode's counts as audited (33 at B1 64k page 16)
    assert config(65536, page=16, secure=True)[3] == 33
    # every split with work, over a grid of fast shapes with chosen splits
    for batch in (1, 2, 3, 4, 8):
        for capacity in (1024, 1536, 2048, 4096, 5120, 16384, 65536, 131072):
            for page in (0, 1, 16, 32, 64, 128):
                for fp8 in (False, True):
                    for hkv in (1, 8, 32):
                        block_n, _, _, n = config(capacity, page=page, batch=batch, fp8=fp8, hkv=hkv)
                        tiles = cdiv(capacity, block_n)
                        chunk = cdiv(tiles, n)
                        assert (n - 1) * chunk < tiles, (batch, capacity, page, fp8, hkv, block_n, n)


@kernel
def test_fast_short_contiguous_split_form_matches_the_reference(launches, gen):
    """v58's form (a contiguous 16-bit cache of 1,024 keys at B4 32/8 D128: 64-key tiles on 4 warps, 3 stages, 4
    splits chosen by the planner): lengths 0, full, a tile cut inside and one shorter than a split, NaN in the stale
    slots behind each length, against the float64 reference."""
    B, Hq, Hkv, D, cap = 4, 32, 8, 128, 1024
    q = rnd(B, 1, Hq, D, dtype=torch.float16, gen=gen)
    kc, vc = (rnd(B, cap, Hkv, D, dtype=torch.float16, gen=gen) for _ in range(2))
    L = lengths(0, cap, cap - 37, 131)
    for b in range(B):
        kc[b, int(L[b]):], vc[b, int(L[b]):] = float("nan"), float("nan")
    (out, lse, _, _), (ref, ref_lse, _, _) = run_both(q, kc, vc, cache_seqlens=L)
    check(out, lse, ref, ref_lse, torch.float16, what="v58 form")
    plan = launches[-1][0]
    c = plan.config
    assert (c.block_m, c.block_n, c.num_warps, c.num_stages, c.num_splits) == (16, 64, 4, 3, 4), c
    names = [name for name, _, _, _ in launches[-1][1]]
    assert names == ["decode_split_kernel", "decode_combine_kernel"], names


@kernel
@pytest.mark.parametrize("layout", ["paged8", "paged8_fp8", "page1", "contiguous", "leftpad"])
@pytest.mark.parametrize("causal,Sq", [(True, 3), (False, 1)])
def test_round_robin_splits_match_the_reference(layout, causal, Sq, gen):
    """v59: the fast split kernel's tiles dealt round-robin (split s: tiles s, s + splits, ...; ``ROUND_ROBIN``)
    against the float64 reference and against the contiguous ranges before it: page gathers (8-key pages, 16-key
    tiles; 16-bit and e4m3 with descales), pages of one key, and a contiguous cache with and without a left pad
    forced; 2, 3 and 5 splits, lengths 0, 1, shorter than one tile per split (empty splits), cut inside a tile and
    full, NaN in every slot no sequence sees; and lengths the host never checked (past the capacity, negative), which
    must stay inside the cache as before."""
    from flashcore import _checks as C
    from flashcore.launch.triton_decode import DecodeConfig
    from flashcore.plan.decode import plan_kvcache

    B, Hq, Hkv, D, cap = 5, 4, 2, 32, 96
    L = lengths(0, 1, 23, cap - 5, cap)
    kc, vc = (rnd(B, cap, Hkv, D, dtype=torch.float16, gen=gen) for _ in range(2))
    fp8 = layout.endswith("fp8")
    for b in range(B):
        kc[b, int(L[b]):], vc[b, int(L[b]):] = float("nan"), float("nan" if fp8 else "inf")
    kd = vd = None
    if fp8:
        kc, vc = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
        kd, vd = (torch.rand(B, Hkv, generator=gen) + 0.25 for _ in range(2))
    table = None
    if layout.startswith("page"):
        page = 1 if layout == "page1" else 8
        kc, table = to_paged(kc, page, gen)
        vc, _ = to_paged(vc, page, gen, pages=torch.full(kc.shape, float("nan")).to(kc.dtype), table=table)
    q = rnd(B, Sq, Hq, D, dtype=torch.float16, gen=gen)
    leftpad = lengths(0, 0, 9, 17, 40) if layout == "leftpad" else None
    a = C.check_kvcache(q, kc, vc, cache_seqlens=L, k=None, v=None, page_table=table, cache_batch_idx=None,
                        cache_leftpad=leftpad, cu_seqlens_q=None, max_seqlen_q=None, k_descale=kd, v_descale=vd,
                        causal=causal, scale=None, num_splits=0, return_lse=True, out=None, secure=False,
                        backend="triton")
    tensors = {n: x for n, x in dict(page_table=table, cache_leftpad=leftpad, k_descale=kd, v_descale=vd).items()
               if x is not None}
    ref, ref_lse = R.attention_with_kvcache(q, kc, vc, cache_seqlens=L, page_table=table, cache_leftpad=leftpad,
                                            k_descale=kd, v_descale=vd, causal=causal, return_lse=True)
    wild = lengths(cap + 40, -5, 1 << 30, 7, cap)
    for splits in (2, 3, 5):
        outs = {}
        for rr in (False, True):
            plan = plan_kvcache(a, q, kc, vc, None, None, table, None, leftpad, nan_like(q),
                                config=DecodeConfig(16, 16, 4, 2, splits, full_tiles=False, round_robin=rr))
            assert plan.split.constexprs.get("ROUND_ROBIN", False) is rr
            what = f"{layout} causal={causal} Sq={Sq} splits={splits} round_robin={rr} seed {gen.initial_seed()}"
            o, lse = plan(q, kc, vc, dict(tensors, cache_seqlens=L), nan_like(q))
            check(o, lse, ref, ref_lse, torch.float16, what=what)
            outs[rr] = plan(q, kc, vc, dict(tensors, cache_seqlens=wild), nan_like(q))
        (o1, l1), (o0, l0) = outs[True], outs[False]  # unchecked lengths: clamped as before
        assert torch.allclose(o1.float(), o0.float(), atol=2e-3, rtol=2e-3), what
        assert torch.allclose(l1, l0, atol=1e-4, rtol=1e-5, equal_nan=True), what


def _b1_page16_shape(**kw):
    """The public shape of a B1 32/8 D128 decode call on a 4k cache in pages of 16, with ``kw`` changed."""
    from flashcore.launch.triton_decode import DecodeShape

    base = dict(batch=1, seqlen_q=1, num_heads_q=32, num_heads_kv=8, head_dim=128, page_size=16, capacity=4096,
                num_pages=256, paged=True, packed=False, appended=False, has_batch_idx=False, has_leftpad=False,
                causal=True, secure=False, fp8=False, return_lse=False, fp32=False, scale=0.1)
    return DecodeShape(**dict(base, **kw))


def test_round_robin_splits_are_taken_where_splits_hold_few_tiles(monkeypatch):
    """The policy for v59's round-robin splits: v58's short contiguous 16-bit form (D 128, 64-key tiles) and the FP8
    page gathers with few tiles a split, as the planner builds them; not the 16-bit page gathers, not longer splits
    (128-key tiles), not at one split, not secure, not where whole tiles run unmasked."""
    from dataclasses import replace

    import flashcore.plan.decode as pd
    from flashcore.launch.triton_decode import DecodeConfig, round_robin

    shape = _b1_page16_shape
    contiguous = dict(paged=False, page_size=4096, num_pages=1)
    dev = torch.device("cuda")
    monkeypatch.setattr(pd, "sm_count", lambda device: 132)
    for cap in (1024, 2048, 4096):  # v58's short form, as planned
        s = shape(**dict(contiguous, capacity=cap, page_size=cap))
        c = pd.choose_config(s, 0, dev)
        assert c.block_n == 64 and c.num_splits > 1 and round_robin(s, c), (cap, c)
        assert not round_robin(replace(s, secure=True), pd.choose_config(replace(s, secure=True), 0, dev))
    for s in (shape(fp8=True), shape(fp8=True, capacity=2048)):  # FP8 page gathers with few tiles a split
        c = pd.choose_config(s, 0, dev)
        assert round_robin(s, c), c
    for s in (shape(), shape(page_size=32, num_pages=128), shape(page_size=1, num_pages=4096),  # 16-bit gathers
              shape(**dict(contiguous, capacity=16384, page_size=16384)),  # longer splits, 128-key tiles
              shape(**dict(contiguous, capacity=65536, page_size=65536)), shape(fp8=True, capacity=65536),
              shape(page_size=64, num_pages=64), shape(batch=64, capacity=8192)):
        c = pd.choose_config(s, 0, dev)
        assert not round_robin(s, c), (s, c)
    cfg = DecodeConfig(16, 64, 4, 3, 16)
    s = shape(**contiguous)
    assert round_robin(s, cfg) and not round_robin(s, DecodeConfig(16, 64, 4, 3, 1))
    assert not round_robin(s, DecodeConfig(16, 64, 4, 3, 16, full_tiles=True))
    assert round_robin(shape(), DecodeConfig(16, 64, 4, 3, 16, round_robin=True))  # forced, for measurements


def test_short_page_gathers_prefetch_their_table_row(monkeypatch):
    """v59's policy for the page-table prefetch (``launch.triton_decode.warm_table``), on the planner's forms: the fast
    16-bit page gathers with splits whose table row is at most 1 KB (B1 2k and 4k at page 16, 4k at page 32); not a
    longer row (16k at page 16), one split (B64), page 64 (two pages a tile: not measured), FP8 (round-robin splits),
    contiguous caches or secure mode."""
    import flashcore.plan.decode as pd
    from flashcore.launch.triton_decode import warm_table

    shape = _b1_page16_shape
    monkeypatch.setattr(pd, "sm_count", lambda device: 132)
    dev = torch.device("cuda")
    for s in (shape(), shape(capacity=2048), shape(page_size=32, num_pages=128)):
        c = pd.choose_config(s, 0, dev)
        assert c.num_splits > 1 and warm_table(s, c), (s, c)
    for s in (shape(capacity=16384, num_pages=1024), shape(batch=64, capacity=8192), shape(page_size=64, num_pages=64),
              shape(fp8=True), shape(paged=False, page_size=4096, num_pages=1), shape(secure=True)):
        c = pd.choose_config(s, 0, dev)
        assert not warm_table(s, c), (s, c)


@pytest.fixture
def launches(monkeypatch):
    """Every KV-cache plan run during the test: (the DecodePlan object, [(kernel, grid, scalar args, constexprs)
    of each kernel launched])."""
    from flashcore.plan.decode import DecodePlan
    from flashcore.runtime.launcher import KernelStep

    runs = []
    plan_call, step_run = DecodePlan.__call__, KernelStep.run

    def call(self, *a, **k):
        runs.append((self, []))
        return plan_call(self, *a, **k)

    def run(self, ptrs, device):
        if runs:
            launch = (self.fn.__name__, tuple(self.grid), self.scalars, tuple(sorted(self.constexprs.items())))
            runs[-1][1].append(launch)
        return step_run(self, ptrs, device)

    monkeypatch.setattr(DecodePlan, "__call__", call)
    monkeypatch.setattr(KernelStep, "run", run)
    return runs


@kernel
@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "paged", "leftpad"])
def test_lengths_change_nothing_but_the_answer(secure, layout, launches, gen):
    """Only cache_seqlens (and cache_leftpad) change between calls: the same plan object, the same kernels with
    the same grids, scalar arguments and constexprs, no new plan in the cache (auto num_splits depends on
    public shapes only, so a CUDA graph replays for any lengths, and secure mode's schedule tells nothing);
    each answer is still right."""
    from flashcore.plan.cache import PLANS

    q, kc, vc, kw, _ = _secure_case(layout, torch.float32, gen)
    kw["secure"] = secure
    cap = 96
    results = []
    for i, L in enumerate((lengths(cap, 41, 0), lengths(1, cap, 57), lengths(0, 0, 0))):
        kw["cache_seqlens"] = L
        if "cache_leftpad" in kw:
            kw["cache_leftpad"] = lengths(*(min(int(x), 3) for x in L))
        if i == 1:
            n_plans = len(PLANS)
        out, lse = flashcore.attention_with_kvcache(q, kc, vc, backend="triton", return_lse=True, out=nan_like(q),
                                                   **kw)
        ref, ref_lse = R.attention_with_kvcache(q, kc, vc, return_lse=True, **kw)
        check(out, lse, ref, ref_lse, torch.float32, what=f"L={L.tolist()}")
        results.append(out)
    assert len(PLANS) == n_plans
    plans = [p for p, _ in launches]
    assert len(plans) == 3 and plans[0] is plans[1] is plans[2]
    assert launches[0][1] == launches[1][1] == launches[2][1] and launches[0][1]
    assert not torch.equal(results[0], results[1])


@pytest.fixture
def memory_trace(monkeypatch):
    """Every load and store the interpreter executes, as (kernel, load/store, mask, which argument and which
    byte offset in it each active lane touches): addresses relative to the arguments' storages, so buffers
    allocated afresh per call (workspace, lse) compare equal. ``memory_trace`` is the list of records."""
    import numpy as np
    from triton.runtime import interpreter as I

    trace, ranges, names = [], [], []
    init = I.GridExecutor._init_args_hst

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = init(self, args_dev, kwargs)
        ranges.clear()
        for a in list(args_hst) + list(kwargs_hst.values()):
            if isinstance(a, torch.Tensor):
                st = a.untyped_storage()
                ranges.append((st.data_ptr(), st.data_ptr() + st.nbytes()))
        names.append(getattr(self.fn, "__name__", "?"))
        return args_hst, kwargs_hst

    def record(kind, ptrs, mask):
        p = np.asarray(ptrs, dtype=np.uint64).ravel()
        m = np.broadcast_to(np.asarray(mask, dtype=bool), np.shape(ptrs)).ravel()
        which = np.full(p.shape, -1, dtype=np.int64)
        off = np.zeros(p.shape, dtype=np.uint64)
        for i, (lo, hi) in enumerate(ranges):
            hit = m & (p >= lo) & (p < hi) & (which < 0)
            which[hit], off[hit] = i, p[hit] - lo
        trace.append((names[-1], kind, m.tobytes(), which[m].tobytes(), off[m].tobytes()))

    real = I._interpreter

    def load(ptrs, mask, other, dtype):
        record("load", ptrs, mask)
        return real.load(ptrs, mask, other, dtype)

    def store(ptrs, value, mask):
        record("store", ptrs, mask)
        return real.store(ptrs, value, mask)

    proxy = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real) if not n.startswith("__")})
    proxy.load, proxy.store = load, store
    monkeypatch.setattr(I.GridExecutor, "_init_args_hst", init_args)
    monkeypatch.setattr(I, "_interpreter", proxy)
    return trace


@kernel
@pytest.mark.parametrize("layout", ["paged", "leftpad", "batch_idx"])
def test_secure_memory_trace_is_independent_of_the_lengths(layout, memory_trace, gen):
    """Secure mode: every load and store (which buffer, which bytes, which lanes) is the same whatever
    cache_seqlens and cache_leftpad hold; the fast path's trace differs (so the comparison can see a change)."""
    q, kc, vc, kw, _ = _secure_case(layout, torch.float16, gen)
    out = nan_like(q)
    traces = {}
    for secure in (True, False):
        for L in (lengths(96, 41, 0), lengths(5, 0, 90)):
            over = dict(cache_seqlens=L, secure=secure)
            if layout == "leftpad":
                over["cache_leftpad"] = lengths(*(int(x) // 2 for x in L))
            memory_trace.clear()
            flashcore.attention_with_kvcache(q, kc, vc, backend="triton", return_lse=True, num_splits=2, out=out,
                                             **dict(kw, **over))
            assert memory_trace
            traces.setdefault(secure, []).append(list(memory_trace))
    assert traces[True][0] == traces[True][1], "secure mode: the memory accesses depend on the lengths"
    assert traces[False][0] != traces[False][1]


@st.composite
def kvcache_calls(draw):
    """Random calls mixing every option (GQA groups that divide the query tile or not)."""
    B, Hkv = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    c = dict(B=B, Hkv=Hkv, Hq=Hkv * draw(st.sampled_from([1, 2, 3, 4, 6, 8])), D=draw(st.sampled_from([16, 24, 40, 64])),
             Sq=draw(st.sampled_from([1, 2, 5, 17])), dtype=draw(st.sampled_from(DTYPES)),
             causal=draw(st.booleans()), splits=draw(st.sampled_from([0, 1, 2, 5])),
             page_size=draw(st.sampled_from([None, None, None, 1, 5, 16, 48, 64, 80])), packed=draw(st.booleans()),
             append=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)))
    c["width"] = draw(st.integers(1, 160 // (c["page_size"] or 32) + 1))
    c["secure"] = (not c["packed"] and not c["append"] and c["page_size"] in (None, *SECURE_PAGE_SIZES)
                   and draw(st.booleans()))
    c["leftpad"] = not c["page_size"] and draw(st.booleans())
    c["batch_idx"] = not c["page_size"] and draw(st.booleans())
    c["lens_q"] = draw(st.lists(st.integers(0, c["Sq"]), min_size=B, max_size=B)) if c["packed"] else [c["Sq"]] * B
    c["fill"] = draw(st.lists(st.sampled_from([0.0, 0.3, 0.7, 1.0]), min_size=2 * B, max_size=2 * B))  # of capacity
    return c


@kernel
@settings(max_examples=int(os.environ.get("FLASHCORE_PROPERTY_EXAMPLES", "25")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(c=kvcache_calls())
def test_property_random_calls(c):
    B, Hq, Hkv, D, dtype, ps = c["B"], c["Hq"], c["Hkv"], c["D"], c["dtype"], c["page_size"]
    gen = torch.Generator().manual_seed(c["seed"])
    grow = c["lens_q"] if c["append"] else [0] * B
    cap = max(ps or 32, 1) * c["width"]
    cap = max(cap, max(grow) + 1)
    if ps:
        cap = -(-cap // ps) * ps
    L = lengths(*(int(f * (cap - g)) for f, g in zip(c["fill"][:B], grow)))
    kw = dict(cache_seqlens=L, causal=c["causal"], num_splits=c["splits"], secure=c["secure"])
    if c["packed"]:
        q, cu = _pack(c["lens_q"], Hq, D, dtype=dtype, gen=gen)
        kw.update(cu_seqlens_q=cu, max_seqlen_q=max(1, max(c["lens_q"])))
    else:
        q = rnd(B, c["Sq"], Hq, D, dtype=dtype, gen=gen)
    if c["append"]:
        kw["k"], kw["v"] = (rnd(*q.shape[:-2], Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    kc, vc = (rnd(B, cap, Hkv, D, dtype=dtype, gen=gen) for _ in range(2))
    if ps:
        kc, table = to_paged(kc, ps, gen)
        vc, _ = to_paged(vc, ps, gen, pages=rnd(*kc.shape, dtype=dtype, gen=gen), table=table)
        kw["page_table"] = table
    if c["batch_idx"]:
        kw["cache_batch_idx"] = torch.randperm(B, generator=gen).to(torch.int32)
    if c["leftpad"]:
        kw["cache_leftpad"] = lengths(*(int(f * int(x)) for f, x in zip(c["fill"][B:], L)))
    kw_ref = {n: x for n, x in kw.items() if n not in ("num_splits", "secure")}
    kc1, vc1, kr, vr = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    out, lse = flashcore.attention_with_kvcache(q, kc1, vc1, backend="triton", return_lse=True, out=nan_like(q), **kw)
    ref, ref_lse = R.attention_with_kvcache(q, kr, vr, return_lse=True, **kw_ref)
    check(out, lse, ref, ref_lse, dtype, packed=c["packed"], what=str(c))
    assert torch.equal(kc1, kr) and torch.equal(vc1, vr)


# ---- out=, auto on CPU, bf16, repeat calls --------------------------------------------------------------


@pytest.mark.parametrize("backend", ["reference", "auto"] + (["triton"] if INTERPRET else []))
@pytest.mark.parametrize("splits", [1, 3])
def test_out_buffer_is_returned_and_filled(backend, splits, gen):
    B, Sq, Hq, Hkv, D, S = 2, 3, 4, 2, 32, 64
    q = rnd(B, Sq, Hq, D, gen=gen)
    kc, vc = (rnd(B, S, Hkv, D, gen=gen) for _ in range(2))
    L = lengths(64, 20)
    out = nan_like(q)
    res = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=L, out=out, num_splits=splits, backend=backend)
    assert res is out and not torch.isnan(out).any()
    assert rel_err(out, R.attention_with_kvcache(q, kc, vc, cache_seqlens=L)) < 1e-5
    res, lse = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=L, out=out, return_lse=True,
                                                num_splits=splits, backend=backend)
    assert res is out and lse.shape == (B, Hq, Sq)


def test_auto_backend_on_cpu_runs_the_reference(ran, gen):
    B, Sq, Hq, Hkv, D, S = 2, 2, 4, 2, 16, 32
    q = rnd(B, Sq, Hq, D, gen=gen)
    kc, vc = (rnd(B, S, Hkv, D, gen=gen) for _ in range(2))
    k, v = (rnd(B, Sq, Hkv, D, gen=gen) for _ in range(2))
    kr, vr = kc.clone(), vc.clone()
    out, lse = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=5, k=k, v=v, return_lse=True)
    assert ran.reference == 1 and ran.kernels == []
    ref, ref_lse = R.attention_with_kvcache(q, kr, vr, cache_seqlens=lengths(5, 5), k=k, v=v, return_lse=True)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert rel_err(out, ref) < 1e-6 and torch.equal(lse, ref_lse.float())
    assert torch.equal(kc, kr) and torch.equal(vc, vr)


@pytest.mark.parametrize("packed", [False, True])
def test_bf16_on_the_reference_route(packed, gen):
    Hq, Hkv, D, S = 4, 2, 32, 40
    if packed:
        q, cu = _pack([3, 1], Hq, D, dtype=torch.bfloat16, gen=gen)
        kw = dict(cu_seqlens_q=cu, max_seqlen_q=3)
    else:
        q, kw = rnd(2, 3, Hq, D, dtype=torch.bfloat16, gen=gen), {}
    kc, vc = (rnd(2, S, Hkv, D, dtype=torch.bfloat16, gen=gen) for _ in range(2))
    L = lengths(17, 0)
    out, lse = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=L, backend="reference", return_lse=True,
                                                out=nan_like(q), **kw)
    ref, ref_lse = R.attention_with_kvcache(q, kc, vc, cache_seqlens=L, return_lse=True, **kw)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref.to(torch.bfloat16))
    assert torch.equal(lse, ref_lse.float())
    if INTERPRET:  # the interpreter computes bf16 wrongly: the kernel route refuses it
        with pytest.raises(ValueError, match="bfloat16"):
            flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=L, backend="triton", **kw)


@kernel
def test_repeat_calls_reuse_the_plan_with_new_tensors(launches, gen):
    """A plan is replayed with each call's own tensors: new caches, q and lengths of the same shapes give their
    own answers (nothing of the first call is baked into the plan)."""
    B, Sq, Hq, Hkv, D, S = 2, 2, 4, 2, 32, 64
    for i in range(3):
        q = rnd(B, Sq, Hq, D, gen=gen)
        kc, vc = (rnd(B, S, Hkv, D, gen=gen) for _ in range(2))
        k, v = (rnd(B, Sq, Hkv, D, gen=gen) for _ in range(2))
        L = torch.randint(0, S - Sq + 1, (B,), generator=gen, dtype=torch.int32)
        (out, lse, kc2, vc2), (ref, ref_lse, kr, vr) = run_both(q, kc, vc, cache_seqlens=L, k=k, v=v, num_splits=2)
        check(out, lse, ref, ref_lse, torch.float32)
        assert torch.equal(kc2, kr) and torch.equal(vc2, vr)
    assert launches[0][0] is launches[1][0] is launches[2][0]


@kernel
def test_strided_inputs(gen):
    """Views with a unit last stride but no other contiguity: q a slice, K and V caches interleaved in one
    [pages, page_size, 2, Hkv, D] buffer, k/v slices."""
    B, Sq, Hq, Hkv, D, ps, width = 2, 2, 4, 2, 32, 16, 4
    q = rnd(B, Sq, Hq, 2 * D, gen=gen)[..., D:]
    kv = rnd(B * width + 1, ps, 2, Hkv, D, gen=gen)
    table = torch.randperm(B * width + 1, generator=gen)[: B * width].view(B, width).to(torch.int32)
    knew = rnd(B, Sq, 2, Hkv, D, gen=gen)
    kw = dict(cache_seqlens=lengths(40, 3), page_table=table, k=knew[:, :, 0], v=knew[:, :, 1])
    kv_ref = kv.clone()
    out = flashcore.attention_with_kvcache(q, kv[:, :, 0], kv[:, :, 1], backend="triton", out=nan_like(q), **kw)
    ref = R.attention_with_kvcache(q, kv_ref[:, :, 0], kv_ref[:, :, 1], **kw)
    assert rel_err(out, ref) < TOL[torch.float32] and torch.equal(kv, kv_ref)



@kernel
@pytest.mark.parametrize("paged", [False, True])
def test_v_cache_with_strides_of_its_own(paged, gen):
    """K and V caches with different strides (V's rows padded, K contiguous): the kernel addresses V by K's offsets
    only when their strides are equal (``SAME_KV``); here each must be read through its own."""
    B, Sq, Hq, Hkv, D, ps, width = 2, 1, 4, 2, 32, 16, 4
    q = rnd(B, Sq, Hq, D, gen=gen)
    n = B * width + 1 if paged else B
    S = ps if paged else ps * width
    kc = rnd(n, S, Hkv, D, gen=gen)
    vc = rnd(n, S, Hkv + 1, D + 8, gen=gen)[:, :, 1:, 8:]  # other strides in every dimension, unit last stride
    assert kc.stride()[:3] != vc.stride()[:3]
    kw = dict(cache_seqlens=lengths(40, 3), num_splits=2)
    if paged:
        kw["page_table"] = torch.randperm(n, generator=gen)[: B * width].view(B, width).to(torch.int32)
    out = flashcore.attention_with_kvcache(q, kc, vc, backend="triton", out=nan_like(q), **kw)
    ref = R.attention_with_kvcache(q, kc, vc, **kw)
    assert rel_err(out, ref) < TOL[torch.float32]

# ---- torch.compile --------------------------------------------------------------------------------------


def _compile_case(gen, append):
    B, Sq, Hq, Hkv, D, S = 2, 2, 4, 2, 16, 40
    q = rnd(B, Sq, Hq, D, gen=gen)
    kc, vc = (rnd(B, S, Hkv, D, gen=gen) for _ in range(2))
    k, v = (rnd(B, Sq, Hkv, D, gen=gen) for _ in range(2)) if append else (None, None)
    return q, kc, vc, k, v, lengths(5, 30)


@pytest.mark.parametrize("backend", ["auto"] + (["triton"] if INTERPRET else []))
@pytest.mark.parametrize("append", [False, True])
def test_torch_compile_fullgraph(backend, append, ran, gen):
    """torch.compile(fullgraph=True) traces through a function that calls attention_with_kvcache (the custom op
    flashcore::attention_with_kvcache, which mutates the caches): the route asked for runs (the kernels for
    backend="triton", the reference for "auto" on CPU), the answer and the caches are the reference's."""
    q, kc, vc, k, v, L = _compile_case(gen, append)

    def f(q, kc, vc, L, k, v):
        out, lse = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=L, k=k, v=v, backend=backend,
                                                    return_lse=True, num_splits=2)
        return out * 2, lse

    torch._dynamo.reset()
    kr, vr = kc.clone(), vc.clone()
    out2, lse = torch.compile(f, fullgraph=True, backend="aot_eager")(q, kc, vc, L, k, v)
    ref, ref_lse = R.attention_with_kvcache(q, kr, vr, cache_seqlens=L, k=k, v=v, return_lse=True)
    if backend == "triton":
        assert [name for name, _ in ran.kernels] == ["triton_decode"] and ran.reference == 0
    else:
        assert ran.reference == 1 and ran.kernels == []
    check(out2 / 2, lse, ref, ref_lse, torch.float32)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)


def test_kvcache_op_is_registered_with_a_fake_impl():
    import flashcore.ops  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert hasattr(torch.ops.flashcore, "attention_with_kvcache")
    with FakeTensorMode():
        q = torch.empty(2, 3, 4, 64, dtype=torch.float16)
        kc = torch.empty(2, 50, 2, 64, dtype=torch.float16)
        L = torch.empty(2, dtype=torch.int32)
        schema = torch.ops.flashcore.attention_with_kvcache.default._schema
        args = {a.name: None for a in schema.arguments}
        args.update(q=q, k_cache=kc, v_cache=kc, cache_seqlens=L, max_seqlen_q=3, causal=True, scale=0.125,
                    num_splits=0, return_lse=True, secure=False)
        if "backend" in args:
            args["backend"] = "auto"
        out, lse = torch.ops.flashcore.attention_with_kvcache(**args)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (2, 4, 3) and lse.dtype == torch.float32


def test_scale_and_int_cache_seqlens(gen):
    """An explicit scale; cache_seqlens as a Python int (the same length for every sequence)."""
    q = rnd(2, 1, 2, 16, gen=gen)
    kc, vc = (rnd(2, 20, 2, 16, gen=gen) for _ in range(2))
    a = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=7, scale=0.3, backend="reference")
    b = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths(7, 7), scale=0.3)
    assert torch.equal(R.attention_with_kvcache(q, kc, vc, cache_seqlens=7, scale=0.3), b)  # the same signature
    c = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths(7, 7))
    assert rel_err(a, b) < 1e-6 and rel_err(a, c) > 1e-3
    assert math.isclose(float(flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=0).abs().sum()), 0.0)


@kernel
def test_a_repeat_call_skips_the_metadata_checks_but_not_the_value_checks(monkeypatch, gen):
    """The second call with the same public facts is a plan-cache hit (no metadata checks, no planning); the
    values (lengths past the capacity here) are still checked on the host."""
    from flashcore import _checks

    q = rnd(2, 1, 4, 16, gen=gen)
    kc, vc = (rnd(2, 32, 2, 16, gen=gen) for _ in range(2))
    L = lengths(5, 32)
    first = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=L, backend="triton")

    def refuse(*a, **k):
        raise AssertionError("metadata checked again on a plan-cache hit")

    monkeypatch.setattr(_checks, "check_kvcache", refuse)
    again = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=L, backend="triton")
    assert torch.equal(first, again)
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\]=33"):
        flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths(5, 33), backend="triton")


def _prefill_shape(Hq, Hkv, Sq, causal=True, secure=True, paged=False, D=128):
    from flashcore.launch.triton_decode import DecodeShape

    return DecodeShape(batch=4, seqlen_q=Sq, num_heads_q=Hq, num_heads_kv=Hkv, head_dim=D, page_size=16 if paged else 8192,
                       capacity=8192, num_pages=4 * 512 if paged else 4, paged=paged, packed=False, appended=False,
                       has_batch_idx=False, has_leftpad=False, causal=causal, secure=secure, fp8=False,
                       return_lse=False, fp32=False, scale=D ** -0.5)


def test_secure_chunked_prefill_cleans_v_by_the_pre_pass_where_the_loader_would_clear_each_tile_16_times():
    """plan.prefill.uses_v_prepass (perf-notes v46): the V pre-pass for secure causal chunked prefill (a contiguous or
    a paged cache) where the loader would clear each V tile at least 16 times (query heads per K/V head times 128-row
    items), the loader's clearing elsewhere (fewer clears, non-causal) and never on the fast path; the
    ``secure_prefill_v`` switch forces either way (not the fast path), and names itself when given anything else."""
    from flashcore.plan.knobs import override
    from flashcore.plan.prefill import uses_v_prepass

    assert uses_v_prepass(_prefill_shape(32, 8, 512))  # 4 x 4 clears: the decode bench's row
    assert uses_v_prepass(_prefill_shape(32, 2, 128))  # 16 x 1
    assert not uses_v_prepass(_prefill_shape(32, 8, 384))  # 4 x 3
    assert not uses_v_prepass(_prefill_shape(16, 16, 512, D=64))  # 1 x 4 (measured: the loader wins)
    assert not uses_v_prepass(_prefill_shape(32, 8, 512, causal=False))  # a tie, measured
    assert uses_v_prepass(_prefill_shape(32, 8, 512, paged=True))
    assert not uses_v_prepass(_prefill_shape(32, 8, 384, paged=True))
    assert not uses_v_prepass(_prefill_shape(32, 8, 512, secure=False))
    with override(secure_prefill_v="prepass"):
        assert uses_v_prepass(_prefill_shape(16, 16, 512, causal=False))
        assert uses_v_prepass(_prefill_shape(16, 16, 128, paged=True))
        assert not uses_v_prepass(_prefill_shape(32, 8, 512, secure=False))
    with override(secure_prefill_v="loader"):
        assert not uses_v_prepass(_prefill_shape(32, 8, 512))
        assert not uses_v_prepass(_prefill_shape(32, 8, 512, paged=True))
    with override(secure_prefill_v="sometimes"), pytest.raises(ValueError, match="secure_prefill_v"):
        uses_v_prepass(_prefill_shape(32, 8, 512))


def test_the_gluon_launch_takes_v_from_the_pre_pass_only_in_secure_mode_with_key_lengths_on_a_contiguous_cache():
    """GluonLaunch(v_prepass=True) builds the kernel's V_PREPASS form (its loader one copying warp, at the fast
    loader's registers) for secure key-length launches, and refuses, naming the argument, any other form: without it
    the loader would skip the clearing that V's stale rows need. With a paged K its V descriptor's box is a whole key
    tile of the pre-pass's contiguous copy, K's one page."""
    from flashcore.launch.sm90_fwd import LOADER_REGS, GluonLaunch
    from flashcore.plan.tables import gluon_ws

    B, H, S, D = 2, 4, 256, 128
    q = torch.empty(B, H, S, D, dtype=torch.bfloat16)
    kw = dict(scale=0.1, causal=True, seqlen_q=S, seqlen_k=S, batch=B, num_heads_q=H, num_heads_kv=H,
              lse_strides=(H * S, S), cfg=gluon_ws(D, S, True))
    launch = GluonLaunch(q, q, q, q, None, secure=True, key_lens=True, v_prepass=True, **kw)
    assert launch.step.constexprs["V_PREPASS"] and launch.step.constexprs["LOADER_WG_REGS"] == LOADER_REGS
    assert not GluonLaunch(q, q, q, q, None, secure=True, key_lens=True, **kw).step.constexprs["V_PREPASS"]
    for bad in (dict(secure=False, key_lens=True), dict(secure=True, key_lens=False)):
        with pytest.raises(ValueError, match="v_prepass"):
            GluonLaunch(q, q, q, q, None, v_prepass=True, **bad, **kw)
    page = 16
    kp = torch.empty(B * S // page, page, H, D, dtype=torch.bfloat16).transpose(1, 2)
    paged = GluonLaunch(q, kp, q, q, None, secure=True, key_lens=True, v_prepass=True, page_size=page,
                        table_stride=S // page, **kw)
    assert paged.geom[1][2] == [1, 1, page, D] and paged.geom[2][2] == [1, 1, kw["cfg"].block_n, D]
