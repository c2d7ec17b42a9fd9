"""Bad input to ``flashcore.attention_with_kvcache`` gets a ValueError/TypeError naming the argument, on every
backend, before anything runs: in particular nothing is written into the caches (the append comes first)."""
import os

import pytest
import torch

import flashcore

BACKENDS = ["reference", "auto"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else [])
B, SQ, HQ, HKV, D, S = 2, 2, 4, 2, 32, 16  # capacity S; paged: 5 pages of 8, tables 2 wide (capacity 16)


def t(*shape, dtype=torch.float16):
    return (torch.randn(*shape) + 0.5).to(dtype)  # random, never zeros


def i32(*values):
    return torch.tensor(values, dtype=torch.int32)


def base(paged=False):
    """A valid call that appends: q, caches, cache_seqlens, k/v (and the page table)."""
    a = dict(q=t(B, SQ, HQ, D), k=t(B, SQ, HKV, D), v=t(B, SQ, HKV, D), cache_seqlens=i32(3, 5))
    if paged:
        a.update(k_cache=t(5, 8, HKV, D), v_cache=t(5, 8, HKV, D), page_table=i32(4, 1, 0, 2).view(B, 2))
    else:
        a.update(k_cache=t(B, S, HKV, D), v_cache=t(B, S, HKV, D))
    return a


def fp8(a):
    return dict(k_cache=a["k_cache"].to(torch.float8_e4m3fn), v_cache=a["v_cache"].to(torch.float8_e4m3fn),
                k=a["k"].to(torch.float8_e4m3fn), v=a["v"].to(torch.float8_e4m3fn))


def call(a):
    a = dict(a)
    return flashcore.attention_with_kvcache(a.pop("q"), a.pop("k_cache"), a.pop("v_cache"), **a)


def bits(x):
    return x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x


