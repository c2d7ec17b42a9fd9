"""The warp-specialised Gluon kernel (kernels/sm90/fwd.py, launch/sm90_fwd.py): dispatch and eligibility on the CPU,
its sm_90a machine code (compiled here without a GPU), and correctness on a GPU."""
import pytest
import torch

from flashcore.launch import sm90_fwd
from flashcore.plan import knobs, select, tables
from conftest import capture_cuda_graph, rel_err

BIG = dict(head_dim=128, dtype_bytes=2, causal=False, secure=False, seqlen_q=4096, seqlen_k=4096, batch_heads=128)


def test_hopper_picks_gluon_for_fast_d128_and_larger_d64_only():
    for d in (64, 128):
        assert tables.hopper(**dict(BIG, head_dim=d)).kernel == "gluon_ws"
    assert tables.hopper(**dict(BIG, causal=True)).kernel == "gluon_ws"
    # D=128 from 1x8x512x512 on (host cost no longer decides); D=64 from 2x16x1024x1024 on
    assert tables.hopper(**dict(BIG, seqlen_q=512, seqlen_k=512, batch_heads=8)).kernel == "gluon_ws"
    assert tables.hopper(**dict(BIG, seqlen_q=1, seqlen_k=4096, batch_heads=32)).kernel == "triton"  # decode
    for change in (dict(dtype_bytes=4), dict(head_dim=96), dict(head_dim=256),
                   dict(head_dim=64, causal=True),  # 4x32x4096x64 causal: Triton ahead of both Gluon layouts
                   dict(head_dim=64, causal=True, seqlen_q=512, seqlen_k=512, batch_heads=8),
                   dict(head_dim=64, seqlen_q=256, seqlen_k=256, batch_heads=8)):
        assert tables.hopper(**dict(BIG, **change)).kernel == "triton", change
    # D=64 small problems: one consumer warpgroup, two programs per SM (perf-notes v14)
    one = tables.gluon_one_wg()
    for change in (dict(seqlen_q=1024, seqlen_k=1024, batch_heads=16), dict(seqlen_q=512, seqlen_k=512, batch_heads=8),
                   dict(seqlen_q=1024, seqlen_k=1024, batch_heads=32),
                   dict(causal=True, seqlen_q=1024, seqlen_k=1024, batch_heads=16),
                   dict(causal=True, seqlen_q=2048, seqlen_k=2048, batch_heads=64)):
        assert tables.hopper(**dict(BIG, head_dim=64, **change)) == one, change
    assert one.block_m == 64 and one.kernel == "gluon_ws"
    # secure mode too, in the same ranges (issue 25 §3; audited as secure_gluon_ws_*_1wg)
    assert tables.hopper(**dict(BIG, head_dim=64, secure=True, seqlen_q=1024, seqlen_k=1024, batch_heads=16)) == one
    assert tables.hopper(**dict(BIG, head_dim=64, secure=True, causal=True, seqlen_q=1024, seqlen_k=1024,
                                batch_heads=64)) == one
    assert tables.hopper(**dict(BIG, head_dim=64, seqlen_q=1024, seqlen_k=1024, batch_heads=64)).block_m == 128
    # decode-like query blocks were not measured on it: the older rule (Triton below 2^25)
    assert tables.hopper(**dict(BIG, head_dim=64, seqlen_q=16, seqlen_k=65536, batch_heads=16)).kernel == "triton"
    assert select.table_config((8, 0), **BIG).kernel == "triton"  # Ampere never gets it


def test_env_forces_either_kernel(monkeypatch):
    monkeypatch.setenv(knobs.HOPPER_KERNEL_ENV, "triton")
    assert select.table_config((9, 0), **BIG).kernel == "triton"
    monkeypatch.setenv(knobs.HOPPER_KERNEL_ENV, "gluon_ws")
    assert select.table_config((9, 0), **dict(BIG, head_dim=64, seqlen_q=64, seqlen_k=64)).kernel == "gluon_ws"
    # the fast path's knob does not steer secure mode (that is SECURE_KERNEL_ENV's job)
    monkeypatch.setenv(knobs.SECURE_KERNEL_ENV, "triton")
    assert select.table_config((9, 0), **dict(BIG, secure=True)).kernel == "triton"
    monkeypatch.setenv(knobs.HOPPER_KERNEL_ENV, "fastest")
    with pytest.raises(ValueError, match=knobs.HOPPER_KERNEL_ENV):
        select.table_config((9, 0), **BIG)


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype)


def _rejection(q, k, v, o, arch=(9, 0), **kw):
    """Why select() would not run the sm_90 kernel on these [B, H, S, D] tensors (None: it would)."""
    from dataclasses import replace

    from flashcore.problem import Problem

    kw = dict(dict(causal=False, scale=0.1, layout="bhsd", secure=False, self_attention=False, return_lse=False), **kw)
    problem = replace(Problem.dense(q, k, v, o, **kw), arch=arch)
    return select.sm90_rejection(problem, tables.gluon_ws(q.shape[-1]))


def test_eligibility():
    from dataclasses import replace

    from flashcore.problem import Problem

    q = _t(2, 4, 256, 128)
    assert _rejection(q, q, q, q) is None
    assert "bf16" in _rejection(q.float(), q.float(), q.float(), q.float())
    x = _t(2, 4, 256, 96)
    assert "head dims" in _rejection(x, x, x, x)
    # a row stride of 136 elements (272 bytes) is 16-byte aligned; 129 is not
    ok = _t(2, 4, 256, 136)[..., :128]
    bad = _t(2, 4, 256, 129)[..., :128]
    assert _rejection(ok, ok, ok, ok) is None
    assert "copy engine" in _rejection(q, bad, q, q)
    off = _t(2 * 4 * 256 * 128 + 1)[1:].view(2, 4, 256, 128)  # base 2 bytes past alignment
    assert "copy engine" in _rejection(q, q, q, off)
    assert "sm_90" in _rejection(q, q, q, q, arch=(8, 0)) and "sm_90" in _rejection(q, q, q, q, arch=None)
    # secure causal runs here with a public diagonal (self-attention) and, since v36, with a secret one (explicit
    # query lengths: the SECRET_DIAG form); the Gluon kernel has no in-loop V select
    assert _rejection(q, q, q, q, secure=True, causal=True) is None
    assert _rejection(q, q, q, q, secure=True, causal=True, self_attention=True) is None
    problem = replace(Problem.dense(q, q, q, q, causal=True, scale=0.1, layout="bhsd", secure=True,
                                    self_attention=False, return_lse=False), arch=(9, 0))
    assert "v_prepass" in select.sm90_rejection(problem, replace(tables.gluon_ws(128), v_prepass=False))


