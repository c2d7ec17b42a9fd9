"""KV-cache attention on the GPU: bf16 and FP8 caches against the float64 reference (FP8: of the dequantised
cache), paged and contiguous, secure, CUDA-graph replay with changing lengths and page tables, and dense
short-query calls routed to the decode kernel."""
import pytest
import torch

import flashcore
from flashcore import reference as R
from flashcore._checks import SECURE_PAGE_SIZES
from conftest import capture_cuda_graph, rel_err

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _case(B, Hq, Hkv, D, cap, page, Sq=1, fp8=False, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(B, Sq, Hq, D, device=DEV, dtype=torch.bfloat16, generator=g)
    cdt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    if page:
        width = -(-cap // page)
        pages = B * width + 3
        kc = torch.randn(pages, page, Hkv, D, device=DEV, generator=g).to(cdt)
        vc = torch.randn(pages, page, Hkv, D, device=DEV, generator=g).to(cdt)
        table = torch.randperm(pages, device=DEV, generator=g)[:B * width].view(B, width).int().contiguous()
    else:
        kc = torch.randn(B, cap, Hkv, D, device=DEV, generator=g).to(cdt)
        vc = torch.randn(B, cap, Hkv, D, device=DEV, generator=g).to(cdt)
        table = None
    lens = torch.randint(0, cap + 1, (B,), device=DEV, generator=g).int()
    lens[0], lens[-1] = 0, cap
    descale = {}
    if fp8:
        descale = dict(k_descale=torch.rand(B, Hkv, device=DEV, generator=g) + 0.5,
                       v_descale=torch.rand(B, Hkv, device=DEV, generator=g) + 0.5)
    return q, kc, vc, table, lens, descale


@pytest.mark.parametrize("page", [0, 1, 16, 64, 128])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("Sq,splits,secure", [(1, 0, False), (4, 3, False), (1, 0, True)])
def test_kvcache_bf16_and_fp8_match_the_reference(page, fp8, Sq, splits, secure):
    q, kc, vc, table, lens, descale = _case(3, 32, 8, 128, 1500, page, Sq=Sq, fp8=fp8)
    if secure and page and page not in SECURE_PAGE_SIZES:
        with pytest.raises(ValueError, match="secure=True needs a page size"):
            flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, secure=True, **descale)
        return
    out = torch.full_like(q, float("nan"))
    o, lse = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, num_splits=splits,
                                              secure=secure, return_lse=True, out=out, **descale)
    ro, rl = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, return_lse=True, **descale)
    assert o is out and not torch.isnan(o).any()
    assert rel_err(o, ro) < 1e-2
    assert torch.equal(torch.isinf(lse), torch.isinf(rl))
    fin = torch.isfinite(rl)
    assert rel_err(lse[fin], rl[fin]) < 1e-4


@pytest.mark.parametrize("page", [16, 32, 64, 128])
@pytest.mark.parametrize("fp8", [False, True])
def test_secure_paged_decode_at_one_split_matches_the_reference_and_ignores_stale_slots(page, fp8):
    """Secure paged decode with enough sequences for one split (FP8: since v46 64-key tiles, gathering pages 16 and
    32; bf16: since v47 32-key tiles below page 64, V's rows cleared by the select from loaded tensors), against the
    float64 reference (FP8: dequantised), output poisoned first; NaN/Inf and zeros in the slots past each length
    change no output bit."""
    from flashcore.plan.decode import DecodePlan

    q, kc, vc, table, lens, descale = _case(24, 32, 8, 128, 1100, page, fp8=fp8, seed=29)
    seen = []
    real = DecodePlan.__call__

    def spy(self, *a, **k):
        seen.append(self)
        return real(self, *a, **k)

    outs = []
    for fill in (None, [float("nan"), float("inf")], [0.0]):
        k2, v2 = kc.clone(), vc.clone()
        if fill is not None:
            _stale(k2, table, lens, page, fill)
            _stale(v2, table, lens, page, fill)
        out = torch.full_like(q, float("nan"))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(DecodePlan, "__call__", spy)
            o = flashcore.attention_with_kvcache(q, k2, v2, cache_seqlens=lens, page_table=table, secure=True,
                                                 out=out, **descale)
        assert seen[-1].config.num_splits == 1 and seen[-1].prefill is None
        outs.append(o.clone())
    from flashcore.launch.triton_decode import seen_by_load

    # FP8: 64-key tiles (gathering their pages below 64), V's select on scalars; bf16 (v47): V's select from loaded
    # tensors, 32-key tiles below page 64 (gathering page 16's pages), 64 at page 64, 128 from page 128 (v48: the
    # hoisted loop, a tile per page)
    from flashcore.launch.triton_decode import hoisted

    # v52: FP8 below page 64 on 128-key tiles gathering their pages, V by K's offsets, V's select from loaded tensors
    from flashcore.launch.triton_decode import gather_kv_offsets

    plan = seen[-1]
    assert plan.config.block_n == (128 if fp8 and page < 64 else 64 if fp8 or page == 64 else 128 if page >= 128
                                   else 32), plan.config
    assert seen_by_load(plan.shape, plan.config) == (not fp8 or page < 64), plan.config
    assert gather_kv_offsets(plan.shape, plan.config) == (fp8 and page < 64), plan.config
    assert hoisted(plan.shape, plan.config) == (not fp8 and page >= 32), plan.config
    ro = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, **descale)
    assert not torch.isnan(outs[0]).any() and rel_err(outs[0], ro) < 1e-2
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


@pytest.mark.parametrize("layout", ["contiguous", "contiguous1000", "paged16", "paged128", "leftpad", "rows", "fp8",
                                    "fp8_1000"])