# (case id, paged base, overrides (a dict, or a function of the base call's arguments), exception, message)
CASES = [
    # page table
    ("page entry past the pages", True, dict(page_table=i32(4, 1, 0, 5).view(B, 2), cache_seqlens=i32(3, 9)),
     ValueError, r"page_table\[1, 1\]=5 is not a page"),
    ("page entry negative", True, dict(page_table=i32(-1, 1, 0, 2).view(B, 2)), ValueError, r"page_table\[0, 0\]=-1"),
    ("page entry of an appended slot", True, dict(page_table=i32(4, 1, 0, 7).view(B, 2), cache_seqlens=i32(3, 7)),
     ValueError, r"page_table\[1, 1\]=7"),  # 7 + 2 new tokens reach the second page
    ("page_table int64", True, lambda a: dict(page_table=a["page_table"].long()), TypeError,
     "page_table must be int32"),
    ("page_table rows", True, dict(page_table=i32(0, 1, 2, 3, 4, 0).view(3, 2)), ValueError,
     r"page_table must have shape \[2, 2\]"),
    ("page_table 1-D", True, dict(page_table=i32(0, 1)), ValueError, "page_table must be an int32 tensor"),
    ("page_table a list", True, dict(page_table=[[4, 1], [0, 2]]), TypeError, "page_table must be an int32"),
    ("page_table strided", True, dict(page_table=i32(4, 9, 1, 9, 0, 9, 2, 9).view(B, 4)[:, ::2]), ValueError,
     "page_table must be contiguous"),
    ("page_table with cache_batch_idx", True, dict(cache_batch_idx=i32(0, 1)), ValueError, "cache_batch_idx"),
    ("page size 0", True, dict(k_cache=t(5, 0, HKV, D), v_cache=t(5, 0, HKV, D)), ValueError, "page size"),
    ("page size 257", True, dict(k_cache=t(2, 257, HKV, D), v_cache=t(2, 257, HKV, D)), ValueError, "page size"),
    ("leftpad with pages", True, dict(cache_leftpad=i32(0, 0)), ValueError, "cache_leftpad is only for a contiguous"),
    # lengths
    ("lengths plus new tokens past capacity", False, dict(cache_seqlens=i32(3, 15)), ValueError,
     r"cache_seqlens\[1\]=15 plus 2 new tokens does not fit the cache's capacity 16"),
    ("paged lengths plus new tokens past capacity", True, dict(cache_seqlens=i32(15, 0)), ValueError,
     r"cache_seqlens\[0\]=15 plus 2 new tokens"),
    ("length past capacity", False, dict(k=None, v=None, cache_seqlens=i32(3, 17)), ValueError,
     r"cache_seqlens\[1\]=17 does not fit"),
    ("length negative", False, dict(cache_seqlens=i32(-1, 3)), ValueError, r"cache_seqlens\[0\]=-1"),
    ("cache_seqlens int64", False, dict(cache_seqlens=torch.tensor([3, 5])), TypeError, "cache_seqlens must be int32"),
    ("cache_seqlens float", False, dict(cache_seqlens=torch.tensor([3.0, 5.0])), TypeError,
     "cache_seqlens must be int32"),
    ("cache_seqlens shape", False, dict(cache_seqlens=i32(3, 5, 1)), ValueError,
     r"cache_seqlens must have shape \[2\]"),
    ("cache_seqlens 2-D", False, dict(cache_seqlens=i32(3, 5).view(2, 1)), ValueError, "cache_seqlens must have shape"),
    ("cache_seqlens strided", False, dict(cache_seqlens=i32(3, 0, 5, 0)[::2]), ValueError,
     "cache_seqlens must be contiguous"),
    ("cache_seqlens on another device", False, dict(cache_seqlens=i32(3, 5).to("meta")), ValueError,
     "cache_seqlens must be on q's device"),
    ("cache_seqlens a list", False, dict(cache_seqlens=[3, 5]), TypeError, "cache_seqlens must be an int32"),
    ("cache_seqlens a bool", False, dict(cache_seqlens=True), TypeError, "cache_seqlens must be an int32"),
    ("cache_seqlens a float", False, dict(cache_seqlens=3.0), TypeError, "cache_seqlens must be an int32"),
    ("int cache_seqlens past capacity", False, dict(cache_seqlens=15), ValueError, r"cache_seqlens\[0\]=15"),
    ("leftpad past the length", False, dict(cache_leftpad=i32(0, 6)), ValueError, r"cache_leftpad\[1\]=6"),
    ("leftpad negative", False, dict(cache_leftpad=i32(-2, 0)), ValueError, r"cache_leftpad\[0\]=-2"),
    ("leftpad int64", False, dict(cache_leftpad=torch.tensor([0, 0])), TypeError, "cache_leftpad must be int32"),
    # k / v
    ("k without v", False, dict(v=None), ValueError, "k and v go together: got k without v"),
    ("v without k", False, dict(k=None), ValueError, "k and v go together: got v without k"),
    ("k dtype", False, lambda a: dict(k=a["k"].float()), TypeError, "k must have the cache's dtype"),
    ("v dtype", False, lambda a: dict(v=a["v"].float()), TypeError, "v must have the cache's dtype"),
    ("k shape", False, dict(k=t(B, SQ + 1, HKV, D)), ValueError, r"k must have shape \[2, 2, 2, 32\]"),
    ("v heads", False, dict(v=t(B, SQ, HQ, D)), ValueError, "v must have shape"),
    ("k a list", False, lambda a: dict(k=a["k"].tolist()), TypeError, "k must be a torch.Tensor"),
    ("k strided", False, dict(k=t(B, SQ, HKV, 2 * D)[..., ::2]), ValueError, "k must have a unit stride"),
    ("k overlapping k_cache", False, lambda a: dict(k=a["k_cache"][:, :SQ]), ValueError,
     "k must not overlap k_cache"),
    ("v overlapping v_cache", False, lambda a: dict(v=a["v_cache"][:, S - SQ:]), ValueError,
     "v must not overlap v_cache"),
    ("q overlapping k_cache", False, lambda a: dict(q=a["k_cache"].view(-1)[: B * SQ * HQ * D].view(B, SQ, HQ, D)),
     ValueError, "q must not overlap k_cache"),
    ("q overlapping paged v_cache", True,
     lambda a: dict(q=a["v_cache"].view(-1)[-B * SQ * HQ * D:].view(B, SQ, HQ, D)), ValueError,
     "q must not overlap v_cache"),
    ("v_cache is k_cache", False, lambda a: dict(v_cache=a["k_cache"]), ValueError,
     "k_cache and v_cache must not share memory"),
    ("paged v_cache is k_cache", True, lambda a: dict(v_cache=a["k_cache"]), ValueError,
     "k_cache and v_cache must not share memory"),
    ("v_cache one page after k_cache", True, lambda a: (lambda pool: dict(k_cache=pool[:5], v_cache=pool[1:]))(
        t(6, 8, HKV, D)), ValueError, "k_cache and v_cache must not share memory"),
    ("v_cache one token after k_cache", False, lambda a: (lambda pool: dict(
        k_cache=pool[:, :S], v_cache=pool[:, 1:]))(t(B, S + 1, HKV, D)), ValueError,
     "k_cache and v_cache must not share memory"),
    ("expanded caches, two appends on one slot", False,
     lambda a: dict(k_cache=t(1, S, HKV, D).expand(B, S, HKV, D), v_cache=t(1, S, HKV, D).expand(B, S, HKV, D),
                    cache_seqlens=i32(3, 4)), ValueError,
     r"sequence 0 \(position 4, row 0\) and sequence 1 \(position 4, row 1\) append into one slot of k_cache"),
    ("one cache row, two appends on one slot", False,
     lambda a: dict(k_cache=t(3, S, HKV, D), v_cache=t(3, S, HKV, D), cache_batch_idx=i32(1, 1),
                    cache_seqlens=i32(3, 4)), ValueError,
     r"sequence 0 \(position 4, row 1\) and sequence 1 \(position 4, row 1\) append into one slot"),
    ("one page, two appends on one slot", True, dict(page_table=i32(4, 1, 4, 2).view(B, 2), cache_seqlens=i32(3, 4)),
     ValueError, r"sequence 0 \(position 4, page 4\) and sequence 1 \(position 4, page 4\) append into one slot"),
    # q
    ("q int", False, dict(q=torch.ones(B, SQ, HQ, D, dtype=torch.int32)), TypeError, "q must be float16"),
    ("q float64", False, lambda a: dict(q=a["q"].double()), TypeError, "q must be float16"),
    ("q not a tensor", False, dict(q=None), TypeError, "q must be a torch.Tensor"),
    ("q 3-D without cu_seqlens_q", False, dict(q=t(B * SQ, HQ, D)), ValueError, "q must be 4-D"),
    ("q 5-D", False, dict(q=t(B, SQ, HQ, D, 1)), ValueError, "q must be 4-D"),
    ("q empty", False, dict(q=t(B, 0, HQ, D)), ValueError, "q must have B >= 1 and Sq >= 1"),
    ("q head dim", False, dict(q=t(B, SQ, HQ, 16)), ValueError, "head dim 32 must equal q's head dim 16"),
    ("q heads", False, dict(q=t(B, SQ, 3, D)), ValueError, r"q heads \(3\) must be a multiple"),
    ("q strided", False, dict(q=t(B, SQ, HQ, 2 * D)[..., ::2]), ValueError, "q must have a unit stride"),
    ("q batch", False, dict(q=t(3, SQ, HQ, D)), ValueError, "k_cache has 2 cache rows but the batch is 3"),
    ("q bf16, caches fp16", False, lambda a: dict(q=a["q"].bfloat16()), TypeError,
     "k_cache must have q's dtype torch.bfloat16"),
    # caches
    ("k_cache dtype", False, lambda a: dict(k_cache=a["k_cache"].float()), TypeError,
     "k_cache must have q's dtype"),
    ("v_cache dtype", False, lambda a: dict(v_cache=a["v_cache"].float()), TypeError,
     "v_cache must have q's dtype"),
    ("k_cache int8", False, lambda a: dict(k_cache=a["k_cache"].to(torch.int8)), TypeError, "k_cache must have"),
    ("k_cache not a tensor", False, dict(k_cache="cache"), TypeError, "k_cache must be a torch.Tensor"),
    ("k_cache 3-D", False, dict(k_cache=t(B, S, HKV * D), v_cache=t(B, S, HKV * D)), ValueError,
     "k_cache must be 4-D"),
    ("caches of different shapes", False, dict(v_cache=t(B, S + 1, HKV, D)), ValueError,
     "k_cache and v_cache must have the same shape"),
    ("caches of different dtypes", False, lambda a: dict(v_cache=a["v_cache"].to(torch.float8_e4m3fn),
                                                         k_descale=torch.ones(B, HKV), v_descale=torch.ones(B, HKV)),
     TypeError, "k_cache and v_cache must share one dtype"),
    ("k_cache strided", False, dict(k_cache=t(B, S, HKV, 2 * D)[..., ::2]), ValueError,
     "k_cache must have a unit stride"),
    ("cache head dim", False, dict(k_cache=t(B, S, HKV, 16), v_cache=t(B, S, HKV, 16)), ValueError, "head dim 16"),
    ("cache heads", False, dict(k_cache=t(B, S, 3, D), v_cache=t(B, S, 3, D)), ValueError,
     r"multiple of the number of k/v cache heads \(3\)"),
    # cache_batch_idx
    ("cache_batch_idx past the rows", False, dict(cache_batch_idx=i32(0, 2)), ValueError,
     r"cache_batch_idx\[1\]=2 is not a row of the cache \(it has 2\)"),
    ("cache_batch_idx negative", False, dict(cache_batch_idx=i32(-1, 0)), ValueError, r"cache_batch_idx\[0\]=-1"),
    ("cache_batch_idx int64", False, dict(cache_batch_idx=torch.tensor([0, 1])), TypeError,
     "cache_batch_idx must be int32"),
    ("cache_batch_idx shape", False, dict(cache_batch_idx=i32(0, 1, 0)), ValueError,
     r"cache_batch_idx must have shape \[2\]"),
    # FP8
    ("FP8 cache without descales", False, fp8, ValueError, "an FP8 cache needs k_descale"),
    ("FP8 cache without v_descale", False, lambda a: dict(fp8(a), k_descale=torch.ones(B, HKV)), ValueError,
     "an FP8 cache needs v_descale"),
    ("descale for a fp16 cache", False, dict(k_descale=torch.ones(B, HKV)), ValueError,
     "k_descale is only for an FP8"),
    ("v_descale for a fp16 cache", False, dict(v_descale=torch.ones(B, HKV)), ValueError,
     "v_descale is only for an FP8"),
    ("descale fp16", False, lambda a: dict(fp8(a), k_descale=torch.ones(B, HKV).half(), v_descale=torch.ones(B, HKV)),
     TypeError, "k_descale must be a float32"),
    ("descale shape", False, lambda a: dict(fp8(a), k_descale=torch.ones(B, HQ), v_descale=torch.ones(B, HKV)),
     ValueError, r"k_descale must have shape \[2, 2\]"),
    ("descale transposed", False, lambda a: dict(fp8(a), k_descale=torch.ones(HKV, B).t(),
                                                 v_descale=torch.ones(B, HKV)),
     ValueError, "k_descale must be contiguous"),  # the kernel reads [B, Hkv] packed: a view gave wrong results
    ("float8_e5m2 cache", False, lambda a: dict(k_cache=a["k_cache"].to(torch.float8_e5m2),
                                                v_cache=a["v_cache"].to(torch.float8_e5m2), k=None, v=None),
     TypeError, "k_cache is torch.float8_e5m2: the only FP8 cache format is torch.float8_e4m3fn"),
    # an FP8 cache is read two e4m3 values at a time (kernels.triton.decode._widen_fp8_pairs)
    ("FP8 cache at an odd byte offset", False,
     lambda a: dict(fp8(a), k_cache=torch.zeros(B * S * HKV * D + 1, dtype=torch.uint8)[1:].view(torch.float8_e4m3fn)
                    .view(B, S, HKV, D), k_descale=torch.ones(B, HKV), v_descale=torch.ones(B, HKV)),
     ValueError, "k_cache, an FP8 cache, must start at an even byte address"),
    ("FP8 cache with an odd stride", False,
     lambda a: dict(fp8(a), v_cache=torch.zeros(B * S * (HKV * D + 1), dtype=torch.uint8).view(torch.float8_e4m3fn)
                    .as_strided((B, S, HKV, D), (S * (HKV * D + 1), HKV * D + 1, D, 1)),
                    k_descale=torch.ones(B, HKV), v_descale=torch.ones(B, HKV)),
     ValueError, r"v_cache, an FP8 cache, must have even strides, got \(1040, 65, 32, 1\)"),
    ("FP8 cache with fp32 q", False, lambda a: dict(fp8(a), q=a["q"].float(), k_descale=torch.ones(B, HKV),
                                                   v_descale=torch.ones(B, HKV)),
     TypeError, "FP8 .* cache needs q in float16 or bfloat16"),
    # packed q
    ("cu_seqlens_q without max_seqlen_q", False,
     lambda a: dict(q=t(3, HQ, D), k=t(3, HKV, D), v=t(3, HKV, D), cu_seqlens_q=i32(0, 1, 3)), ValueError,
     "cu_seqlens_q and max_seqlen_q go together"),
    ("max_seqlen_q without cu_seqlens_q", False, dict(max_seqlen_q=2), ValueError,
     "cu_seqlens_q and max_seqlen_q go together"),
    ("max_seqlen_q too small", False,
     dict(q=t(3, HQ, D), k=t(3, HKV, D), v=t(3, HKV, D), cu_seqlens_q=i32(0, 1, 3), max_seqlen_q=1), ValueError,
     "max_seqlen_q=1 is smaller than a real query length"),
    ("max_seqlen_q a float", False,
     dict(q=t(3, HQ, D), k=t(3, HKV, D), v=t(3, HKV, D), cu_seqlens_q=i32(0, 1, 3), max_seqlen_q=2.5), ValueError,
     "max_seqlen_q must be a whole number"),
    ("cu_seqlens_q decreasing", False,
     dict(q=t(3, HQ, D), k=t(3, HKV, D), v=t(3, HKV, D), cu_seqlens_q=i32(0, 2, 1), max_seqlen_q=2), ValueError,
     "cu_seqlens_q must start at 0 and be non-decreasing"),
    ("cu_seqlens_q past q", False,
     dict(q=t(3, HQ, D), k=t(3, HKV, D), v=t(3, HKV, D), cu_seqlens_q=i32(0, 2, 4), max_seqlen_q=2), ValueError,
     "cu_seqlens_q ends at 4 but q has only 3 tokens"),
    ("cu_seqlens_q int64", False,
     dict(q=t(3, HQ, D), k=t(3, HKV, D), v=t(3, HKV, D), cu_seqlens_q=torch.tensor([0, 1, 3]), max_seqlen_q=2),
     TypeError, "cu_seqlens_q must be int32"),
    ("packed k of q's 4-D shape", False,
     dict(q=t(3, HQ, D), cu_seqlens_q=i32(0, 1, 3), max_seqlen_q=2), ValueError, r"k must have shape \[3, 2, 32\]"),
    ("cu_seqlens_q a list", False,
     dict(q=t(3, HQ, D), k=t(3, HKV, D), v=t(3, HKV, D), cu_seqlens_q=[0, 1, 3], max_seqlen_q=2), TypeError,
     "cu_seqlens_q must be an int32"),
    ("cu_seqlens_q 2-D", False,
     dict(q=t(3, HQ, D), k=t(3, HKV, D), v=t(3, HKV, D), cu_seqlens_q=i32(0, 1, 3).view(1, 3), max_seqlen_q=2),
     ValueError, r"cu_seqlens_q must be an int32 tensor of shape \[B\+1\]"),
    ("packed q 4-D", False, dict(cu_seqlens_q=i32(0, 1, 3), max_seqlen_q=2), ValueError, "q must be 3-D"),
    # secure
    ("secure with k/v", False, dict(secure=True), ValueError, "secure=True does not append"),
    ("secure with packed q", False,
     dict(q=t(3, HQ, D), k=None, v=None, cu_seqlens_q=i32(0, 1, 3), max_seqlen_q=2, secure=True), ValueError,
     "secure=True does not take cu_seqlens_q"),
    ("secure, unused page entry out of range", True,
     dict(k=None, v=None, secure=True, k_cache=t(5, 16, HKV, D), v_cache=t(5, 16, HKV, D),
          page_table=i32(4, 1, 0, 9).view(B, 2)), ValueError,
     r"page_table\[1, 1\]=9"),  # every entry is read in secure mode, so every entry must be a page
    ("secure, page size not a verified one", True, dict(k=None, v=None, secure=True), ValueError,
     r"secure=True needs a page size in \(16, 32, 64, 128, 256\).*got 8"),
    ("secure, length past capacity", False, dict(k=None, v=None, secure=True, cache_seqlens=i32(3, 17)), ValueError,
     r"cache_seqlens must lie in \[0, 16\]"),
    # flags and numbers
    ("causal a str", False, dict(causal="yes"), TypeError, "causal must be a bool"),
    ("causal an int", False, dict(causal=1), TypeError, "causal must be a bool"),
    ("secure an int", False, dict(secure=0), TypeError, "secure must be a bool"),
    ("return_lse None", False, dict(return_lse=None), TypeError, "return_lse must be a bool"),
    ("validate an int", False, dict(validate=1), TypeError, "validate must be a bool"),
    ("num_splits negative", False, dict(num_splits=-1), ValueError, "num_splits must be >= 0"),
    ("num_splits too big", False, dict(num_splits=129), ValueError, r"num_splits must be in \[0, 128\]"),
    ("cu_seqlens_q 2-D", False,
     lambda a: dict(q=t(3, HQ, D), k=None, v=None, cu_seqlens_q=i32(0, 1, 3).view(1, 3), max_seqlen_q=2), ValueError,
     r"cu_seqlens_q must be an int32 tensor of shape \[B\+1\]"),
    ("cu_seqlens_q with one entry", False,
     lambda a: dict(q=t(3, HQ, D), k=None, v=None, cu_seqlens_q=i32(0), max_seqlen_q=2), ValueError,
     r"cu_seqlens_q must be an int32 tensor of shape \[B\+1\] \(B >= 1\)"),
    ("num_splits fractional", False, dict(num_splits=2.5), ValueError, "num_splits must be a whole number"),
    ("num_splits a str", False, dict(num_splits="2"), TypeError, "num_splits must be an int"),
    ("num_splits a bool", False, dict(num_splits=True), TypeError, "num_splits must be an int"),
    ("num_splits a tensor", False, dict(num_splits=torch.tensor(2)), TypeError, "num_splits must be an int"),
    ("scale negative", False, dict(scale=-0.1), ValueError, "scale must be a positive"),
    ("scale a str", False, dict(scale="0.1"), TypeError, "scale must be a real number"),
    ("backend unknown", False, dict(backend="cuda"), ValueError, "backend must be one of"),
    # out
    ("out overlapping k_cache", False, lambda a: dict(out=a["k_cache"].view(-1)[: B * SQ * HQ * D].view(B, SQ, HQ, D)),
     ValueError, "out must not overlap k_cache"),
    ("out overlapping v_cache", True, lambda a: dict(out=a["v_cache"].view(-1)[: B * SQ * HQ * D].view(B, SQ, HQ, D)),
     ValueError, "out must not overlap v_cache"),
    ("out overlapping k", False, lambda a: (lambda buf: dict(out=buf.view(B, SQ, HQ, D),
                                                             k=buf[: B * SQ * HKV * D].view(B, SQ, HKV, D)))(
        t(B * SQ * HQ * D)), ValueError, "out must not overlap k"),
    ("out overlapping q", False, lambda a: dict(out=a["q"]), ValueError, "out must not overlap q"),
    ("out shape", False, dict(out=t(B, SQ, HQ, 16)), ValueError, "out must match q's shape"),
    ("out dtype", False, dict(out=t(B, SQ, HQ, D, dtype=torch.float32)), ValueError, "out must match"),
    ("out strided", False, dict(out=t(B, HQ, SQ, D).transpose(1, 2)), ValueError, "out must be contiguous"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,paged,over,exc,match", CASES, ids=[c[0] for c in CASES])
def test_kvcache_bad_input(name, paged, over, exc, match, backend):
    a = base(paged)
    a.update(over(a) if callable(over) else over)
    a.setdefault("backend", backend)
    before = [bits(a[n]).clone() for n in ("k_cache", "v_cache") if isinstance(a[n], torch.Tensor)]
    with pytest.raises(exc, match=match):
        call(a)
    after = [bits(a[n]) for n in ("k_cache", "v_cache") if isinstance(a[n], torch.Tensor)]
    assert all(torch.equal(x, y) for x, y in zip(before, after)), "a refused call wrote into the cache"


def test_every_case_is_valid_once_mended():
    """The base calls themselves are accepted (so each case fails for its own reason), on both layouts."""
    for paged in (False, True):
        a = base(paged)
        out = call(a)
        assert out.shape == a["q"].shape and not torch.isnan(out).any()


@pytest.mark.interp
def test_kernel_route_refuses_what_the_interpreter_gets_wrong():
    a = base()
    a.update(q=a["q"].bfloat16(), k_cache=a["k_cache"].bfloat16(), v_cache=a["v_cache"].bfloat16(),
             k=a["k"].bfloat16(), v=a["v"].bfloat16(), backend="triton")
    before = a["k_cache"].clone()
    with pytest.raises(ValueError, match="bfloat16"):
        call(a)
    assert torch.equal(a["k_cache"], before)
    a = base()
    a.update(q=a["q"].requires_grad_(), backend="triton")
    with pytest.raises(RuntimeError, match="q requires grad"):
        call(a)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("paged", [False, True])
def test_packed_kv_pool_views_are_accepted(paged, backend):
    """k_cache = kv[:, 0] and v_cache = kv[:, 1] of one packed pool (vLLM's and FlashInfer's layout) share a span
    but no element: an append into them is allowed and gives the answer of two separate caches."""
    a = base(paged)
    pool = torch.stack([a["k_cache"], a["v_cache"]], dim=1 if paged else 2)  # [P, 2, page, H, D] / [B, S, 2, H, D]
    packed = dict(a, k_cache=pool[:, 0] if paged else pool[:, :, 0], v_cache=pool[:, 1] if paged else pool[:, :, 1],
                  backend=backend)
    want = call(dict(a, backend=backend))
    got = call(packed)
    assert torch.equal(got, want)
    assert torch.equal(packed["k_cache"], a["k_cache"]) and torch.equal(packed["v_cache"], a["v_cache"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_pages_shared_for_reading_are_accepted_with_an_append(backend):
    """A common prefix page in two page-table rows, where neither appends: the answer of two private copies."""
    a = base(paged=True)
    a.update(cache_seqlens=i32(8, 8), backend=backend)  # page 4 full in both rows; appends go to pages 1 and 2
    shared = dict(a, page_table=i32(4, 1, 4, 2).view(B, 2), k_cache=a["k_cache"].clone(), v_cache=a["v_cache"].clone())
    k6, v6 = (torch.cat([c, c[4:5]]) for c in (a["k_cache"], a["v_cache"]))  # page 5: a private copy of page 4
    private = dict(a, page_table=i32(4, 1, 5, 2).view(B, 2), k_cache=k6, v_cache=v6)
    assert torch.equal(call(shared), call(private))
    assert torch.equal(shared["k_cache"], private["k_cache"][:5]) and torch.equal(shared["v_cache"], private["v_cache"][:5])


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_tensor_for_both_caches_without_an_append_is_read(backend):
    """Nothing is written without k/v, so one tensor may serve as both caches (K = V)."""
    a = base()
    a.update(k=None, v=None, v_cache=a["k_cache"], backend=backend)
    want = call(dict(a, v_cache=a["k_cache"].clone()))
    assert torch.equal(call(a), want)


def test_share_elements_is_exact_for_nested_strides():
    from flashcore._checks import _share_elements
    kv = torch.zeros(3, 2, 4, 5, 6)
    assert not _share_elements(kv[:, 0], kv[:, 1])
    assert _share_elements(kv[:, 0], kv[:, 0])
    assert _share_elements(kv[:2, 0], kv[1:, 0])  # one page apart: pages 1 of each
    assert not _share_elements(kv[:2, 0], kv[1:, 1])
    assert not _share_elements(kv[:, 0, :2], kv[:, 0, 2:])  # token rows 0-1 and 2-3 of each page
    assert _share_elements(kv[:, 0, :3], kv[:, 0, 1:])
    flat = torch.zeros(100)
    assert _share_elements(flat[:50].view(5, 10), flat[45:95].view(5, 10))  # contiguous (nested): rows 4 and 0 meet
    assert not _share_elements(flat[:50].view(5, 10), flat[50:].view(5, 10))  # disjoint spans
    assert _share_elements(flat[:60].view(6, 10)[:, :5], flat[:60].view(6, 10)[:, 4:9])
    assert not _share_elements(flat[:60].view(6, 10)[:, :5], flat[:60].view(6, 10)[:, 5:])
    assert not _share_elements(flat.as_strided((2, 3), (10, 1)), flat.as_strided((2, 3), (10, 1), 4))  # spans meet
    assert _share_elements(flat.as_strided((2, 3), (10, 1)), flat.as_strided((2, 3), (10, 1), 8))  # [1, 0] = [0, 2]
    assert _share_elements(flat.as_strided((4, 4), (3, 1)), flat.as_strided((4, 4), (3, 1), 2))  # not nested


@pytest.mark.interp
@pytest.mark.parametrize("append", [False, True])
def test_switching_the_interpreter_off_reaches_a_warm_call(monkeypatch, append):
    a = dict(base(), backend="triton")
    if not append:
        a.update(k=None, v=None)
    call(a)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        call(a)
    if append:  # a step's run (on CPU tensors it takes the full path: steps bind their fast path on CUDA only)
        q, kc, vc = a.pop("q"), a.pop("k_cache"), a.pop("v_cache")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        step = flashcore.kvcache_step(q, kc, vc, **a)
        step.run(q, kc, vc, k=a["k"], v=a["v"])
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            step.run(q, kc, vc, k=a["k"], v=a["v"])


def test_triton_on_cpu_without_the_interpreter_is_explained(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        call(dict(base(), backend="triton"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_validate_false_still_checks_the_metadata(backend):
    """validate=False skips the host's reading of values, never the metadata checks."""
    a = dict(base(), backend=backend, validate=False)
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        call(dict(a, cache_seqlens=torch.tensor([3, 5])))
    with pytest.raises(ValueError, match="k and v go together"):
        call(dict(a, v=None))
    with pytest.raises(ValueError, match="secure=True does not append"):
        call(dict(a, secure=True))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("what", ["cache_seqlens", "cache_leftpad"])
def test_secure_range_errors_do_not_tell_the_secret_values(what, backend):
    """secure=True: cache_seqlens and cache_leftpad are secret; a range error says that some value is out of
    range (one bit), never which sequence or what value."""
    a = dict(base(), k=None, v=None, secure=True, backend=backend, cache_seqlens=i32(3, 13))
    if what == "cache_seqlens":
        a["cache_seqlens"] = i32(3, 29)
    else:
        a["cache_leftpad"] = i32(0, 14)
    with pytest.raises(ValueError, match=what) as e:
        call(a)
    assert not any(str(x) in str(e.value) for x in (29, 13, 14, "[1]")), str(e.value)



@pytest.mark.interp
def test_num_splits_at_its_maximum_is_accepted():
    """``MAX_SPLITS`` itself is a valid split count (mutation survivor 505 of _checks.py refused it)."""
    from flashcore._checks import MAX_SPLITS

    q = torch.randn(1, 1, 2, 16)
    kc, vc = torch.randn(1, 64, 1, 16), torch.randn(1, 64, 1, 16)
    lens = torch.tensor([64], dtype=torch.int32)
    for backend in ("reference", "triton"):
        out = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=MAX_SPLITS, backend=backend)
        ref = flashcore.reference.attention_with_kvcache(q, kc.clone(), vc.clone(), cache_seqlens=lens)
        assert torch.allclose(out.double(), ref, atol=1e-5)


OVERLAPS = [c for c in CASES if "overlapping" in c[0]]


def _separate(x):
    """A tensor with x's facts (shape, strides, dtype, 16-byte alignment) in memory of its own."""
    y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
    assert y.data_ptr() % 16 == x.data_ptr() % 16
    return y.copy_(x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,paged,over,exc,match", OVERLAPS, ids=[c[0] for c in OVERLAPS])
def test_kvcache_overlap_is_refused_after_a_call_with_the_same_facts(name, paged, over, exc, match, backend):
    """The address checks hold on a repeat call (a plan-cache hit, whose key holds alignments, not addresses) and on
    a KVCacheStep's runs: a warm call with the same facts on separate buffers first, then the overlapping one
    raises and writes nothing (before session 46 a warm call wrote out into the cache it read)."""
    a = base(paged)
    bad = over(a)
    a["backend"] = backend
    call(dict(a, **{n: _separate(x) for n, x in bad.items()}))
    step_args = dict(a, **{n: _separate(x) for n, x in bad.items()})
    q0, kc0, vc0 = step_args.pop("q"), step_args.pop("k_cache"), step_args.pop("v_cache")
    step = flashcore.kvcache_step(q0, kc0, vc0, **step_args)
    before = [bits(a[n]).clone() for n in ("k_cache", "v_cache")]
    with pytest.raises(exc, match=match):
        call(dict(a, **bad))
    run = {n: x for n, x in bad.items() if n in ("k", "v", "out")}
    with pytest.raises(exc, match=match):
        step.run(bad.get("q", a["q"]), a["k_cache"], a["v_cache"], **{**{n: a[n] for n in ("k", "v")}, **run})
    assert all(torch.equal(x, bits(a[n])) for x, n in zip(before, ("k_cache", "v_cache")))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["k_descale", "v_descale"])
def test_fp8_descale_requiring_grad_is_refused(backend, which):
    """attention_with_kvcache has no backward: a descale that requires grad raises as q does, never a result whose
    gradient is silently lost (review of session 46: the kernel route returned an output without a grad_fn)."""
    a = dict(base(), **fp8(base()), backend=backend, k_descale=torch.rand(B, HKV) + 0.5,
             v_descale=torch.rand(B, HKV) + 0.5)
    a[which] = a[which].requires_grad_()
    with pytest.raises(RuntimeError, match=f"{which} requires grad"):
        call(a)
    with torch.no_grad():
        assert call(a).shape == a["q"].shape



def _element_offsets(t):
    """Every element's offset in its storage (brute force)."""
    grids = torch.meshgrid(*[torch.arange(n) for n in t.shape], indexing="ij")
    return set((sum(g * s for g, s in zip(grids, t.stride())) + t.storage_offset()).flatten().tolist())


def _nested(shape, strides):
    dims = sorted((s, n) for s, n in zip(strides, shape) if n > 1)
    reach = 0
    for s, n in dims:
        if s <= reach:
            return False
        reach += s * (n - 1)
    return True


def test_share_elements_never_misses_a_shared_element():
    """Against a brute-force count on random strided views: never False where an element is shared, and exact where
    the two views have one shape and strides that nest."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from flashcore._checks import _share_elements

    @settings(max_examples=400, deadline=None)
    @given(data=st.data())
    def check(data):
        shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
        strides = [data.draw(st.integers(0, 24)) for _ in shape]
        same = data.draw(st.booleans())
        shape_b = shape if same else [data.draw(st.integers(1, 4)) for _ in shape]
        strides_b = strides if same else [data.draw(st.integers(0, 24)) for _ in shape]
        off_a, off_b = data.draw(st.integers(0, 40)), data.draw(st.integers(0, 40))
        pool = torch.zeros(400)
        a, b = pool.as_strided(shape, strides, off_a), pool.as_strided(shape_b, strides_b, off_b)
        shared = bool(_element_offsets(a) & _element_offsets(b))
        got = _share_elements(a, b)
        assert got or not shared, (shape, strides, off_a, shape_b, strides_b, off_b)
        if same and _nested(shape, strides):
            assert got == shared, (shape, strides, off_a, off_b)

    check()