def test_v_ring_depth_fits_shared_memory():
    for d, stages in ((128, 2), (128, 3), (64, 3), (64, 4)):
        vs = tables.v_stages(stages, 128, 128, d)
        assert 1 <= vs <= stages
        q_bytes = 2 * 128 * d * 2  # Q is double-buffered (persistent kernel)
        assert q_bytes + (stages + vs) * 128 * d * 2 <= tables.RING_BYTES
        assert vs == stages or q_bytes + (stages + vs + 1) * 128 * d * 2 > tables.RING_BYTES  # deepest


def test_unsupported_gluon_configs_are_refused():
    from dataclasses import replace

    q, lse = _t(2, 4, 256, 128), torch.empty(2, 4, 256)
    kw = dict(scale=0.1, causal=False, seqlen_q=256, seqlen_k=256, batch=2, num_heads_q=4, num_heads_kv=4,
              lse_strides=(4 * 256, 256))
    for bad in (dict(block_m=64), dict(block_m=192), dict(block_n=256), dict(num_stages=0), dict(num_stages=5)):
        with pytest.raises(ValueError, match="gluon_ws config"):  # (three warpgroups only at D=64)
            sm90_fwd.GluonLaunch(q, q, q, q, lse, cfg=replace(tables.gluon_ws(128), **bad), **kw)
    sm90_fwd.GluonLaunch(q, q, q, q, lse, cfg=tables.gluon_ws(128), **kw)  # the default is accepted
    q64 = _t(2, 4, 256, 64)
    three = sm90_fwd.GluonLaunch(q64, q64, q64, q64, lse, cfg=tables.gluon_ws(64, 4096), **kw).step
    assert three.constexprs["NUM_WG"] == 3 and three.options["maxnreg"] == sm90_fwd.MAXNREG_3WG
    assert three.scalars[-3] == -(-256 // 192)  # 192-row work items (then the units, and the page table's stride)
    # a paged cache: the fast form with key lengths, a power-of-two page of 8 or more rows, two or three warpgroups
    kv = dict(kw, key_lens=True, table_stride=4)
    for bad in (dict(page_size=12), dict(page_size=4), dict(page_size=16, key_lens=False),
                dict(page_size=16, key_lens=False, secure=True)):
        with pytest.raises(ValueError, match="paged cache"):
            sm90_fwd.GluonLaunch(q, q, q, q, lse, cfg=tables.gluon_ws(128), **{**kv, **bad})
    with pytest.raises(ValueError, match="paged cache"):
        sm90_fwd.GluonLaunch(q64, q64, q64, q64, lse, cfg=replace(tables.gluon_ws(64), block_m=64), page_size=16, **kv)
    paged = sm90_fwd.GluonLaunch(q, q, q, q, lse, cfg=tables.gluon_ws(128), page_size=16, **kv).step
    assert paged.constexprs["PAGE_SIZE"] == 16 and paged.scalars[-1] == 4
    assert paged.constexprs["LOADER_WG_REGS"] == sm90_fwd.LOADER_REGS_PAGED_2WG  # two consumer warpgroups
    assert paged.constexprs["CONSUMER_WG_REGS"] == sm90_fwd.CONSUMER_REGS_PAGED_2WG
    paged3 = sm90_fwd.GluonLaunch(q64, q64, q64, q64, lse, cfg=tables.gluon_ws(64, 4096), page_size=16, **kv).step
    assert paged3.constexprs["NUM_WG"] == 3 and paged3.constexprs["LOADER_WG_REGS"] == sm90_fwd.LOADER_REGS_PAGED
    assert paged3.constexprs["CONSUMER_WG_REGS"] == sm90_fwd.CONSUMER_REGS_3WG  # (no room for more beside three)
    # secure mode with key lengths (chunked prefill): a contiguous cache or secure mode's page sizes, and two or three
    # warpgroups; no key weights (every tile masked), and a loader warpgroup that clears V's rows past the lengths
    sec = sm90_fwd.GluonLaunch(q, q, q, q, lse, cfg=tables.gluon_ws(128), secure=True, **kv).step
    assert sec.constexprs["SECURE"] and sec.constexprs["KEY_LENS"] and not sec.constexprs["SUM_MMA"]
    assert sec.constexprs["LOADER_WG_REGS"] == sm90_fwd.LOADER_REGS_SECURE_KEY_LENS
    assert not sec.constexprs["EARLY_LOADS"] and not sec.constexprs["TRACE"] and sec.constexprs["STAGGER"] == 0
    sec_paged = sm90_fwd.GluonLaunch(q, q, q, q, lse, cfg=tables.gluon_ws(128), secure=True, page_size=16, **kv).step
    assert sec_paged.constexprs["SECURE"] and sec_paged.constexprs["PAGE_SIZE"] == 16
    assert sec_paged.constexprs["LOADER_WG_REGS"] == sm90_fwd.LOADER_REGS_PAGED_2WG  # (the register file holds it)
    assert 2 * 128 * sec_paged.constexprs["CONSUMER_WG_REGS"] + 128 * sm90_fwd.LOADER_REGS_PAGED_2WG <= 65536
    for bad, cfg in ((dict(page_size=8), tables.gluon_ws(128)), (dict(page_size=512), tables.gluon_ws(128)),
                     ({}, replace(tables.gluon_ws(64), block_m=64))):
        x = q if cfg.block_m > 64 else q64
        with pytest.raises(ValueError, match="secure mode with per-sequence key lengths"):
            sm90_fwd.GluonLaunch(x, x, x, x, lse, cfg=cfg, secure=True, **{**kv, **bad})


def test_three_consumer_warpgroups_only_for_long_noncausal_d64():
    assert tables.gluon_ws(64, 2048).block_m == 192
    assert tables.hopper(**dict(BIG, head_dim=64, seqlen_q=2048, seqlen_k=2048)).block_m == 192
    for other in (tables.gluon_ws(64, 1024), tables.gluon_ws(64, 4096, causal=True), tables.gluon_ws(128, 4096)):
        assert other.block_m == 128


def test_knobs_are_part_of_the_plan_keys(monkeypatch):
    """Every knob (environment variables and the Gluon kernel's switches) is in every plan key, so a changed
    knob takes effect on the next call with no cache to clear."""
    from flashcore.problem import dense_key

    q = _t(1, 2, 64, 64)
    key = lambda: dense_key("auto", q, q, q, None, None, None, layout="bhsd", causal=False, scale=None, secure=False,
                            self_attention=True, return_lse=False, validate=True)
    monkeypatch.delenv(knobs.HOPPER_KERNEL_ENV, raising=False)
    before = key()
    assert key() == before
    monkeypatch.setenv(knobs.HOPPER_KERNEL_ENV, "triton")
    assert key() != before
    monkeypatch.delenv(knobs.HOPPER_KERNEL_ENV)
    for switch in ({"trace": True}, {"stagger": 0}, {"early_loads": False}, {"causal_pairs": False},
                   {"fast_sum_mma": True}):
        with knobs.override(**switch):
            assert key() != before, switch
    assert key() == before
    with pytest.raises(TypeError, match="unknown Gluon switch"):
        with knobs.override(probe_depth=1):
            pass


def test_fallback_table_follows_the_architecture():
    kw = dict(BIG)
    assert tables.triton_table(None, **kw) == tables.INTERPRETER
    assert tables.triton_table((9, 0), **kw) == tables.hopper_triton(**kw)
    assert tables.triton_table((8, 0), **kw) == tables.generic(**kw)


def test_build_launch_never_uses_a_gluon_config_for_the_triton_kernel():
    from flashcore.launch.triton_fwd import build_launch

    q = _t(2, 4, 4096, 128)
    lse = torch.empty(2, 4, 4096)
    kw = dict(
        seqlens_q=None, seqlens_k=None, cu_seqlens_q=None, cu_seqlens_k=None, scale=0.1,
        causal=False, secure=False, secure_public_diag=False, seqlen_q=4096, seqlen_k=4096, batch=2,
        num_heads_q=4, num_heads_kv=4, q_strides=q.stride()[:3], k_strides=q.stride()[:3],
        v_strides=q.stride()[:3], o_strides=q.stride()[:3], lse_strides=(4 * 4096, 4096),
        config=tables.gluon_ws(128))
    with pytest.raises(ValueError, match="Triton kernel's launch"):
        build_launch(q, q, q, q, lse, **kw)
    cfg, _, _, ce = build_launch(q, q, q, q, lse, **dict(kw, config=tables.hopper_triton(**BIG)))
    assert cfg.kernel == "triton" and ce["BLOCK_M"] == cfg.block_m


@pytest.mark.parametrize("head_dim,causal,block_m", [(128, False, 128), (64, True, 128), (64, False, 192),
                                                     (64, False, 64)])
def test_sm90a_machine_code(head_dim, causal, block_m):
    """Compiled for sm_90a here (no GPU): the kernel must be warp-specialised (register
    reallocation between partitions), run P@V from registers on wgmma, and never spill (three
    consumer warpgroups at 160 registers each, and one at 232 with two programs per SM, included)."""
    from conftest import expect_register_fit, gluon_sass

    sass = gluon_sass(head_dim, causal, block_m=block_m)
    assert "USETMAXREG" in sass
    hgmma = [ln for ln in sass.splitlines() if "HGMMA." in ln]
    assert any(".tnspB" in ln and " R" in ln.split("HGMMA.")[1].split(",")[1] for ln in hgmma), "P@V from registers"
    assert "UTMALDG" in sass and "UTMASTG" in sass
    form = "fast_d64_3wg" if (head_dim, causal, block_m) == (64, False, 192) else None
    expect_register_fit(form, "STL" not in sass and "LDL" not in sass, "register spills")


def test_timeline_trace_is_compiled_only_when_asked_for():
    """The debug timeline (the ``trace`` switch) adds clock reads; off (the default, and always in secure mode) the
    kernel has none."""
    from conftest import expect_register_fit, gluon_sass

    clock = ("SR_CLOCKLO", "SR_GLOBALTIMERLO")
    assert not any(c in gluon_sass(64, False) for c in clock)
    traced = gluon_sass(64, False, trace=True)
    assert all(c in traced for c in clock)
    assert not any(c in gluon_sass(128, False, secure=True, trace=True) for c in clock)
    expect_register_fit("fast_d64_3wg_traced", "STL" not in traced, "the traced kernel spills")


def test_entry_loads_and_stagger_are_fast_path_only():
    """EARLY_LOADS (the first item's Q, K_0 and V_0 requested at kernel entry) and STAGGER (the consumer
    warpgroups' first items offset) are on by default on the fast path, which then holds exactly NUM_WG + 2 more
    TMA loads (the entry's; the loader keeps its own for the later items) and one more mbarrier wait per later
    warpgroup (D=64 only); the secure kernel's machine code does not change with either switch (the form the
    gate passed)."""
    from conftest import expect_register_fit, gluon_sass

    off = {"early_loads": False, "stagger": 0}
    fits_3wg = None
    for block_m in (64, 128, 192):
        on_sass, off_sass = gluon_sass(64, False, block_m=block_m), gluon_sass(64, False, block_m=block_m, attrs=off)
        assert on_sass.count("UTMALDG") - off_sass.count("UTMALDG") == block_m // 64 + 2
        if block_m == 192:  # checked last (below): a known miss ends the test
            fits_3wg = "STL" not in on_sass and "LDL" not in on_sass
        else:
            assert "STL" not in on_sass and "LDL" not in on_sass
    assert gluon_sass(128, True, secure=True) == gluon_sass(128, True, secure=True, attrs=off)
    q, lse = _t(1, 2, 256, 64), torch.empty(1, 2, 256)
    kw = dict(scale=0.1, causal=False, seqlen_q=256, seqlen_k=256, batch=1, num_heads_q=2, num_heads_kv=2,
              lse_strides=(512, 256), cfg=tables.gluon_ws(64))
    fast = sm90_fwd.GluonLaunch(q, q, q, q, lse, **kw).step.constexprs
    secure = sm90_fwd.GluonLaunch(q, q, q, q, lse, secure=True, **kw).step.constexprs
    assert fast["EARLY_LOADS"] and fast["STAGGER"] == 1
    d128 = sm90_fwd.GluonLaunch(*(_t(1, 2, 256, 128), ) * 4, lse, **{**kw, "cfg": tables.gluon_ws(128)})
    assert d128.step.constexprs["EARLY_LOADS"] and d128.step.constexprs["STAGGER"] == 0
    assert not secure["EARLY_LOADS"] and secure["STAGGER"] == 0
    expect_register_fit("fast_d64_3wg", fits_3wg, "three warpgroups with the entry loads spill")


def test_traced_launch_refuses_anything_but_a_trace_buffer(monkeypatch):
    """A traced launch writes int64 clocks through the lengths argument: a dummy tensor there (what the normal call
    path passes) would be overwritten, so run() refuses it before launching."""
    q, lse = _t(1, 2, 256, 64), torch.empty(1, 2, 256)
    with knobs.override(trace=True):
        launch = sm90_fwd.GluonLaunch(q, q, q, q, lse, scale=0.1, causal=False, seqlen_q=256, seqlen_k=256, batch=1,
                                      num_heads_q=2, num_heads_kv=2, lse_strides=(512, 256), cfg=tables.gluon_ws(64))
    assert launch.step.constexprs["TRACE"] and launch.trace_slots == 4 * 2 * sm90_fwd.TRACE_SLOTS
    for bad in (q, torch.zeros(launch.trace_slots - 1, dtype=torch.int64),
                torch.zeros(2 * launch.trace_slots, dtype=torch.int64)[::2]):
        with pytest.raises(ValueError, match="trace buffer"):
            launch.run((q, q, q, q, lse, bad), q.device)
        secure = sm90_fwd.GluonLaunch(q, q, q, q, lse, scale=0.1, causal=False, seqlen_q=256, seqlen_k=256,
                                      batch=1, num_heads_q=2, num_heads_kv=2, lse_strides=(512, 256),
                                      cfg=tables.gluon_ws(64), secure=True)
    assert not secure.step.constexprs["TRACE"] and secure.trace_slots == 0


def test_grid_is_persistent_with_paired_causal_items(monkeypatch):
    """Non-causal: one program per SM, each looping over work items (2 x 64 query rows of a head).
    Causal: the scheduling unit is a pair of row tiles (heavy + its light mirror), so units cost the
    same; with pairing off, each causal item is its own program."""
    kw = dict(scale=0.1, seqlen_q=4096, seqlen_k=4096, batch=2, num_heads_q=16, num_heads_kv=16,
              lse_strides=(16 * 4096, 4096), cfg=tables.gluon_ws(128))
    q, lse = _t(2, 16, 4096, 128), torch.empty(2, 16, 4096)
    items = 2 * 16 * (4096 // 128)
    flat = sm90_fwd.GluonLaunch(q, q, q, q, lse, causal=False, **kw).step
    assert flat.grid == (sm90_fwd.sm_count(q.device), 1) and flat.scalars[-3:-1] == (4096 // 128, items)
    tri = sm90_fwd.GluonLaunch(q, q, q, q, lse, causal=True, **kw).step
    assert tri.constexprs["PAIRED"] and tri.scalars[-3:-1] == (4096 // 128, items // 2)
    assert tri.grid == (sm90_fwd.sm_count(q.device), 1)
    with knobs.override(causal_pairs=False):
        own = sm90_fwd.GluonLaunch(q, q, q, q, lse, causal=True, **kw).step
    assert own.grid == (items, 1) and own.scalars[-3:-1] == (4096 // 128, items) and not own.constexprs["PAIRED"]
    few = sm90_fwd.GluonLaunch(q[:1, :1, :300], q[:1, :1, :300], q[:1, :1, :300], q[:1, :1, :300], lse,
                                 causal=False, **dict(kw, seqlen_q=300, seqlen_k=300, batch=1, num_heads_q=1,
                                                      num_heads_kv=1)).step
    assert few.grid == (3, 1)  # fewer items than SMs: one program each


# --------------------------------------------------------------------------- GPU
needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                  reason="needs an sm_90 GPU")

CASES = [
    # B, Hq, Hkv, Sq, Sk, D, causal
    (2, 4, 4, 1000, 1000, 128, False),
    (2, 4, 4, 1000, 1000, 64, True),
    (1, 2, 2, 77, 300, 128, True),
    (1, 2, 2, 300, 77, 128, True),  # rows that see no key
    (1, 2, 2, 1, 1, 128, False),
    (2, 8, 2, 513, 513, 128, True),  # GQA
    (1, 4, 1, 256, 4096, 64, False),  # MQA
    (1, 2, 2, 2500, 2100, 64, False),  # three consumer warpgroups (Sq >= 2048), tails in both
    (2, 6, 3, 2048, 333, 64, False),  # three warpgroups, GQA, fewer keys than one item's rows
]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("head_dim,block_m,causal", [(64, 128, False), (64, 192, False), (128, 128, False),
                                                    (64, 128, True), (128, 128, True), (64, 192, True),
                                                    (64, 64, False), (64, 64, True)])
def test_gluon_persistent_programs_loop_over_many_items(head_dim, block_m, causal):
    """More scheduling units than SMs, and not a multiple of them: each program runs several work
    items, so the Q slots, the K/V rings and their phases carry across items (some programs one unit
    fewer). Causal units pair a heavy row tile with its light mirror (odd tile counts, which leave one
    tile unpaired, are in CASES). GQA, a key tail (1000 keys) and the LSE ride along; the
    output is poisoned first."""
    import flashcore
    from flashcore import ops

    from dataclasses import replace

    B, Hq, Hkv, S = 3, 16, 4, 1000
    tiles = -(-S // block_m)
    units = B * Hq * (-(-tiles // 2) if causal else tiles)
    sms = torch.cuda.get_device_properties(0).multi_processor_count * sm90_fwd.PROGRAMS_PER_SM[block_m // 64]
    assert units > sms and units % sms
    g = torch.Generator(device="cuda").manual_seed(4321 + head_dim + causal)
    q = torch.randn(B, Hq, S, head_dim, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(B, Hkv, S, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    out = torch.full_like(q, float("nan"))
    call = ops.dense_plan(q, k, v, None, None, causal, head_dim ** -0.5, False, False, True, out=out,
                          config=replace(tables.gluon_ws(head_dim), block_m=block_m))
    step = call.main.step
    assert type(call.main).__name__ == "GluonLaunch" and step.grid[0] < units
    assert step.constexprs["NUM_WG"] == block_m // 64 and step.constexprs["PAIRED"] == causal
    _, lse = call(q, k, v, None, None, out)
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=causal, return_lse=True)
    assert rel_err(out, ref) < 1.2e-2
    assert torch.allclose(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
    again = torch.full_like(q, float("nan"))
    call(q, k, v, None, None, again)
    assert torch.equal(out, again)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("B,Hq,Hkv,S,block_m,causal", [(2, 20, 4, 1000, 128, False), (2, 20, 5, 1000, 64, False),
                                                      (3, 7, 7, 3000, 128, True), (2, 20, 4, 1000, 64, True)])
def test_gluon_item_coordinates_step_across_heads_and_batches(B, Hq, Hkv, S, block_m, causal):
    """The consumers step (unit-in-head, batch, head) by the grid size with carries instead of dividing per item
    (perf-notes v15): head counts that are not powers of two, so a step's head part is non-zero and wraps into
    the next batch; causal steps by pairs of row tiles. Every output row must land where the reference puts it."""
    import flashcore
    from flashcore import ops

    from dataclasses import replace

    tiles = -(-S // block_m)
    per_head = -(-tiles // 2) if causal else tiles
    units = B * Hq * per_head
    grid = min(units, torch.cuda.get_device_properties(0).multi_processor_count
               * sm90_fwd.PROGRAMS_PER_SM[block_m // 64])
    assert units > grid and (grid // per_head) % Hq, "the step must have a head part that can wrap"
    g = torch.Generator(device="cuda").manual_seed(99 + S + block_m)
    q = torch.randn(B, Hq, S, 64, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(B, Hkv, S, 64, device="cuda", generator=g).bfloat16() for _ in range(2))
    out = torch.full_like(q, float("nan"))
    call = ops.dense_plan(q, k, v, None, None, causal, 0.125, False, False, True, out=out,
                          config=replace(tables.gluon_ws(64), block_m=block_m))
    assert type(call.main).__name__ == "GluonLaunch" and call.main.step.grid[0] == grid
    _, lse = call(q, k, v, None, None, out)
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=causal, scale=0.125, return_lse=True)
    assert rel_err(out, ref) < 1.2e-2
    assert torch.allclose(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
    # per (batch, head): a misplaced item would put one head's rows in another's place
    err = ((out.double() - ref.double()).flatten(2).norm(dim=2) / ref.double().flatten(2).norm(dim=2))
    assert float(err.max()) < 2e-2


def _check_against_reference(case, dtype, cfg, num_wg):
    """One Gluon launch of ``cfg`` on ``case`` against the float64 reference: output poisoned first, no NaN, rows
    that see no key output zeros and LSE -inf, bitwise repeatable (no atomics)."""
    import flashcore
    from flashcore import ops

    B, Hq, Hkv, Sq, Sk, D, causal = case
    g = torch.Generator(device="cuda").manual_seed((hash(case) + num_wg) % 2**31)
    mk = lambda h, s: torch.randn(B, h, s, D, device="cuda", generator=g).to(dtype)
    q, k, v = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk)
    out = torch.full_like(q, float("nan"))
    call = ops.dense_plan(q, k, v, None, None, causal, D ** -0.5, False, False, True, out=out, config=cfg)
    assert type(call.main).__name__ == "GluonLaunch" and call.main.step.constexprs["NUM_WG"] == num_wg
    _, lse = call(q, k, v, None, None, out)
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=causal, return_lse=True)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < (1.2e-2 if dtype == torch.bfloat16 else 2e-3)
    seen = torch.isfinite(ref_lse)
    assert torch.allclose(lse[seen].double(), ref_lse[seen], atol=2e-3, rtol=1e-4)
    assert bool((lse[~seen] == float("-inf")).all()) and bool((out[~seen] == 0).all())
    again, _ = call(q, k, v, None, None)
    assert torch.equal(out, again)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("case,block_m", [
    ((2, 20, 4, 1000, 1000, 64, False), 128),  # GQA, 2-3 items per program
    ((2, 4, 4, 1000, 1000, 64, True), 128),  # paired causal
    ((1, 2, 2, 300, 77, 64, True), 128),  # one key tile; rows that see no key
    ((1, 2, 2, 2500, 2100, 64, False), 192),  # three warpgroups
    ((2, 6, 3, 1000, 333, 64, False), 64),  # one warpgroup, two programs per SM
])
def test_gluon_entry_loads_and_stagger_change_no_bits(case, block_m, monkeypatch):
    """EARLY_LOADS and STAGGER move when the first loads are requested and when each consumer warpgroup starts,
    not what is computed: each setting gives the same bits as both off, which matches the reference."""
    import flashcore
    from flashcore import ops

    from dataclasses import replace

    B, Hq, Hkv, Sq, Sk, D, causal = case
    g = torch.Generator(device="cuda").manual_seed(hash(case) % 2**31)
    q = torch.randn(B, Hq, Sq, D, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", generator=g).bfloat16() for _ in range(2))
    cfg = replace(tables.gluon_ws(D, Sq, causal), block_m=block_m)
    results = {}
    # (STAGGER 2, an A/B setting only, is checked by gluon_ab's correctness checks; each setting here compiles
    # five kernels, and gpu_check runs this file within one device call)
    for early, stagger in ((False, 0), (True, 0), (True, 1)):
        out = torch.full_like(q, float("nan"))
        with knobs.override(early_loads=early, stagger=stagger):
            call = ops.dense_plan(q, k, v, None, None, causal, D ** -0.5, False, False, True, out=out, config=cfg)
        ce = call.main.step.constexprs
        assert (ce["EARLY_LOADS"], ce["STAGGER"], ce["NUM_WG"]) == (early, stagger, block_m // 64)  # D=64
        _, lse = call(q, k, v, None, None, out)
        results[early, stagger] = (out, lse)
    out, lse = results[False, 0]
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=causal, return_lse=True)
    assert not torch.isnan(out).any() and rel_err(out, ref) < 1.2e-2
    seen = torch.isfinite(ref_lse)
    assert torch.allclose(lse[seen].double(), ref_lse[seen], atol=2e-3, rtol=1e-4)
    for key, (o, l) in results.items():
        assert torch.equal(o, out) and torch.equal(l, lse), key


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_gluon_matches_reference(case, dtype):
    B, Hq, Hkv, Sq, Sk, D, causal = case
    cfg = tables.gluon_ws(D, Sq, causal)
    _check_against_reference(case, dtype, cfg, cfg.block_m // 64)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [
    (2, 4, 4, 1000, 1000, 64, True), (1, 2, 2, 77, 300, 64, True), (1, 2, 2, 300, 77, 64, True),
    (1, 2, 2, 1, 1, 64, False), (2, 8, 2, 513, 513, 64, True), (1, 4, 1, 256, 4096, 64, False),
    (2, 6, 3, 2048, 333, 64, False), (1, 3, 3, 65, 129, 64, False)])
def test_gluon_one_warpgroup_matches_reference(case, dtype):
    """The one-consumer-warpgroup layout (two programs per SM) on the edge cases of CASES at D=64: odd
    lengths, causal with Sq < Sk and Sq > Sk (rows that see no key), GQA/MQA, one row."""
    _check_against_reference(case, dtype, tables.gluon_one_wg(), 1)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_k_ring_deeper_than_v_ring(causal):
    """D=128 with 3 K stages leaves room for only 1 V stage: the two rings then wrap at different
    tiles (their phases differ), over enough tiles (1000 keys = 8) to wrap both several times."""
    from dataclasses import replace

    import flashcore
    from flashcore import ops

    cfg = replace(tables.gluon_ws(128), num_stages=3)
    assert tables.v_stages(3, 128, 128, 128) == 1
    g = torch.Generator(device="cuda").manual_seed(24)
    q, k, v = (torch.randn(2, 4, 1000, 128, device="cuda", generator=g).bfloat16() for _ in range(3))
    call = ops.dense_plan(q, k, v, None, None, causal, 128 ** -0.5, False, False, False, config=cfg)
    assert type(call.main).__name__ == "GluonLaunch"
    out, _ = call(q, k, v, None, None)
    assert rel_err(out, flashcore.reference.attention(q, k, v, causal=causal)) < 1.2e-2


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("layout", ["bshd", "strided"])
def test_gluon_layouts_and_auto_dispatch(layout):
    import flashcore

    B, H, S, D = 2, 16, 2048, 128  # large enough that auto picks the Gluon kernel
    g = torch.Generator(device="cuda").manual_seed(7)
    if layout == "bshd":
        q, k, v = (torch.randn(B, S, H, D, device="cuda", generator=g).bfloat16() for _ in range(3))
    else:
        big = torch.randn(B, S, 3 * H, D, device="cuda", generator=g).bfloat16()
        q, k, v = (big[:, :, i * H:(i + 1) * H].transpose(1, 2) for i in range(3))
    lay = "bshd" if layout == "bshd" else "bhsd"
    assert flashcore.plan_attention(q, k, v, causal=True, layout=lay).selection.kernel == "sm90_fwd"
    out = flashcore.attention(q, k, v, causal=True, layout=lay)
    ref = flashcore.reference.attention(q, k, v, causal=True, layout="bshd" if layout == "bshd" else "bhsd")
    assert rel_err(out, ref) < 1.2e-2


@pytest.mark.gpu
@needs_hopper
def test_misaligned_strides_fall_back_to_triton():
    import flashcore

    g = torch.Generator(device="cuda").manual_seed(8)
    # head dim 128 inside rows of 129 elements: not 16-byte aligned, so no TMA
    q, k, v = (torch.randn(2, 16, 2048, 129, device="cuda", generator=g).bfloat16()[..., :128] for _ in range(3))
    # the table asks for the Gluon kernel at this size; only the strides rule it out
    assert select.table_config((9, 0), head_dim=128, dtype_bytes=2, causal=False, secure=False, seqlen_q=2048,
                          seqlen_k=2048, batch_heads=32).kernel == "gluon_ws"
    sel = flashcore.plan_attention(q, k, v).selection
    assert sel.kernel == "triton_fwd" and "copy engine" in dict(sel.rejected)["sm90_fwd"]
    out = flashcore.attention(q, k, v)
    assert rel_err(out, flashcore.reference.attention(q, k, v)) < 1.2e-2


@pytest.mark.parametrize("with_key_weights", [False, True])
def test_descriptor_fast_path_calls_the_raw_launcher_as_tritons_own_launch_does(monkeypatch, with_key_weights):
    """The encoded-descriptor cache launches through the raw launcher behind Triton's descriptor-expanding wrapper.
    On this Triton (every supported version has one of the wrapper shapes runtime.tma knows), the raw launcher must
    be found, and our call must hand it exactly the arguments that Triton's own launch path does: Triton's
    CudaLauncher.__call__, run here with its wrapper around a recording launcher (the encoder stubbed: the real one
    needs a GPU), once with the absent key-weight descriptor (a constexpr slot) and once with five descriptors.
    Refused where scratch memory, a sanitizer or another wrapper shape would make the shortcut wrong."""
    from types import SimpleNamespace

    import triton
    import triton.backends.nvidia.driver as driver
    from triton.backends.nvidia.driver import CudaLauncher, wrap_handle_tensordesc

    from flashcore.runtime.tma import RawLauncher, unwrap_tensordesc_launcher

    calls = []
    raw = lambda *args: calls.append(args)  # noqa: E731
    monkeypatch.setattr(driver, "make_tensordesc_arg", lambda d, m, *_: [f"map:{d}", f"shape:{d}", f"strides:{d}"])
    if hasattr(triton.runtime.driver, "_active"):  # 3.8 on read the active driver in __call__ (no GPU here)
        monkeypatch.setattr(triton.runtime.driver, "_active", SimpleNamespace())
    n = 5 if with_key_weights else 4
    sig = {f"{x}_desc": f"tensordesc<bf16[1, 1, 64, 128]>" for x in "qkvo"}
    sig["w_desc"] = "tensordesc<bf16[1, 1, 128, 1]>" if with_key_weights else "constexpr"
    sig.update(lse_ptr="*fp32", seqlens_q_ptr="*i32", qk_scale="fp32", BLOCK_M="constexpr")
    meta = [{"swizzle": 3, "elem_size": 2, "elem_type": "bf16", "block_size": [1, 1, 64, 128], "fp4_padded": False}] * n
    run = SimpleNamespace(launch=wrap_handle_tensordesc(raw, sig, meta), global_scratch_size=0, global_scratch_align=1,
                          profile_scratch_size=0, profile_scratch_align=1, num_ctas=1, launch_cooperative_grid=False,
                          launch_pdl=False, arg_annotations="annotations", kernel_signature="signature",
                          gsan_enabled=False)
    compiled = SimpleNamespace(run=run, function="function", packed_metadata="packed")
    found = unwrap_tensordesc_launcher(compiled, sm90_fwd.DESC_ARGS)
    assert isinstance(found, RawLauncher), f"no raw-launcher shortcut on triton {triton.__version__}"

    descs = ["q", "k", "v", "o"] + (["w"] if with_key_weights else [None])
    rest = ("lse", "seqlens", 0.5, 64)  # pointers, the scalar, the constexpr's slot (step.tail)
    CudaLauncher.__call__(run, 132, 1, 1, "stream", "function", "packed", None, None, None, *descs, *rest)
    enc = found.encode(descs[:n], sm90_fwd.DESC_ARGS)
    found((132, 1), "stream", compiled, (*enc, *rest))
    same = lambda c: tuple(list(x) if isinstance(x, (list, tuple)) else x for x in c)  # noqa: E731 (a sequence)
    assert len(calls) == 2 and same(calls[1]) == same(calls[0]), calls

    for bad in (dict(global_scratch_size=256), dict(profile_scratch_size=64), dict(launch=raw), dict(gsan_enabled=True)):
        run2 = SimpleNamespace(**{**vars(run), **bad})
        assert unwrap_tensordesc_launcher(SimpleNamespace(run=run2), sm90_fwd.DESC_ARGS) is None, bad
    wrong_sig = dict(sig, q_desc="*bf16")  # three or four descriptors, not first: not this kernel's wrapper
    run3 = SimpleNamespace(**{**vars(run), "launch": wrap_handle_tensordesc(raw, wrong_sig, meta[:n - 1])})
    assert unwrap_tensordesc_launcher(SimpleNamespace(run=run3), sm90_fwd.DESC_ARGS) is None


@pytest.mark.gpu
@needs_hopper
def test_gluon_encoded_descriptors_follow_the_pointers():
    """One plan, several buffer sets, revisited out of order and more sets than the cache keeps: each
    call must read its own q/k/v and write its own (poisoned) output, so a descriptor encoded for one
    pointer set is never used for another."""
    import flashcore
    from flashcore import ops

    g = torch.Generator(device="cuda").manual_seed(77)
    mk = lambda: torch.randn(2, 4, 300, 128, device="cuda", generator=g).bfloat16()  # noqa: E731
    sets = [(mk(), mk(), mk()) for _ in range(sm90_fwd.ENCODED_SETS + 2)]
    q0, k0, v0 = sets[0]
    call = ops.dense_plan(q0, k0, v0, None, None, False, 128 ** -0.5, False, False, False,
                          config=tables.gluon_ws(128))
    launch = call.main
    assert type(launch).__name__ == "GluonLaunch"
    order = list(range(len(sets))) + [3, 0, len(sets) - 1, 3]
    for i in order:
        q, k, v = sets[i]
        out = torch.full_like(q, float("nan"))
        call(q, k, v, None, None, out)
        assert rel_err(out, flashcore.reference.attention(q, k, v)) < 1.2e-2, i
    assert launch.fast, "the raw-launcher fast path was not taken on this Triton"
    assert 0 < len(launch.encoded) <= sm90_fwd.ENCODED_SETS

    # a registered launch hook (a profiler's) still sees every launch: those go through Triton's path
    from triton import knobs

    seen = []
    hook = lambda meta: seen.append(meta.get()["name"])  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        q, k, v = sets[1]
        out = torch.full_like(q, float("nan"))
        call(q, k, v, None, None, out)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert seen == ["attn_fwd_hopper_kernel"]
    assert rel_err(out, flashcore.reference.attention(q, k, v)) < 1.2e-2


def test_launch_hooks_count_only_when_registered():
    from triton import knobs
    from flashcore.runtime import launch_hooks_active

    assert not launch_hooks_active()  # Triton's empty hook chains are no hooks
    hook = lambda meta: None  # noqa: E731
    knobs.runtime.launch_exit_hook.add(hook)
    try:
        assert launch_hooks_active()
    finally:
        knobs.runtime.launch_exit_hook.remove(hook)
    assert not launch_hooks_active()


@pytest.fixture
def force_gluon(monkeypatch):
    """Route every eligible fast call to the Gluon kernel, whatever its size (the knob is part of every plan
    key: no cache to clear). Yields the plans that existed before, so _gluon_planned looks at new ones only."""
    from flashcore.plan.cache import PLANS

    monkeypatch.setenv(knobs.HOPPER_KERNEL_ENV, "gluon_ws")
    _EARLIER[:] = [id(p) for p in PLANS.plans()]
    yield


_EARLIER: list = []


def _gluon_planned():
    """Whether a plan made since force_gluon started runs the Gluon kernel."""
    from flashcore.plan.cache import PLANS

    return any(p.selection.kernel == "sm90_fwd" for p in PLANS.plans() if id(p) not in _EARLIER)


@pytest.mark.gpu
@needs_hopper
def test_gluon_cuda_graph_capture_and_replay(force_gluon):
    import flashcore

    g = torch.Generator(device="cuda").manual_seed(21)
    q, k, v = (torch.randn(1, 8, 640, 128, device="cuda", generator=g).bfloat16() for _ in range(3))
    flashcore.attention(q, k, v, causal=True)  # warm-up: compile and plan outside the graph
    assert _gluon_planned()
    graph, out = capture_cuda_graph(lambda: flashcore.attention(q, k, v, causal=True))
    q2, k2, v2 = (torch.randn(1, 8, 640, 128, device="cuda", generator=g).bfloat16() for _ in range(3))
    q.copy_(q2); k.copy_(k2); v.copy_(v2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, flashcore.attention(q2, k2, v2, causal=True))
    assert rel_err(out, flashcore.reference.attention(q2, k2, v2, causal=True)) < 1.2e-2


@pytest.mark.gpu
@needs_hopper
def test_gluon_under_torch_compile(force_gluon):
    import flashcore

    g = torch.Generator(device="cuda").manual_seed(22)
    q, k, v = (torch.randn(2, 4, 384, 64, device="cuda", generator=g).half() for _ in range(3))

    @torch.compile(fullgraph=True)
    def f(q, k, v):
        return flashcore.attention(q * 1.0, k, v, causal=True) + 1

    out = f(q, k, v)
    assert _gluon_planned()
    assert rel_err(out, flashcore.reference.attention(q, k, v, causal=True) + 1) < 2e-3


@pytest.mark.gpu
@needs_hopper
def test_forced_gluon_still_runs_varlen_and_secure_on_triton(force_gluon, monkeypatch):
    """The fast path's knob forces neither varlen (no Gluon form) nor secure mode (its own knob) onto the
    Gluon kernel."""
    import flashcore

    monkeypatch.setenv(knobs.SECURE_KERNEL_ENV, "triton")

    g = torch.Generator(device="cuda").manual_seed(23)
    lens = [300, 0, 1000]
    cu = torch.tensor([0, 300, 300, 1300], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(1300, 8, 128, device="cuda", generator=g).bfloat16() for _ in range(3))
    out = flashcore.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    ref = flashcore.reference.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert rel_err(out, ref) < 1.2e-2
    qs, ks, vs = (torch.randn(2, 8, 512, 128, device="cuda", generator=g).bfloat16() for _ in range(3))
    sl = torch.tensor([512, 100], dtype=torch.int32, device="cuda")
    out = flashcore.attention(qs, ks, vs, secure=True, seqlens_k=sl)
    assert rel_err(out, flashcore.reference.attention(qs, ks, vs, seqlens_k=sl)) < 1.2e-2
    assert not _gluon_planned()


def test_register_cap_reaches_the_compiler(monkeypatch):
    """Config.maxnreg (used by the sweeps) is a compile option of the Triton launch, dropped under the
    interpreter (which has no registers), and part of the SASS audit's compile spec."""
    from flashcore.audit.specs import _spec_from_launch
    from flashcore.kernels.triton.fwd import attn_fwd_kernel
    from flashcore.launch.triton_fwd import build_launch, compile_options
    from flashcore.plan.tables import Config

    capped = Config(128, 128, 8, 2, maxnreg=128)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert compile_options(capped) == {"maxnreg": 128}
    assert compile_options(Config(128, 64, 8, 3)) == {}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert compile_options(capped) == {}
    q = torch.empty(2, 4, 256, 64, dtype=torch.bfloat16)
    _, _, args, ce = build_launch(
        q, q, q, q, None, seqlens_q=None, seqlens_k=None, cu_seqlens_q=None, cu_seqlens_k=None, scale=0.125,
        causal=False, secure=False, secure_public_diag=False, seqlen_q=256, seqlen_k=256, batch=2, num_heads_q=4,
        num_heads_kv=4, q_strides=q.stride()[:3], k_strides=q.stride()[:3], v_strides=q.stride()[:3],
        o_strides=q.stride()[:3], lse_strides=(4 * 256, 256), config=capped)
    assert _spec_from_launch("x", capped, args, ce, set(), fn=attn_fwd_kernel)["maxnreg"] == 128


def test_one_consumer_warpgroup_shares_the_sm_with_a_second_program():
    """block_m=64 (D=64): one 64-row consumer warpgroup per program, two programs resident per SM, so the
    registers (8 warps x 128 at launch), the shared memory (Q and rings) and the grid are sized for two."""
    from conftest import gluon_sass

    kw = dict(scale=0.1, causal=False, seqlen_q=1024, seqlen_k=1024, batch=1, num_heads_q=16, num_heads_kv=16,
              lse_strides=(16 * 1024, 1024))
    q, lse = _t(1, 16, 1024, 64), torch.empty(1, 16, 1024)
    one = sm90_fwd.GluonLaunch(q, q, q, q, lse, cfg=tables.Config(64, 128, 4, 3, kernel="gluon_ws"), **kw).step
    assert one.constexprs["NUM_WG"] == 1 and one.options["maxnreg"] == sm90_fwd.MAXNREG_1WG
    assert 2 * 8 * 32 * sm90_fwd.MAXNREG_1WG <= 65536  # two programs' registers at launch
    assert 128 * sm90_fwd.CONSUMER_REGS_1WG + 128 * sm90_fwd.LOADER_REGS <= 256 * sm90_fwd.MAXNREG_1WG
    items = 16 * 1024 // 64
    assert one.grid == (min(items, 2 * sm90_fwd.sm_count(q.device)), 1) and one.scalars[-3:-1] == (16, items)
    big = sm90_fwd.GluonLaunch(*(_t(4, 16, 4096, 64), ) * 4, torch.empty(4, 16, 4096), cfg=tables.Config(
        64, 128, 4, 3, kernel="gluon_ws"), **dict(kw, seqlen_q=4096, seqlen_k=4096, batch=4,
                                                  lse_strides=(16 * 4096, 4096))).step
    assert big.grid == (2 * sm90_fwd.sm_count(q.device), 1)  # persistent, two per SM
    assert tables.v_stages(3, 64, 128, 64) == 3
    assert tables.smem_bytes(3, 3, 64, 128, 64) <= tables.RING_BYTES_HALF_SM
    assert 2 * (tables.RING_BYTES_HALF_SM + 512 + 1024) <= 228 * 1024  # + barriers, + per-block reserve
    assert tables.v_stages(4, 64, 128, 64) == 2  # a fourth K stage leaves room for two V stages only
    sass = gluon_sass(64, False, block_m=64)
    assert "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8" in sass  # the consumer's 232 registers