def test_secure_v_select_from_loaded_tensors_gives_the_scalar_select_bit_for_bit(layout):
    """The two selects that keep V's stale rows out of secure decode (``DecodeConfig.seen_by_load``, docs/perf-notes.md
    v47), each with and without v48's hoisted addressing and V's AND (``DecodeConfig.hoisted``; a capacity of 1000:
    not whole tiles, masked loads), compiled for this GPU, at the one-split configuration the planner gives the new
    form: every output and lse bit equal, with NaN/Inf in every slot past each length (and before each left pad),
    against the reference too."""
    from flashcore import _checks as C
    from flashcore.launch.triton_decode import seen_by_load
    from flashcore.plan.decode import plan_kvcache

    page = {"paged16": 16, "paged128": 128}.get(layout, 0)
    fp8 = layout.startswith("fp8")
    cap = 1000 if layout.endswith("1000") else 1024
    q, kc, vc, table, lens, descale = _case(24, 32, 8, 128, cap, page, fp8=fp8, seed=47)
    lens[1] = 1  # a single visible key beside the full and empty sequences
    for cache in (kc, vc):
        _stale(cache.view(torch.uint8) if fp8 else cache, table, lens, page,
               [0x7F] if fp8 else [float("nan"), float("inf")])
    opt = dict(page_table=table, cache_batch_idx=None, cache_leftpad=None)
    if layout == "leftpad":
        opt["cache_leftpad"] = (lens // 3).int()
        for b in range(q.shape[0]):  # the slots before each left pad: NaN and Inf as well
            kc[b, :int(opt["cache_leftpad"][b])] = float("nan")
            vc[b, :int(opt["cache_leftpad"][b])] = float("inf")
    if layout == "rows":  # sequence b in cache row B - 1 - b
        kc, vc = kc.flip(0).contiguous(), vc.flip(0).contiguous()
        opt["cache_batch_idx"] = torch.arange(q.shape[0] - 1, -1, -1, device=DEV, dtype=torch.int32)
    a = C.check_kvcache(q, kc, vc, cache_seqlens=lens, k=None, v=None, **opt, cu_seqlens_q=None, max_seqlen_q=None,
                        causal=True, scale=None, num_splits=0, return_lse=True, out=None, secure=True,
                        backend="auto", **(descale or dict(k_descale=None, v_descale=None)))
    plan = plan_kvcache(a, q, kc, vc, None, None, table, opt["cache_batch_idx"], opt["cache_leftpad"],
                        torch.empty_like(q))
    if not fp8:
        assert seen_by_load(plan.shape, plan.config) and plan.config.num_splits == 1, plan.config
    tensors = dict({n: x for n, x in opt.items() if x is not None}, cache_seqlens=lens, **descale)
    res = []
    for flag, hoisted in ((True, False), (False, False), (True, True), (False, True)):
        from dataclasses import replace

        p = plan_kvcache(a, q, kc, vc, None, None, table, opt["cache_batch_idx"], opt["cache_leftpad"],
                         torch.empty_like(q), config=replace(plan.config, seen_by_load=flag, hoisted=hoisted))
        assert p.split.constexprs["SEEN_BY_LOAD"] is flag
        one_page = page == 0 or page % plan.config.block_n == 0
        assert p.split.constexprs["HOISTED"] is (hoisted and one_page)
        assert p.split.constexprs["WHOLE_TILES"] is (hoisted and one_page and cap % plan.config.block_n == 0)
        res.append(p(q, kc, vc, tensors, torch.full_like(q, float("nan"))))
        torch.cuda.synchronize()
    (o1, l1), (o0, l0) = res[:2]
    for o, lse in res[1:]:
        assert torch.equal(o1.view(torch.int16), o.view(torch.int16)) and torch.equal(l1, lse)
    ro = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table,
                                  cache_batch_idx=opt["cache_batch_idx"], cache_leftpad=opt["cache_leftpad"], **descale)
    assert not torch.isnan(o1).any() and rel_err(o1, ro) < 1e-2


@pytest.mark.parametrize("layout", ["contiguous", "contiguous1000", "paged128", "fp8", "fp8_1000", "fp8_paged256"])
def test_secure_split_forms_give_the_same_bits(layout):
    """Secure decode with splits (B1-like) at the planner's tiles and split count since v49 (the hoisted loop, V's
    select from loaded tensors: a 16-bit cache reading each key's position every tile, ``DecodeConfig.seen_per_key``,
    FP8 the tile's start), against the other read, the select on scalars, and the loop before v48 (the form before
    v49; ``FLASHCORE_SECURE_HOISTED=off``), compiled for this GPU: every output and lse bit equal, NaN/Inf in every
    slot past each length, and against the float64 reference."""
    from dataclasses import replace

    from flashcore import _checks as C
    from flashcore.launch.triton_decode import hoisted, seen_by_load, seen_per_key
    from flashcore.plan.decode import plan_kvcache

    page = {"paged128": 128, "fp8_paged256": 256}.get(layout, 0)
    fp8 = layout.startswith("fp8")
    cap = 1000 if layout.endswith("1000") else 4096
    q, kc, vc, table, lens, descale = _case(2, 32, 8, 128, cap, page, fp8=fp8, seed=53)
    lens[0] = 1  # a single visible key beside a full sequence
    for cache in (kc, vc):
        _stale(cache.view(torch.uint8) if fp8 else cache, table, lens, page,
               [0x7F] if fp8 else [float("nan"), float("inf")])
    a = C.check_kvcache(q, kc, vc, cache_seqlens=lens, k=None, v=None, page_table=table, cache_batch_idx=None,
                        cache_leftpad=None, cu_seqlens_q=None, max_seqlen_q=None, causal=True, scale=None,
                        num_splits=0, return_lse=True, out=None, secure=True, backend="auto",
                        **(descale or dict(k_descale=None, v_descale=None)))
    plan = plan_kvcache(a, q, kc, vc, None, None, table, None, None, torch.empty_like(q))
    cfg = plan.config
    assert cfg.num_splits > 1 and (cfg.block_n, cfg.num_warps, cfg.num_stages) == (128, 4, 3), cfg
    assert hoisted(plan.shape, cfg) and seen_by_load(plan.shape, cfg), cfg
    assert seen_per_key(plan.shape, cfg) is not fp8, cfg
    tensors = dict(cache_seqlens=lens, **descale, **({"page_table": table} if page else {}))
    res = []
    for form in (dict(seen_per_key=True), dict(seen_per_key=False), dict(seen_by_load=False),
                 dict(hoisted=False, seen_by_load=False)):
        p = plan_kvcache(a, q, kc, vc, None, None, table, None, None, torch.empty_like(q), config=replace(cfg, **form))
        ce = p.split.constexprs
        assert (ce["HOISTED"], ce["SEEN_BY_LOAD"], ce["SEEN_PER_KEY"]) == (
            form.get("hoisted", True), form.get("seen_by_load", True), form.get("seen_per_key", False)), form
        assert ce["WHOLE_TILES"] is (ce["HOISTED"] and cap % cfg.block_n == 0)
        res.append(p(q, kc, vc, tensors, torch.full_like(q, float("nan"))))
        torch.cuda.synchronize()
    o0, l0 = res[0]
    for (o, lse), form in zip(res[1:], ("the tile's start", "scalars", "before v48")):
        assert torch.equal(o0.view(torch.int16), o.view(torch.int16)) and torch.equal(l0, lse), form
    ro = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, **descale)
    assert not torch.isnan(o0).any() and rel_err(o0, ro) < 1e-2


@pytest.mark.parametrize("page,cap,Sq", [(16, 4096, 1), (32, 4096, 1), (16, 1000, 1), (16, 4096, 4)])
def test_secure_16bit_gathers_with_splits_by_k_offsets_give_the_same_bits(page, cap, Sq):
    """Secure 16-bit decode whose tiles span pages (pages below the 64-key tile), with splits: since v57 V is addressed
    by K's per-key offsets, the copies are unmasked in whole tiles and V's stale rows are zeroed by an AND of loaded
    positions (``launch.triton_decode.gather_kv_offsets``), as the FP8 gathers since v52. Against v50's form at the
    same tiles (``DecodeConfig.gather_kv_offsets=False``: per-key pointers for K and V, masked copies, V's select on
    scalars), compiled for this GPU: every output and lse bit equal, NaN/Inf in every slot past each length, and
    against the float64 reference. A capacity of 1000 (not whole tiles) keeps masked copies; four query tokens (a
    causal bound per row) as well."""
    from dataclasses import replace

    from flashcore import _checks as C
    from flashcore.plan.decode import plan_kvcache

    q, kc, vc, table, lens, descale = _case(2, 32, 8, 128, cap, page, Sq=Sq, fp8=False, seed=59)
    lens[0] = 1  # a single visible key beside a full sequence
    for cache in (kc, vc):
        _stale(cache, table, lens, page, [float("nan"), float("inf")])
    a = C.check_kvcache(q, kc, vc, cache_seqlens=lens, k=None, v=None, page_table=table, cache_batch_idx=None,
                        cache_leftpad=None, cu_seqlens_q=None, max_seqlen_q=None, causal=True, scale=None,
                        num_splits=0, return_lse=True, out=None, secure=True, backend="auto", k_descale=None,
                        v_descale=None)
    plan = plan_kvcache(a, q, kc, vc, None, None, table, None, None, torch.empty_like(q))
    cfg = plan.config
    ce = plan.split.constexprs
    assert cfg.num_splits > 1 and cfg.block_n == 64, cfg
    assert (ce["HOISTED"], ce["GATHER_KV_OFFSETS"], ce["SEEN_BY_LOAD"]) == (False, True, True), ce
    assert ce["WHOLE_TILES"] is (plan.shape.capacity % cfg.block_n == 0)
    before = plan_kvcache(a, q, kc, vc, None, None, table, None, None, torch.empty_like(q),
                          config=replace(cfg, gather_kv_offsets=False))
    assert (before.split.constexprs["GATHER_KV_OFFSETS"], before.split.constexprs["SEEN_BY_LOAD"],
            before.split.constexprs["WHOLE_TILES"]) == (False, False, False)
    tensors = dict(cache_seqlens=lens, page_table=table)
    res = []
    for p in (plan, before):
        res.append(p(q, kc, vc, tensors, torch.full_like(q, float("nan"))))
        torch.cuda.synchronize()
    (o0, l0), (o1, l1) = res
    assert torch.equal(o0.view(torch.int16), o1.view(torch.int16)) and torch.equal(l0, l1)
    ro = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table)
    assert not torch.isnan(o0).any() and rel_err(o0, ro) < 1e-2


@pytest.mark.parametrize("D,heads", [(64, (32, 32)), (256, (16, 2)), (96, (8, 8))])
def test_kvcache_head_dims(D, heads):
    q, kc, vc, table, lens, _ = _case(2, heads[0], heads[1], D, 700, 16, Sq=2)
    o = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table)
    assert rel_err(o, R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table)) < 1e-2


def test_append_then_attend_on_gpu():
    q, kc, vc, table, lens, _ = _case(3, 16, 4, 128, 600, 16, Sq=3)
    lens.clamp_(max=600 - 3)
    k = torch.randn(3, 3, 4, 128, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc2, vc2 = kc.clone(), vc.clone()
    o = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, k=k, v=v, page_table=table)
    ro = R.attention_with_kvcache(q, kc2, vc2, cache_seqlens=lens, k=k, v=v, page_table=table)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    assert rel_err(o, ro) < 1e-2


@pytest.mark.parametrize("secure,B", [(False, 4), (True, 4), (True, 24)])
def test_cuda_graph_replay_with_new_lengths_and_page_tables(secure, B):
    """B 24 in secure mode: one split, V's select from loaded tensors (the key-position table made by the warm-up
    call, read by the graph)."""
    cap = 4096
    q, kc, vc, table, lens, _ = _case(B, 32, 8, 128, cap, 16)
    out = torch.empty_like(q)
    lens_buf, table_buf = lens.clone(), table.clone()

    def call():
        return flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens_buf, page_table=table_buf, out=out,
                                                secure=secure)

    call()
    _replay_with_new_lengths_and_tables(call, q, kc, vc, out, lens_buf, table_buf,
                                        lambda: table[torch.randperm(B, device=DEV)])


@pytest.mark.parametrize("cap,page,fp8", [(4096, 0, False), (1024, 0, False), (4096, 16, True)])
def test_round_robin_split_forms_match_the_reference_and_replay_in_a_graph(cap, page, fp8):
    """v59: where the planner deals a B1 cache's key tiles to the splits round-robin (v58's short contiguous form,
    the FP8 page gather with few tiles a split), the output against the float64 reference (FP8: dequantised) with
    lengths 0, 1, shorter than one tile per split, cut inside a tile and full, poisoned first; then a graph captured
    once and replayed with new lengths and tables. The 16-bit page-16 gather keeps contiguous ranges and prefetches
    its table row (its output against the reference too)."""
    from flashcore.plan.decode import DecodePlan

    plans = []
    real = DecodePlan.__call__

    def spy(self, *a, **k):
        plans.append(self)
        return real(self, *a, **k)

    q, kc, vc, table, _, descale = _case(1, 32, 8, 128, cap, page, fp8=fp8, seed=59)
    DecodePlan.__call__ = spy
    try:
        for L in (0, 1, 100, cap - 37, cap):
            lens = torch.tensor([L], device=DEV, dtype=torch.int32)
            out = torch.full_like(q, float("nan"))
            o = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, out=out, **descale)
            ro = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, **descale)
            assert not torch.isnan(o).any() and (rel_err(o, ro) < 1e-2 if L else bool((o == 0).all())), L
        ce = plans[-1].split.constexprs
        assert ce["ROUND_ROBIN"] and plans[-1].config.num_splits > 1, (plans[-1].config, ce)
        q16, kc16, vc16, t16, _, _ = _case(1, 32, 8, 128, 4096, 16, seed=60)
        for L16 in (4096, 1000):
            l16 = torch.tensor([L16], device=DEV).int()
            o16 = flashcore.attention_with_kvcache(q16, kc16, vc16, cache_seqlens=l16, page_table=t16)
            r16 = R.attention_with_kvcache(q16, kc16, vc16, cache_seqlens=l16, page_table=t16)
            assert not torch.isnan(o16).any() and rel_err(o16, r16) < 1e-2, L16
        ce16 = plans[-1].split.constexprs  # (v59: the 16-bit gather prefetches its table row instead)
        assert plans[-1].config.num_splits > 1 and not ce16["ROUND_ROBIN"] and ce16["WARM_TABLE"]
    finally:
        DecodePlan.__call__ = real
    lens_buf = torch.tensor([cap], device=DEV, dtype=torch.int32)
    table_buf = table.clone() if table is not None else None
    out = torch.empty_like(q)

    def call():
        return flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens_buf, page_table=table_buf, out=out,
                                                **descale)

    call()
    graph, _ = capture_cuda_graph(call)
    for trial in range(3):
        new_lens = torch.randint(0, cap + 1, (1,), device=DEV).int()
        lens_buf.copy_(new_lens)
        if table is not None:
            table_buf.copy_(table[:, torch.randperm(table.shape[1], device=DEV)])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = R.attention_with_kvcache(q, kc, vc, cache_seqlens=new_lens, page_table=table_buf, **descale)
        assert not torch.isnan(out).any() and (rel_err(out, ref) < 1e-2 if int(new_lens) else True), trial


@pytest.mark.parametrize("secure", [False, True])
def test_compiled_cuda_graphs_keep_no_buffer_and_match_eager_calls(secure):
    """torch.compile with CUDA graphs (mode "reduce-overhead", cudagraph trees: what transformers' static-cache
    generate compiles) of a split-KV decode call. The trees run the op once eagerly in the graph's private memory
    pool, then record it, then replay it, and check after the eager run that nothing allocated there outlives it but
    the outputs: the workspace an eager call keeps for the next one failed that check (perf-notes v60). Every call,
    with new lengths each time, equals an eager call bit for bit."""
    from torch._dynamo.utils import counters

    q, kc, vc, _, lens, _ = _case(1, 32, 8, 128, 2048, 0, seed=11)
    # the caches as a static cache's are: fixed addresses, so the trees may record an op that may write them
    torch._dynamo.mark_static_address(kc)
    torch._dynamo.mark_static_address(vc)

    def f(q, kc, vc, lens):
        return flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, secure=secure, validate=False)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for n in (2048, 1000, 7, 0, 2048, 1500):
        lens = torch.full((1,), n, dtype=torch.int32, device=DEV)
        got = compiled(q, kc, vc, lens).clone()  # a replay's output is overwritten by the next replay
        want = f(q, kc, vc, lens)
        assert torch.equal(got, want), n
    assert not counters["inductor"]["cudagraph_skips"], "the compiled call ran without CUDA graphs"


def test_a_captured_graph_keeps_reading_its_key_position_table_after_a_longer_cache_grows_it():
    """Secure decode at one split (V's select from loaded tensors, docs/perf-notes.md v47) reads the device's public
    key-position table by address. A graph captured with that table replays correctly after a call with a longer
    cache replaced it with a longer one, and after the memory of a freed table would have been handed out again and
    overwritten (the first version freed it: a review reproduced zeroed outputs this way)."""
    from flashcore.plan import decode as PD

    B, cap = 24, 4096
    q, kc, vc, table, lens, _ = _case(B, 32, 8, 128, cap, 16, seed=61)
    ks, vs = kc.clone(), vc.clone()  # stale slots NaN and Inf in the copies the calls read
    _stale(ks, table, lens, 16, [float("nan")])
    _stale(vs, table, lens, 16, [float("inf")])
    out, lens_buf = torch.empty_like(q), lens.clone()

    def call():
        return flashcore.attention_with_kvcache(q, ks, vs, cache_seqlens=lens_buf, page_table=table, out=out,
                                                secure=True)

    PD._KEY_POSITIONS.pop(torch.device(DEV, torch.cuda.current_device()), None)  # the warm-up makes a short table
    call()
    torch.cuda.synchronize()
    first = PD._KEY_POSITIONS[q.device]
    graph, _ = capture_cuda_graph(call)
    q2, kc2, vc2, table2, lens2, _ = _case(B, 32, 8, 128, 8 * cap, 16, seed=62)
    flashcore.attention_with_kvcache(q2, kc2, vc2, cache_seqlens=lens2, page_table=table2, secure=True)
    torch.cuda.synchronize()
    assert PD._KEY_POSITIONS[q.device].numel() > first.numel()  # the premise: the table grew
    del first
    # blocks the size of the first table, holding positions no key has: what a freed table's memory would become
    junk = [torch.full((4096,), 1 << 29, dtype=torch.int32, device=DEV) for _ in range(64)]
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens_buf, page_table=table)
    assert not torch.isnan(out).any() and rel_err(out, ref) < 1e-2
    del junk


def _replay_with_new_lengths_and_tables(call, q, kc, vc, out, lens_buf, table_buf, new_table):
    """Capture ``call`` (it reads ``lens_buf``/``table_buf`` and writes ``out``) once, then replay it three times with
    new random lengths up to the capacity and a new table (``new_table()``), the output poisoned before each replay,
    against the float64 reference."""
    graph, _ = capture_cuda_graph(call)
    cap = table_buf.shape[1] * kc.shape[1]
    for trial in range(3):
        new_lens = torch.randint(0, cap + 1, (q.shape[0],), device=DEV).int()
        table = new_table()
        lens_buf.copy_(new_lens)
        table_buf.copy_(table)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = R.attention_with_kvcache(q, kc, vc, cache_seqlens=new_lens, page_table=table)
        assert rel_err(out, ref) < 1e-2, trial


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("Sq,causal", [(1, False), (4, True)])
def test_dense_short_query_runs_on_the_decode_kernel(layout, Sq, causal):
    B, Hq, Hkv, D, Sk = 2, 32, 8, 128, 8192
    shape_q, shape_k = ((B, Hq, Sq, D), (B, Hkv, Sk, D)) if layout == "bhsd" else ((B, Sq, Hq, D), (B, Sk, Hkv, D))
    q = torch.randn(shape_q, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(shape_k, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    assert flashcore.plan_attention(q, k, v, causal=causal, layout=layout).selection.kernel == "triton_decode"
    o, lse = flashcore.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    ro, rl = R.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    assert rel_err(o, ro) < 1e-2 and rel_err(lse, rl) < 1e-4


def test_int_cache_seqlens_share_one_length_tensor_per_value_and_stream_only_where_safe():
    from flashcore import ops

    q, kc, vc, _, _, _ = _case(2, 8, 2, 64, 256, 0, seed=5)
    ref = R.attention_with_kvcache(q.double(), kc.double(), vc.double(), cache_seqlens=200)
    a = ops.lengths_tensor(200, 2, q.device, secure=False)
    assert a is ops.lengths_tensor(200, 2, q.device, secure=False)  # the layers of one decode step share it
    assert a.tolist() == [200, 200]
    assert ops.lengths_tensor(201, 2, q.device, secure=False) is not a
    assert ops.lengths_tensor(200, 2, q.device, secure=True) is not a  # host time must not follow a secret
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert ops.lengths_tensor(200, 2, q.device, secure=False) is not a  # the fill is ordered on its stream
    # a length tensor filled during capture has its value only at replay: never kept for eager calls, not even
    # for later eager calls on the capturing stream itself
    out = torch.empty_like(q)
    flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=90, out=out)  # plan and compile outside capture
    cap = torch.cuda.Stream()
    cap.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(cap):
        with torch.cuda.graph(graph, stream=cap):
            flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=137, out=out)
        eager = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=137)  # before any replay
        torch.cuda.synchronize()
    ref137 = R.attention_with_kvcache(q.double(), kc.double(), vc.double(), cache_seqlens=137)
    assert rel_err(eager, ref137) < 1e-2
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, ref137) < 1e-2
    assert rel_err(flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=200), ref) < 1e-2


def test_threads_on_one_stream_never_share_a_split_workspace():
    # eager calls reuse a workspace per (size, stream, thread): two threads interleaving split and combine launches
    # on the default stream would otherwise overwrite each other's partial results between the two steps
    import threading

    cases = [_case(1, 32, 8, 128, 4096, 0, seed=40 + i) for i in range(2)]
    want = [flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=16)
            for q, kc, vc, _, lens, _ in cases]
    bad = []

    def worker(i):
        q, kc, vc, _, lens, _ = cases[i]
        for _ in range(200):
            out = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=16)
            if not torch.equal(out, want[i]):
                bad.append(i)
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not bad, f"threads {sorted(set(bad))} got another call's partial results"


@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("page,splits", [(0, 0), (0, 5), (16, 0)])
def test_fp8_nan_reaches_the_output_where_a_key_is_seen_and_only_there(page, splits, secure):
    """The hardware convert keeps e4m3fn's NaN a NaN: stale slots behind the lengths (NaN in K and V) leave the
    output finite, a visible NaN in V makes its column NaN, as in the float64 reference (secure mode: NaNs zeroed by
    value and counted by a second product, docs/perf-notes.md v24.4)."""
    q, kc, vc, table, lens, descale = _case(3, 32, 8, 128, 1024, page, fp8=True, seed=7)
    lens = torch.tensor([300, 1024, 777], device=DEV, dtype=torch.int32)
    nan = 0x7F

    def poke(which, b, t, h, d):
        if table is None:
            (kc if which == "k" else vc).view(torch.uint8)[b, t, h, d] = nan
        else:
            (kc if which == "k" else vc).view(torch.uint8)[table[b, t // page].long(), t % page, h, d] = nan

    poke("k", 0, 700, 3, 10)  # stale
    poke("v", 0, 800, 3, 11)
    poke("v", 2, 900, 0, 64)
    poke("v", 1, 5, 2, 33)  # visible: sequence 1, K/V head 2 (query heads 8-11), column 33
    out = torch.full_like(q, float("nan"))
    o = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, num_splits=splits,
                                         secure=secure, out=out, **descale)
    ro = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, **descale)
    assert torch.isnan(ro[1, 0, 8:12, 33]).all() and int(torch.isnan(ro).sum()) == 4
    assert torch.equal(torch.isnan(o), torch.isnan(ro))
    fin = ~torch.isnan(ro)
    assert rel_err(o[fin], ro[fin]) < 1e-2


# ---- chunked prefill on the Gluon forward kernel (plan.prefill) ----------------------------------------------------

def _prefill_plan(q, kc, vc, **kw):
    """The plan the call made (from the plan cache, through the library's own lookup)."""
    from flashcore.plan.decode import DecodePlan

    seen = []
    real = DecodePlan.__call__

    def spy(self, *a, **k):
        seen.append(self)
        return real(self, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DecodePlan, "__call__", spy)
        res = flashcore.attention_with_kvcache(q, kc, vc, **kw)
    return seen[-1], res


def _prefill_matches_the_reference(q, kc, vc, num_heads_kv, append, **kw):
    """One chunked-prefill call on the Gluon route (``append``: new K/V tokens written first), output and lse poisoned
    first, against the float64 reference on a copy of the caches: the append wrote what the reference wrote, the
    output and lse match. Returns (the plan, the output)."""
    B, Sq, _, D = q.shape
    kw = dict(kw, return_lse=True)
    if append:
        kw.update(k=torch.randn(B, Sq, num_heads_kv, D, device=DEV, dtype=torch.bfloat16),
                  v=torch.randn(B, Sq, num_heads_kv, D, device=DEV, dtype=torch.bfloat16))
    kc2, vc2 = kc.clone(), vc.clone()
    out = torch.full_like(q, float("nan"))
    plan, (o, lse) = _prefill_plan(q, kc, vc, out=out, **kw)
    assert plan.prefill is not None and plan.split is None
    ro, rl = R.attention_with_kvcache(q, kc2, vc2, **kw)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)  # the append wrote what the reference wrote
    assert o is out and not torch.isnan(o).any()
    assert rel_err(o, ro) < 1e-2
    assert torch.equal(torch.isinf(lse), torch.isinf(rl))
    fin = torch.isfinite(rl)
    assert rel_err(lse[fin], rl[fin]) < 1e-4
    return plan, o


@pytest.mark.parametrize("D,heads", [(128, (32, 8)), (64, (16, 16))])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("append", [False, True])
def test_chunked_prefill_runs_the_gluon_kernel_with_per_sequence_key_lengths(D, heads, causal, append):
    """Sq >= 128 against a contiguous cache: the Gluon forward kernel with each sequence's key length, against the
    float64 reference: lengths 0, shorter than the queries (rows that see no key: zeros, lse -inf), not a multiple
    of the key tile, and full; output and lse poisoned first."""
    from flashcore.plan.prefill import PREFILL_MIN_SEQLEN_Q

    B, cap, Sq = 4, 1000, PREFILL_MIN_SEQLEN_Q[D] + 72
    q, kc, vc, _, _, _ = _case(B, heads[0], heads[1], D, cap, 0, Sq=Sq, seed=3)
    lens = torch.tensor([0, 77, 555, cap - (Sq if append else 0)], dtype=torch.int32, device=DEV)
    plan, o = _prefill_matches_the_reference(q, kc, vc, heads[1], append, cache_seqlens=lens, causal=causal)
    if causal and not append:
        assert torch.equal(o[1, :Sq - 77], torch.zeros_like(o[1, :Sq - 77]))  # rows that see no key


@pytest.mark.parametrize("D,heads", [(128, (32, 8)), (64, (16, 16))])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("page", [0, 16, 128])
def test_secure_chunked_prefill_runs_the_secure_gluon_kernel(D, heads, causal, page):
    """Secure mode, Sq >= the threshold, a contiguous cache or a paged one (pages smaller than a key tile, and one
    tile's size; shuffled): the Gluon kernel's secure form (every tile of the cache visited and masked by the secret
    lengths), against the float64 reference: lengths 0, shorter than the queries, not a multiple of the key tile, and
    full; output and lse poisoned first. (Secure mode does not append: the write position is secret; _checks refuses
    it.)"""
    from flashcore.plan.prefill import PREFILL_MIN_SEQLEN_Q

    B, cap, Sq = 4, 1000, PREFILL_MIN_SEQLEN_Q[D] + 72
    q, kc, vc, table, _, _ = _case(B, heads[0], heads[1], D, cap, page, Sq=Sq, seed=13)
    lens = torch.tensor([0, 77, 555, cap], dtype=torch.int32, device=DEV)
    plan, o = _prefill_matches_the_reference(q, kc, vc, heads[1], False, cache_seqlens=lens, causal=causal,
                                             secure=True, page_table=table)
    assert plan.prefill.step.constexprs["SECURE"] and plan.prefill.step.constexprs["KEY_LENS"]
    assert plan.prefill.step.constexprs["PAGE_SIZE"] == page
    if causal:
        assert torch.equal(o[1, :Sq - 77], torch.zeros_like(o[1, :Sq - 77]))  # rows that see no key


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("page", [0, 16])
def test_secure_chunked_prefill_output_keeps_every_bit_for_any_stale_cache_contents(causal, page):
    """Secure mode's contract on the Gluon route: what the cache holds past each length (random values, zeros, NaN,
    +-Inf; in a paged cache, in the rest of the sequence's pages) changes no bit of the output or lse."""
    B, cap, Sq = 3, 1000, 200
    q, kc, vc, table, _, _ = _case(B, 16, 4, 128, cap, page, Sq=Sq, seed=17)
    lens = torch.tensor([0, 333, 901], dtype=torch.int32, device=DEV)
    results = []
    for fill in ([1.0, -2.0, 3.5], [0.0], [float("nan"), float("inf"), float("-inf")], None):
        k2, v2 = kc.clone(), vc.clone()
        if fill is None:  # fresh random values
            _stale(k2, table, lens, page, torch.randn(7).tolist())
            _stale(v2, table, lens, page, torch.randn(5).tolist())
        else:
            _stale(k2, table, lens, page, fill)
            _stale(v2, table, lens, page, fill)
        plan, (o, lse) = _prefill_plan(q, k2, v2, cache_seqlens=lens, causal=causal, secure=True, return_lse=True,
                                       page_table=table)
        assert plan.prefill is not None and plan.prefill.step.constexprs["PAGE_SIZE"] == page
        results.append((o, lse))
    for o, lse in results[1:]:
        assert torch.equal(o, results[0][0]) and torch.equal(lse, results[0][1])


@pytest.mark.parametrize("D,heads,causal,page", [(128, (32, 8), True, 0), (128, (16, 4), False, 0),
                                                  (64, (16, 16), False, 0), (128, (32, 8), True, 16),
                                                  (128, (16, 4), False, 64), (64, (16, 4), True, 32)])
def test_secure_chunked_prefill_v_prepass_and_loader_clearing_agree_bit_for_bit(D, heads, causal, page):
    """Secure chunked prefill on a contiguous or a paged cache (shuffled pages), V's rows past each length cleaned by
    the V pre-pass (paged: through the page table into a contiguous copy; the kernel's V_PREPASS form, whose loader
    only copies) or cleared by the loader warpgroup in every tile: the same output and lse bit for bit (the cleaned
    rows' probabilities are exact zeros either way), with NaN/Inf and random values in the stale slots, against the
    float64 reference; output poisoned first."""
    from flashcore.plan.knobs import override
    from flashcore.plan.prefill import PREFILL_MIN_SEQLEN_Q

    B, cap, Sq = 4, 1024 if page else 1100, PREFILL_MIN_SEQLEN_Q[D] + 40
    q, kc, vc, table, _, _ = _case(B, heads[0], heads[1], D, cap, page, Sq=Sq, seed=23)
    lens = torch.tensor([0, 131, 700, cap], dtype=torch.int32, device=DEV)
    _stale(kc, table, lens, page, [float("nan"), 2.0, float("-inf")])
    _stale(vc, table, lens, page, [float("inf"), float("nan"), -3.0])
    results = {}
    for mode in ("prepass", "loader"):
        with override(secure_prefill_v=mode):
            out = torch.full_like(q, float("nan"))
            plan, (o, lse) = _prefill_plan(q, kc, vc, cache_seqlens=lens, causal=causal, secure=True,
                                           return_lse=True, out=out, page_table=table)
        assert plan.prefill.step.constexprs["PAGE_SIZE"] == page
        assert plan.prefill is not None and plan.prefill.step.constexprs["SECURE"]
        assert (plan.prefill.prepass is not None) == (mode == "prepass")
        assert plan.prefill.step.constexprs.get("V_PREPASS", False) == (mode == "prepass")
        assert len(plan.steps) == (2 if mode == "prepass" else 1)
        results[mode] = (o.clone(), lse.clone())
    (o1, l1), (o2, l2) = results["prepass"], results["loader"]
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    assert not torch.isnan(o1).any()
    ro, rl = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=causal, return_lse=True, page_table=table)
    assert rel_err(o1, ro) < 1e-2
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isinf(l1), torch.isinf(rl)) and rel_err(l1[fin], rl[fin]) < 1e-4


def test_chunked_prefill_keeps_the_decode_kernel_where_the_gluon_kernel_cannot_run():
    """Page sizes the copy engine cannot take page by page, an explicit split count, fewer queries than the
    threshold, D 64 below its threshold: the decode kernel."""
    from flashcore.plan.prefill import PAGE_SIZES, PREFILL_MIN_SEQLEN_Q

    least = PREFILL_MIN_SEQLEN_Q[128]
    for page in (1, 4, 24):
        assert page not in PAGE_SIZES
        q, kc, vc, table, lens, descale = _case(2, 16, 4, 128, 700, page, Sq=least)
        plan, o = _prefill_plan(q, kc, vc, cache_seqlens=lens, page_table=table)
        assert plan.prefill is None
        assert rel_err(o, R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table)) < 1e-2
    q, kc, vc, _, lens, _ = _case(2, 16, 4, 128, 700, 0, Sq=least)
    assert _prefill_plan(q, kc, vc, cache_seqlens=lens, num_splits=2)[0].prefill is None
    assert _prefill_plan(q[:, :least - 1], kc, vc, cache_seqlens=lens)[0].prefill is None
    assert _prefill_plan(q[..., :64], kc[..., :64], vc[..., :64], cache_seqlens=lens)[0].prefill is None  # D 64: 128
    plan, o = _prefill_plan(q, kc, vc, cache_seqlens=lens)
    assert plan.prefill is not None
    assert rel_err(o, R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens)) < 1e-2


def _stale(cache, table, lens, page, values):
    """Fill every cache slot past each sequence's length (contiguous rows, or the pages of its table row) with
    ``values`` in turn: what a cache allocated with torch.empty, or left by an earlier request, may hold there."""
    B = lens.shape[0]
    for b in range(B):
        L = int(lens[b])
        if table is None:
            tail = cache[b, L:]
        else:
            rows = cache[table[b].long().clamp(min=0)].flatten(0, 1)  # (a copy: gather, then scatter back)
            tail = rows[L:]
        flat = tail.view(-1)
        for i, x in enumerate(values):
            flat[i::len(values)] = x
        if table is not None:
            pages = table[b].long()
            ok = pages >= 0
            cache[pages[ok]] = rows.view(-1, page, *cache.shape[2:])[ok]


@pytest.mark.parametrize("page,secure", [(0, False), (16, False), (128, False), (0, True), (16, True)])
def test_chunked_prefill_nan_and_inf_past_the_key_lengths_stay_out(page, secure):
    """Slots past a sequence's key length may hold NaN or Inf (never written, or stale). The Gluon kernel reads the
    last key tile whole (secure mode: every tile of the cache), and its probabilities there are 0, but 0 * NaN = NaN:
    the output must still equal the reference on a clean cache (lengths not a multiple of the key tile, one of them
    0)."""
    from flashcore.plan.prefill import PREFILL_MIN_SEQLEN_Q

    B, cap, Sq = 3, 1000, PREFILL_MIN_SEQLEN_Q[128] + 40
    q, kc, vc, table, _, _ = _case(B, 16, 4, 128, cap, page, Sq=Sq, seed=11)
    lens = torch.tensor([0, 333, 901], dtype=torch.int32, device=DEV)
    clean_k, clean_v = kc.clone(), vc.clone()
    _stale(kc, table, lens, page, [float("nan"), float("inf"), float("-inf")])
    _stale(vc, table, lens, page, [float("inf"), float("nan"), float("-inf")])
    assert torch.isnan(vc).any() and torch.isinf(vc).any()
    for causal in (False, True):
        out = torch.full_like(q, float("nan"))
        plan, o = _prefill_plan(q, kc, vc, cache_seqlens=lens, page_table=table, causal=causal, out=out,
                                secure=secure)
        assert plan.prefill is not None and plan.prefill.step.constexprs["SECURE"] == secure
        ro = R.attention_with_kvcache(q, clean_k, clean_v, cache_seqlens=lens, page_table=table, causal=causal)
        assert not torch.isnan(o).any(), f"causal={causal}: NaN from past the key lengths"
        assert rel_err(o, ro) < 1e-2


@pytest.mark.parametrize("page", [8, 16, 64, 128, 256])
@pytest.mark.parametrize("D,heads", [(128, (32, 8)), (64, (16, 16))])
@pytest.mark.parametrize("causal,append", [(True, False), (False, False), (True, True)])
def test_paged_chunked_prefill_runs_the_gluon_kernel(page, D, heads, causal, append):
    """A paged cache on the Gluon kernel: pages in shuffled physical order, a capacity that is not a multiple of the
    key tile (the table's width times the page size), table entries past the used pages that are not pages (-1),
    lengths 0, short, not a multiple of the tile, and full; against the float64 reference, output and lse poisoned
    first, and the append writing what the reference writes."""
    from flashcore.plan.prefill import PREFILL_MIN_SEQLEN_Q

    B, Sq = 4, PREFILL_MIN_SEQLEN_Q[D] + 24
    cap = 1000 if page < 128 else 1100
    q, kc, vc, table, _, _ = _case(B, heads[0], heads[1], D, cap, page, Sq=Sq, seed=page + D)
    capacity = table.shape[1] * page
    lens = torch.tensor([0, 77, 555, capacity - (Sq if append else 0)], dtype=torch.int32, device=DEV)
    used = (lens + (Sq if append else 0) + page - 1) // page
    table[torch.arange(table.shape[1], device=DEV).view(1, -1) >= used.view(-1, 1)] = -1
    plan, _ = _prefill_matches_the_reference(q, kc, vc, heads[1], append, cache_seqlens=lens, page_table=table,
                                             causal=causal)
    assert plan.prefill.step.constexprs["PAGE_SIZE"] == page


@pytest.mark.parametrize("secure,v_clean", [(False, "auto"), (True, "loader"), (True, "prepass")])
def test_paged_chunked_prefill_cuda_graph_replay_with_new_lengths_and_page_tables(secure, v_clean):
    """A paged cache's captured call replayed with new lengths and shuffled page tables (secure mode: V's stale rows
    cleared by the loader, or gathered through the table and cleaned by the V pre-pass) matches the reference."""
    from flashcore.plan.knobs import override
    from flashcore.plan.prefill import PREFILL_MIN_SEQLEN_Q

    B, cap, Sq = 3, 2048, PREFILL_MIN_SEQLEN_Q[128]
    q, kc, vc, table, lens, _ = _case(B, 32, 8, 128, cap, 16, Sq=Sq, seed=16 if secure else 6)
    out, lens_buf, table_buf = torch.empty_like(q), lens.clone(), table.clone()

    def call():
        return flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens_buf, page_table=table_buf, out=out,
                                                secure=secure)

    def shuffled_pages():  # every page of the table, in a new order across the sequences
        return table.flatten()[torch.randperm(table.numel(), device=DEV)].view_as(table)

    with override(secure_prefill_v=v_clean):
        plan = _prefill_plan(q, kc, vc, cache_seqlens=lens_buf, page_table=table_buf, out=out, secure=secure)[0]
        assert plan.prefill is not None and plan.prefill.step.constexprs["SECURE"] == secure
        assert (plan.prefill.prepass is not None) == (v_clean == "prepass")
        _replay_with_new_lengths_and_tables(call, q, kc, vc, out, lens_buf, table_buf, shuffled_pages)


@pytest.mark.parametrize("secure,v_clean", [(False, "auto"), (True, "loader"), (True, "prepass")])
def test_chunked_prefill_cuda_graph_replay_with_new_lengths(secure, v_clean):
    """One captured call replayed with new lengths (secure mode: the Gluon kernel's secure form, V's stale rows cleared
    by the loader or cleaned by the V pre-pass, whose copy of V the graph's pool keeps) matches the reference each
    time, the output poisoned before each replay."""
    from flashcore.plan.knobs import override
    from flashcore.plan.prefill import PREFILL_MIN_SEQLEN_Q

    B, cap, Sq = 3, 2048, PREFILL_MIN_SEQLEN_Q[128]
    q, kc, vc, _, lens, _ = _case(B, 32, 8, 128, cap, 0, Sq=Sq, seed=15 if secure else 5)
    out, lens_buf = torch.empty_like(q), lens.clone()

    def call():
        return flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens_buf, out=out, secure=secure)

    with override(secure_prefill_v=v_clean):
        plan = _prefill_plan(q, kc, vc, cache_seqlens=lens_buf, out=out, secure=secure)[0]
        assert plan.prefill is not None and plan.prefill.step.constexprs["SECURE"] == secure
        assert (plan.prefill.prepass is not None) == (v_clean == "prepass")
        graph, _ = capture_cuda_graph(call)
    for trial in range(3):
        new_lens = torch.randint(0, cap + 1, (B,), device=DEV).int()
        lens_buf.copy_(new_lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, R.attention_with_kvcache(q, kc, vc, cache_seqlens=new_lens)) < 1e-2, trial


def test_chunked_prefill_with_three_consumer_warpgroups():
    """D 64, non-causal, Sq >= 2048: the Gluon kernel's three-warpgroup form (192-row items) with key lengths."""
    from flashcore.plan import tables

    B, cap, Sq = 2, 2600, 2048
    assert tables.gluon_ws(64, Sq, False).block_m == 192
    q, kc, vc, _, _, _ = _case(B, 16, 4, 64, cap, 0, Sq=Sq, seed=9)
    lens = torch.tensor([1337, cap], dtype=torch.int32, device=DEV)
    out = torch.full_like(q, float("nan"))
    plan, (o, lse) = _prefill_plan(q, kc, vc, cache_seqlens=lens, causal=False, return_lse=True, out=out)
    assert plan.prefill is not None and plan.prefill.step.constexprs["NUM_WG"] == 3
    ro, rl = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=False, return_lse=True)
    assert rel_err(o, ro) < 1e-2 and rel_err(lse, rl) < 1e-4


@pytest.mark.parametrize("page,B,cap,splits", [(16, 24, 2048, 1), (1, 24, 1024, 1), (32, 24, 2048, 1),
                                               (16, 2, 16384, 0), (64, 2, 16384, 0), (0, 2, 16384, 0)])
def test_fast_fp8_decode_v52_forms_match_the_reference_and_ignore_stale_slots(page, B, cap, splits):
    """v52's fast FP8 forms at D 128 (docs/perf-notes.md v52): page gathers at one split on 64-key tiles and with
    splits on 128-key tiles, their whole tiles without masks on register page loads, and the contiguous cache with
    splits on 4 warps, two programs per SM. Random lengths (0 and full among them), e4m3fn's NaN in every slot past
    each length, output poisoned first, against the float64 reference of the dequantised cache."""
    from flashcore.launch.triton_decode import full_tiles, reg_pages
    from flashcore.plan.decode import DecodePlan

    q, kc, vc, table, lens, descale = _case(B, 32, 8, 128, cap, page, fp8=True, seed=61 + page)
    for cache in (kc, vc):
        _stale(cache.view(torch.uint8), table, lens, page, [0x7F, 0xFF])
    out = torch.full_like(q, float("nan"))
    seen, real = [], DecodePlan.__call__

    def spy(self, *a, **k):
        seen.append(self)
        return real(self, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DecodePlan, "__call__", spy)
        o, lse = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, num_splits=splits,
                                                  return_lse=True, out=out, **descale)
    ro, rl = R.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, return_lse=True, **descale)
    assert not torch.isnan(o).any()
    assert rel_err(o, ro) < 1e-2
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isinf(lse), torch.isinf(rl)) and rel_err(lse[fin], rl[fin]) < 1e-4
    plan = seen[-1]
    c = plan.config
    assert (c.block_n, c.num_warps) == ((64, 4) if splits == 1 else (128, 4)), c
    assert full_tiles(plan.shape, c) and reg_pages(plan.shape, c) == bool(page), c


# ---- flashcore.kvcache_step: one step planned, run per layer ------------------------------------------------

STEP_CASES = {  # B, cap, page, Sq, fp8, extra options
    "b1_4k_splits": (1, 4096, 0, 1, False, {}),
    "paged16": (3, 1500, 16, 1, False, {}),
    "fp8_paged16": (3, 1500, 16, 1, True, {}),
    "append_sq2": (3, 1500, 0, 2, False, {}),
    "secure": (3, 1500, 0, 1, False, {"secure": True}),
    "leftpad_sq4_lse": (3, 1500, 0, 4, False, {"return_lse": True, "leftpad": True}),
}


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_kvcache_step_runs_give_each_layer_the_calls_bits_on_the_bound_launches(case, monkeypatch):
    """Three layers' tensors (same shapes, other values, FP8 descales per layer, new tokens per layer) through one
    step: each run's output (lse, caches after an append) equal bit for bit to attention_with_kvcache's, every run on
    the bound launches (BoundDecode.run); a run on another stream takes the full path with the same bits; lengths
    changed in place are read by the next run."""
    from flashcore.plan.decode import BoundDecode

    B, cap, page, Sq, fp8, extra = STEP_CASES[case]
    extra = dict(extra)
    layers = [_case(B, 32, 8, 128, cap, page, Sq=Sq, fp8=fp8, seed=s) for s in range(3)]
    _, _, _, table, lens, _ = layers[0]
    kw = dict(cache_seqlens=lens, page_table=table, causal=Sq > 1, **extra)
    if kw.pop("leftpad", False):
        kw["cache_leftpad"] = (torch.rand(B, device=DEV) * lens).int()
    if case.startswith("append"):
        lens.clamp_(max=cap - Sq)
    g = torch.Generator(device=DEV).manual_seed(7)
    new = [dict(k=torch.randn(B, Sq, 8, 128, device=DEV, generator=g, dtype=torch.bfloat16),
                v=torch.randn(B, Sq, 8, 128, device=DEV, generator=g, dtype=torch.bfloat16))
           if case.startswith("append") else {} for _ in layers]
    q0, kc0, vc0, _, _, d0 = layers[0]
    flashcore.attention_with_kvcache(q0, kc0.clone(), vc0.clone(), **kw, **d0, **new[0])  # compiles the plan
    step = flashcore.kvcache_step(q0, kc0, vc0, **kw, **d0, **new[0])
    bound = []
    run = BoundDecode.run
    monkeypatch.setattr(BoundDecode, "run", lambda self, *a: bound.append(1) or run(self, *a))

    def both(q, kc, vc, d, kv):
        kr, vr, kw_, vw_ = kc.clone(), vc.clone(), kc.clone(), vc.clone()
        got = step.run(q, kr, vr, **d, **kv)
        want = flashcore.attention_with_kvcache(q, kw_, vw_, **kw, **d, **kv)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for x, y in zip(got, want):
            assert not torch.isnan(x).any() and torch.equal(x, y)
        assert torch.equal(kr, kw_) and torch.equal(vr, vw_)

    for i, (q, kc, vc, _, _, d) in enumerate(layers):
        both(q, kc, vc, d, new[i])
    assert len(bound) == len(layers)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        both(*layers[1][:3], layers[1][5], new[1])
    torch.cuda.current_stream().wait_stream(s)
    assert len(bound) == len(layers)  # another stream: the full path
    lens.copy_(torch.randint(0, cap - Sq + 1, (B,), device=DEV).int())
    if "cache_leftpad" in kw:
        kw["cache_leftpad"].copy_((torch.rand(B, device=DEV) * lens).int())
    both(*layers[2][:3], layers[2][5], new[2])
    assert len(bound) == len(layers) + 1


def test_kvcache_step_run_captured_in_a_graph_replays_with_new_lengths_and_page_tables():
    """A run under CUDA-graph capture takes the full path (the graph's own workspace) and replays correctly."""
    q, kc, vc, table, lens, _ = _case(4, 32, 8, 128, 4096, 16)
    out = torch.empty_like(q)
    lens_buf, table_buf = lens.clone(), table.clone()
    step = flashcore.kvcache_step(q, kc, vc, cache_seqlens=lens_buf, page_table=table_buf, out=out)
    step.run(q, kc, vc, out=out)
    _replay_with_new_lengths_and_tables(lambda: step.run(q, kc, vc, out=out), q, kc, vc, out, lens_buf, table_buf,
                                        lambda: table[torch.randperm(4, device=DEV)])


def test_kvcache_step_bound_runs_keep_the_calls_checks_and_follow_moved_metadata(monkeypatch):
    """Review of session 46, on the bound launches: a run whose out overlaps q (the same facts as the planned out)
    raises as a call does; a bound page table moved to other memory in place (``set_``) is followed (the run takes
    the full path), not read at its old address; an int ``cache_seqlens`` is converted again for a run on another
    stream (a tensor filled on that stream), not the step's tensor filled on its own stream."""
    from flashcore.plan.decode import _LENGTHS, BoundDecode
    from flashcore.runtime import current_stream

    q, kc, vc, table, lens, _ = _case(3, 32, 8, 128, 1500, 16, seed=3)
    out = torch.empty_like(q)
    step = flashcore.kvcache_step(q, kc, vc, cache_seqlens=lens, page_table=table, out=out)
    step.run(q, kc, vc, out=out)  # compiles
    bound = []
    run = BoundDecode.run
    monkeypatch.setattr(BoundDecode, "run", lambda self, *a: bound.append(1) or run(self, *a))
    with pytest.raises(ValueError, match="out must not overlap q"):
        step.run(q, kc, vc, out=q)
    assert not bound
    old = table.view_as(table)  # keeps the bound memory alive, with the old entries
    table.set_(table[:, torch.randperm(table.shape[1], device=DEV)].contiguous())  # other memory, other order
    got = step.run(q, kc, vc)
    want = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table)
    assert not bound and torch.equal(got, want) and not torch.equal(old, table)
    # an int length, run on another stream
    q, kc, vc, _, _, _ = _case(1, 32, 8, 128, 4096, 0, seed=4)
    step = flashcore.kvcache_step(q, kc, vc, cache_seqlens=4000)
    step.run(q, kc, vc)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        key = (4000, 1, q.device.index, current_stream(q.device))
        assert _LENGTHS.get(key) is None
        got = step.run(q, kc, vc)
        made_on_s = _LENGTHS.get(key) is not None  # (the call below would make it too: checked before it)
        want = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=4000)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(got, want) and made_on_s


def test_dense_short_query_plan_made_under_capture_serves_later_eager_calls():
    """A dense call with a short query runs on the decode kernel (DenseDecodePlan). When its plan is first made
    while a CUDA graph is captured, a later eager call with the same key (a plan-cache hit) must not read a lengths
    tensor that only the graph's replay fills (an audit of the plan-cache hits, session 46: that call returned
    zeros), and the graph's replay gives the same answer."""
    g = torch.Generator(device=DEV).manual_seed(12)
    Sk = 2048 + 40  # a key no other test plans

    def inputs(B):
        return (torch.randn(B, 32, 1, 128, device=DEV, dtype=torch.bfloat16, generator=g),
                torch.randn(B, 8, Sk, 128, device=DEV, dtype=torch.bfloat16, generator=g),
                torch.randn(B, 8, Sk, 128, device=DEV, dtype=torch.bfloat16, generator=g))

    flashcore.attention(*inputs(3))  # compiles the kernels (another key)
    q, k, v = inputs(2)
    out, out2 = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashcore.attention(q, k, v, out=out)
    eager = flashcore.attention(q, k, v, out=out2)  # the same key, before any replay
    torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    assert ((eager.double() - ref).norm() / ref.norm()).item() < 1e-2
    graph.replay()
    torch.cuda.synchronize()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
