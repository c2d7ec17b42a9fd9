"""The secure (constant-time) mode on the warp-specialised Gluon kernel (kernels/sm90/fwd.py,
``attn_fwd_hopper_kernel`` with ``SECURE``; secure mode's kernel on Hopper): dispatch and the machine code on the CPU;
the secure contract against float64 on the GPU."""
import warnings
from dataclasses import replace

import pytest
import torch

import flashcore
from conftest import rel_err
from flashcore.launch import sm90_fwd
from flashcore.plan import knobs, select, tables

H100 = (9, 0)


def _facts(D=128, causal=False, S=4096, bh=64, dtype_bytes=2):
    return dict(head_dim=D, dtype_bytes=dtype_bytes, causal=causal, secure=True, seqlen_q=S, seqlen_k=S,
                batch_heads=bh)


def test_secure_mode_runs_the_gluon_kernel_where_it_can(monkeypatch):
    """On Hopper, secure mode takes the Gluon kernel in secure form (the fast path's configuration) for
    16-bit inputs at D=64/128 from the fast path's size thresholds, causal D=64 included; the Triton
    kernel otherwise. FLASHCORE_SECURE_KERNEL forces either."""
    for var in (knobs.SECURE_KERNEL_ENV, knobs.SECURE_V_ZEROING_ENV):
        monkeypatch.delenv(var, raising=False)
    for d, causal, S in ((128, False, 4096), (64, False, 4096), (128, True, 4096), (64, True, 4096),
                         (64, False, 1024)):
        cfg = select.table_config(H100, **_facts(d, causal, S))
        fast = tables.gluon_ws(d, S, causal)
        two_wg = fast.block_m == 192 and tables.triton_minor() in tables.SECURE_D64_TWO_WG
        assert cfg == tables.gluon_secure(d, S, causal) == (replace(fast, block_m=128) if two_wg else fast)
    assert select.table_config(H100, **_facts(128, False, 64, bh=1)).kernel == "triton"  # below the size threshold
    assert select.table_config(H100, **_facts(128, False, dtype_bytes=4)).kernel == "triton"
    assert select.table_config(H100, **_facts(96, False)).kernel == "triton"
    assert select.table_config((8, 0), **_facts(128, False)).kernel == "triton"
    monkeypatch.setenv(knobs.SECURE_KERNEL_ENV, "triton")
    assert select.table_config(H100, **_facts(128)).kernel == "triton"
    monkeypatch.setenv(knobs.SECURE_KERNEL_ENV, "gluon_ws")
    assert select.table_config(H100, **_facts(128, False, 64, bh=1)) == tables.gluon_secure(128, 64, False)
    monkeypatch.setenv(knobs.SECURE_V_ZEROING_ENV, "in_loop")  # the Gluon kernel has no in-loop select
    cfg = select.table_config(H100, **_facts(128))
    assert cfg.kernel == "triton" and not cfg.v_prepass
    monkeypatch.setenv(knobs.SECURE_KERNEL_ENV, "nope")
    with pytest.raises(ValueError, match=knobs.SECURE_KERNEL_ENV):
        select.table_config(H100, **_facts(128))


@pytest.mark.parametrize("minor", ["3.6", "3.8", "3.9"])
def test_secure_d64_layout_follows_the_toolchain(monkeypatch, minor):
    """Secure D=64 non-causal from 2048 query rows: three consumer warpgroups, as the fast path, except under a
    toolchain that serialises that form's wgmmas (tables.SECURE_D64_TWO_WG: Triton 3.9), where two ran faster."""
    monkeypatch.setattr(tables, "triton_minor", lambda: minor)
    cfg = select.table_config(H100, **_facts(64, False, 4096))
    assert cfg.kernel == "gluon_ws" and cfg.block_m == (128 if minor == "3.9" else 192)
    assert cfg.num_stages == tables.gluon_ws(64, 4096, False).num_stages
    assert tables.gluon_ws(64, 4096, False).block_m == 192  # the fast path keeps three everywhere
    for causal, S in ((True, 4096), (False, 1024)):  # layouts of two consumer warpgroups anyway: unchanged
        assert select.table_config(H100, **_facts(64, causal, S)) == tables.gluon_ws(64, S, causal)


def test_secure_launch_passes_the_lengths_key_weights_and_the_fast_register_split():
    q = torch.empty(2, 4, 500, 128, dtype=torch.bfloat16)
    kw = dict(scale=0.1, seqlen_q=500, seqlen_k=500, batch=2, num_heads_q=4, num_heads_kv=4,
              lse_strides=(4 * 500, 500), secure=True)
    for causal in (False, True):
        launch = sm90_fwd.GluonLaunch(q, q, q, q, None, cfg=tables.gluon_secure(128, 500, causal), causal=causal, **kw)
        step = launch.step
        # the per-call pointers: five descriptors, lse, the lengths, the page table, the key lengths (in-kernel padding)
        assert step.constexprs["SECURE"] and step.n_ptrs == sm90_fwd.PER_CALL_ARGS == 9
        assert not step.constexprs["SANITISE"]  # (not asked for)
        assert (step.constexprs["CONSUMER_WG_REGS"], step.constexprs["LOADER_WG_REGS"]) == (
            sm90_fwd.CONSUMER_REGS, sm90_fwd.LOADER_REGS)
        # non-causal: the row sums come from the pre-pass's key weights, [B, 8, Sk rounded up to 8]
        assert launch.key_weights_shape == (None if causal else (2, 8, 504))
        descs = launch.descriptors(q, q, q, q, torch.empty(2, 8, 504, dtype=q.dtype) if not causal else None)
        assert len(descs) == 5 and (descs[4] is None) == causal
        if not causal:
            assert descs[4].block_shape == [1, 8, 128]


def _sm90_plan(monkeypatch, B, H, S, D, causal, secure=True):
    """ops.dense_plan for CPU tensors as on an sm_90 GPU (the architecture forced, as tests/plan_digests.py does)."""
    from flashcore import ops, problem

    monkeypatch.setattr(problem, "device_arch", lambda device: (9, 0))
    monkeypatch.delenv(knobs.SECURE_KERNEL_ENV, raising=False)
    monkeypatch.delenv(knobs.SECURE_PAD_ENV, raising=False)
    q = torch.empty(B, H, S, D, dtype=torch.bfloat16)
    lens = torch.full((B,), S, dtype=torch.int32)
    return ops.dense_plan(q, q, q, None, lens, causal, D ** -0.5, False, secure, False)


def test_small_causal_secure_problems_write_v_padding_in_the_kernel(monkeypatch):
    """Secure causal attention on the Gluon kernel below B*Hq*Sq*Sk = 2^28 runs no V pre-pass: the loader warpgroup
    writes V's padding rows (SANITISE, reading the key lengths). From 2^28 on, non-causal (its K/V pre-pass) and
    secure="strict" keep the pre-passes; the secure_in_kernel_padding switch forces either way (perf-notes v34)."""
    from flashcore.launch.secure_prepass import SecurePrepass

    def form(plan):
        main = plan.main
        assert isinstance(main, sm90_fwd.GluonLaunch) and main.step.constexprs["SECURE"]
        return main.step.constexprs["SANITISE"], plan.prepass

    for B, H, S, D in ((1, 16, 1024, 64), (4, 16, 1024, 64), (2, 16, 2048, 128), (1, 8, 1000, 128)):
        assert B * H * S * S < tables.SECURE_IN_KERNEL_PADDING_WORK
        sanitise, prepass = form(_sm90_plan(monkeypatch, B, H, S, D, True))
        assert sanitise and prepass is None, (B, H, S, D)
        launch = _sm90_plan(monkeypatch, B, H, S, D, True).main
        one_wg = launch.step.constexprs["NUM_WG"] == 1
        assert launch.step.constexprs["LOADER_WG_REGS"] == sm90_fwd.LOADER_REGS_SANITISE[1 if one_wg else 2]
    for B, H, S, D in ((16, 16, 2048, 64), (4, 32, 4096, 128)):  # large causal: the V pre-pass
        sanitise, prepass = form(_sm90_plan(monkeypatch, B, H, S, D, True))
        assert not sanitise and isinstance(prepass, SecurePrepass) and prepass.key_weights_shape is None
    sanitise, prepass = form(_sm90_plan(monkeypatch, 1, 16, 1024, 64, False))  # non-causal: the K/V pre-pass
    assert not sanitise and prepass.key_weights_shape is not None
    with knobs.override(secure_in_kernel_padding="off"):
        sanitise, prepass = form(_sm90_plan(monkeypatch, 1, 16, 1024, 64, True))
        assert not sanitise and prepass is not None
    with knobs.override(secure_in_kernel_padding="on"):
        sanitise, prepass = form(_sm90_plan(monkeypatch, 16, 16, 2048, 64, True))
        assert sanitise and prepass is None
        assert not form(_sm90_plan(monkeypatch, 1, 16, 1024, 64, False))[0]  # (no in-kernel non-causal form)
    with knobs.override(secure_in_kernel_padding="sometimes"):
        with pytest.raises(ValueError, match="secure_in_kernel_padding"):
            _sm90_plan(monkeypatch, 1, 16, 1024, 64, True)
    monkeypatch.setenv(knobs.SECURE_PAD_ENV, "fill_k")  # the strict form's V stand-ins: pre-passes
    from flashcore import ops

    q = torch.empty(1, 16, 1024, 64, dtype=torch.bfloat16)
    plan = ops.dense_plan(q, q, q, None, torch.full((1,), 1024, dtype=torch.int32), True, 0.125, False, True, False)
    assert not plan.main.step.constexprs["SANITISE"] and plan.prepass is not None and plan.fill_k is not None


def test_secure_kernel_is_a_programmatic_dependent_of_its_pre_pass(monkeypatch):
    """Where a pre-pass runs right before the secure Gluon kernel (non-causal: K/V and key weights; causal: V;
    secure="strict" causal: the row fill of V) and the problem is below tables.SECURE_PDL_WORK (B*Hq*Sq*Sk), the
    kernel is launched as its programmatic dependent (launch_pdl, PDL_WAIT) and the K/V pre-passes let it launch as
    they start (PDL_TRIGGER); larger problems launch it after the pre-pass completes; the in-kernel padding form has
    no pre-pass and no dependent launch; the secure_pdl switch forces either way (perf-notes v44)."""
    from flashcore import ops

    def pdl(plan):
        main, pre = plan.main, plan.prepass
        assert isinstance(main, sm90_fwd.GluonLaunch) and main.step.constexprs["SECURE"] == bool(plan.problem.secure)
        waits = main.step.constexprs["PDL_WAIT"]
        assert waits == main.step.options.get("launch_pdl", False)
        trigger = pre.step.constexprs.get("PDL_TRIGGER", False) if pre is not None else None
        return waits, trigger

    assert 1 * 16 * 1024 * 1024 < tables.SECURE_PDL_WORK <= 16 * 16 * 2048 * 2048
    assert pdl(_sm90_plan(monkeypatch, 1, 16, 1024, 64, False)) == (True, True)  # the K/V pre-pass
    assert pdl(_sm90_plan(monkeypatch, 1, 8, 512, 64, False)) == (True, True)
    assert pdl(_sm90_plan(monkeypatch, 4, 16, 1024, 128, False)) == (True, True)
    assert pdl(_sm90_plan(monkeypatch, 16, 16, 2048, 64, False)) == (False, False)  # large: after the pre-pass
    assert pdl(_sm90_plan(monkeypatch, 16, 16, 2048, 64, True)) == (False, False)  # (the V pre-pass)
    assert pdl(_sm90_plan(monkeypatch, 1, 16, 1024, 64, True)) == (False, None)  # in-kernel padding: no pre-pass
    assert pdl(_sm90_plan(monkeypatch, 1, 16, 1024, 64, False, secure=False)) == (False, None)  # the fast path
    with knobs.override(secure_pdl="off"):
        assert pdl(_sm90_plan(monkeypatch, 1, 16, 1024, 64, False)) == (False, False)
    with knobs.override(secure_pdl="on"):
        assert pdl(_sm90_plan(monkeypatch, 16, 16, 2048, 64, True)) == (True, True)
        assert pdl(_sm90_plan(monkeypatch, 16, 16, 2048, 64, False)) == (True, True)
        assert pdl(_sm90_plan(monkeypatch, 1, 16, 1024, 64, True)) == (False, None)
    with knobs.override(secure_pdl="sometimes"):
        with pytest.raises(ValueError, match="secure_pdl"):
            _sm90_plan(monkeypatch, 1, 16, 1024, 64, False)
    q = torch.empty(1, 16, 1024, 64, dtype=torch.bfloat16)
    lens = torch.full((1,), 1024, dtype=torch.int32)
    strict = ops.dense_plan(q, q, q, None, lens, True, 0.125, False, "strict", False)  # (the arch as forced above)
    # the row fill of V before it has no trigger: the kernel launches as the fill completes
    assert pdl(strict)[0] and "PDL_TRIGGER" not in strict.prepass.step.constexprs
    kw = dict(scale=0.1, seqlen_q=500, seqlen_k=500, batch=2, num_heads_q=4, num_heads_kv=4, lse_strides=(2000, 500),
              cfg=tables.gluon_ws(128, 4096, False), pdl_wait=True)
    q = torch.empty(2, 4, 500, 128, dtype=torch.bfloat16)
    for bad in (dict(causal=False, secure=False), dict(causal=True, secure=True, sanitise=True),
                dict(causal=False, secure=True, key_lens=True)):
        with pytest.raises(ValueError, match="pdl_wait"):
            sm90_fwd.GluonLaunch(q, q, q, q, None, **bad, **kw)


def test_secure_kernel_waits_for_its_pre_pass_before_reading_k_and_v():
    """sm_90a SASS (no GPU): the secure kernel waits for the prior grid (griddepcontrol.wait: ACQBULK) once, after
    its first copy (Q) and before the next (K); the fast kernel never waits; the pre-passes launch their dependent
    (PREEXIT) before their first global load."""
    from conftest import gluon_sass
    from flashcore.audit.sass import compile_cubin, disassemble
    from flashcore.audit.specs import audit_specs

    def opcodes(sass):
        return [ln.split(";")[0].split("*/")[-1].split()[0] for ln in sass.splitlines() if "*/" in ln and ";" in ln]

    # (the audit's shape, B*Hq*Sq*Sk = 2^28, launches after its pre-pass unless the switch says otherwise; three
    # consumer warpgroups: three Q copies first)
    secure = opcodes(gluon_sass(64, False, secure=True, attrs={"secure_pdl": "on"}))
    assert secure.count("ACQBULK") == 1
    copies = [i for i, op in enumerate(secure) if op.startswith("UTMALDG")]
    before = sum(i < secure.index("ACQBULK") for i in copies)
    assert before == tables.gluon_secure(64, 4096, False).block_m // 64 and len(copies) > before
    assert "ACQBULK" not in opcodes(gluon_sass(64, False))
    assert "ACQBULK" not in opcodes(gluon_sass(64, False, secure=True, attrs={"secure_pdl": "off"}))
    names = ("secure_prepass_kv_bf16_d64_s4096_hkv8", "secure_prepass_kv_bf16_d64_s4096_hkv8_pdl",
             "secure_prepass_bf16_d64_s4096_hkv8_pdl", "secure_prepass_bf16_d64_s4096_hkv8")
    specs = [s for s in audit_specs(True) if s["name"] in names]
    assert len(specs) == 4
    for spec in specs:
        c = compile_cubin(spec["fn"], spec["signature"], spec["constexprs"], num_warps=spec["num_warps"],
                          num_stages=spec["num_stages"], attrs=spec["attrs"])
        ops = opcodes(disassemble(c.cubin))
        if not spec["name"].endswith("_pdl"):  # launched before a kernel that is no dependent
            assert "PREEXIT" not in ops, spec["name"]
        else:
            loads = [i for i, op in enumerate(ops) if op.startswith("LDG")]
            assert ops.count("PREEXIT") == 1 and loads and ops.index("PREEXIT") < loads[0], spec["name"]


def test_in_kernel_padding_launch_checks_its_form():
    """GluonLaunch(sanitise=True) takes the dense secure causal form only, and passes the key lengths pointer."""
    q = torch.empty(2, 4, 500, 64, dtype=torch.bfloat16)
    kw = dict(scale=0.1, seqlen_q=500, seqlen_k=500, batch=2, num_heads_q=4, num_heads_kv=4, lse_strides=(2000, 500),
              cfg=tables.gluon_one_wg(), sanitise=True)
    launch = sm90_fwd.GluonLaunch(q, q, q, q, None, causal=True, secure=True, **kw)
    assert launch.step.constexprs["SANITISE"] and launch.key_weights_shape is None
    for bad in (dict(causal=True, secure=False), dict(causal=False, secure=True),
                dict(causal=True, secure=True, key_lens=True)):
        with pytest.raises(ValueError, match="sanitise"):
            sm90_fwd.GluonLaunch(q, q, q, q, None, **bad, **kw)


def test_secret_diagonal_runs_the_gluon_kernel(monkeypatch):
    """Secure causal attention with explicit query lengths (a secret diagonal) plans the Gluon kernel's SECRET_DIAG
    form on Hopper (the Triton kernel before v36, 0.42x of fast at 3x6x1536x128): the table's causal configuration,
    the non-causal schedule and trip counts (CAUSAL off: every key tile), no key weights, the key lengths pointer
    passed, V's padding by the loader or the V pre-pass as for the public diagonal. The self-attention form keeps the
    public diagonal; views the copy engine cannot address keep the Triton kernel."""
    from flashcore import ops, problem
    from flashcore.launch.secure_prepass import SecurePrepass

    monkeypatch.setattr(problem, "device_arch", lambda device: (9, 0))
    for var in (knobs.SECURE_KERNEL_ENV, knobs.SECURE_PAD_ENV, knobs.SECURE_V_ZEROING_ENV):
        monkeypatch.delenv(var, raising=False)
    # (V's padding: the loader's with one consumer warpgroup, the V pre-pass with two: tables.secure_padding_in_kernel;
    # the layout: the non-causal work's one-warpgroup range, two warpgroups above it; 1x8x512x64 ran the Triton kernel
    # before v36.1, 2x16x1000x3000x64 one warpgroup)
    for B, H, Sq, Sk, D, in_kernel, num_wg in ((3, 6, 1536, 1536, 128, False, 2), (4, 32, 4096, 4096, 128, False, 2),
                                               (2, 16, 1000, 3000, 64, False, 2), (1, 16, 1024, 1024, 64, True, 1),
                                               (1, 8, 512, 512, 64, True, 1)):
        q, k = torch.empty(B, H, Sq, D, dtype=torch.bfloat16), torch.empty(B, H, Sk, D, dtype=torch.bfloat16)
        lq, lk = torch.full((B,), Sq, dtype=torch.int32), torch.full((B,), Sk, dtype=torch.int32)
        plan = ops.dense_plan(q, k, k, lq, lk, True, D ** -0.5, False, True, False)
        assert plan.selection.kernel == "sm90_fwd", plan.selection.explain()
        assert plan.problem.secret_diagonal and not plan.problem.public_diagonal
        step = plan.main.step
        ce = step.constexprs
        assert ce["SECURE"] and ce["SECRET_DIAG"] and not ce["CAUSAL"] and not ce["PAIRED"] and not ce["SUM_MMA"]
        assert plan.main.key_weights_shape is None
        assert step.grid[0] <= sm90_fwd.PROGRAMS_PER_SM[ce["NUM_WG"]] * 132  # persistent, as non-causal
        cfg = tables.hopper(D, 2, True, True, Sq, Sk, B * H, secret_diagonal=True)
        assert plan.selection.config == cfg and ce["NUM_WG"] == num_wg
        assert ce["SANITISE"] == in_kernel and (plan.prepass is None) == in_kernel
        if not in_kernel:
            assert isinstance(plan.prepass, SecurePrepass) and plan.prepass.key_weights_shape is None
        self_plan = ops.dense_plan(q[:, :, :Sk] if Sq >= Sk else q, k, k, None, lk, True, D ** -0.5, False, True,
                                   False)
        if Sq == Sk:  # (the self-attention form: the public diagonal, as before)
            assert self_plan.main.step.constexprs["CAUSAL"] and not self_plan.main.step.constexprs.get("SECRET_DIAG")
    q = torch.empty(2, 4, 1000, 128, dtype=torch.bfloat16)
    qs = torch.empty(2, 4, 1000, 132, dtype=torch.bfloat16)[..., :128]  # a row stride the copy engine cannot take
    lens = torch.full((2,), 1000, dtype=torch.int32)
    plan = ops.dense_plan(qs, q, q, lens, lens, True, 0.1, False, True, False)
    assert plan.selection.kernel == "triton_fwd"


def test_secret_diagonal_launch_checks_its_form():
    """GluonLaunch(secret_diag=True) takes the dense secure causal form only."""
    q = torch.empty(2, 4, 500, 128, dtype=torch.bfloat16)
    kw = dict(scale=0.1, seqlen_q=500, seqlen_k=500, batch=2, num_heads_q=4, num_heads_kv=4, lse_strides=(2000, 500),
              cfg=tables.gluon_secure(128, 500, True), secret_diag=True)
    launch = sm90_fwd.GluonLaunch(q, q, q, q, None, causal=True, secure=True, **kw)
    assert launch.step.constexprs["SECRET_DIAG"] and not launch.step.constexprs["CAUSAL"]
    for bad in (dict(causal=True, secure=False), dict(causal=False, secure=True),
                dict(causal=True, secure=True, key_lens=True)):
        with pytest.raises(ValueError, match="secret_diag"):
            sm90_fwd.GluonLaunch(q, q, q, q, None, **bad, **kw)


@pytest.mark.parametrize("head_dim,causal,block_m", [(128, False, None), (64, False, None), (64, True, None),
                                                     (128, True, None), (64, False, 192)])
def test_secure_machine_code_keeps_the_fast_loop(head_dim, causal, block_m):
    """sm_90a SASS (no GPU), secure against fast. In both, the main loop's exponentials sit between the
    wait for S_j and the wait for the previous P@V, so the softmax overlaps that MMA (in v9's secure
    kernel ptxas had hoisted the P@V wait above them). Causal (self form), the secure loop is the fast
    one instruction for instruction, by opcode, up to a few integer bookkeeping instructions. Non-causal, it masks no key (the pre-pass made padding keys
    copies of a valid one): no more selects than the fast loop, and its row sums are a 64x8 MMA against
    the key weights instead of an add per score (and a cross-lane reduction per tile). ``block_m`` None: the layout
    flashcore launches on this Triton (tables.gluon_secure: three consumer warpgroups at D=64 non-causal, two where
    the toolchain serialises that form's wgmmas); 192: the three-warpgroup form, whose fit is pinned per version.
    The fast loop compared is the fast path's in the same layout."""
    from conftest import expect_register_fit, gluon_sass, main_loop_opcodes

    block_m = block_m or tables.gluon_secure(head_dim, 4096, causal).block_m
    sass = gluon_sass(head_dim, causal, secure=True, block_m=block_m)
    fast_sass = gluon_sass(head_dim, causal, block_m=block_m)
    form = f"secure_d64_full_{block_m // 64}wg" if (head_dim, causal) == (64, False) else \
        {(128, True): "d128_causal"}.get((head_dim, causal))
    if "WARPGROUP.DEPBAR.LE gsb0, 0x1" not in sass:  # ptxas serialised every wgmma: no main loop to look at
        expect_register_fit(form, False, "the secure kernel's wgmmas are serialised")
    loop, fast_loop = main_loop_opcodes(sass), main_loop_opcodes(fast_sass)
    tile_scores_per_thread = 64 * 128 // 128  # a 64x128 score tile over one warpgroup's 128 threads
    for ops in (loop, fast_loop):
        assert ops["MUFU.EX2"] >= tile_scores_per_thread
    if causal:
        # the same math, opcode for opcode; integer bookkeeping may differ by register allocation (since v15 the
        # secure loop rematerialises the thread index once: S2R + LOP3, LEA for IMAD)
        bookkeeping = ("IMAD", "LEA", "LOP3", "S2R", "MOV", "IADD3", "VIADD", "SHF")  # VIADD: ptxas >= 12.9's add
        math = lambda ops: {k: n for k, n in ops.items() if not k.startswith(bookkeeping)}  # noqa: E731
        assert math(loop) == math(fast_loop)
        assert abs(sum(loop.values()) - sum(fast_loop.values())) <= 3
        assert "HGMMA.64x8x16" not in sass
    else:
        assert loop["FSEL"] <= fast_loop["FSEL"]
        # both branches (masked and unmasked tiles) drop their per-score adds
        assert loop["FADD"] + 2 * tile_scores_per_thread <= fast_loop["FADD"]
        assert loop["SHFL.BFLY"] < fast_loop["SHFL.BFLY"]
        assert "HGMMA.64x8x16" in sass and "HGMMA.64x8x16" not in fast_sass
    assert "UTMALDG" in sass and "UTMASTG" in sass and "HGMMA." in sass
    # no spills in the main loop; outside it: causal D=128 spills 3 registers, fast and secure; secure D=64
    # non-causal with three consumer warpgroups (160 registers) 2 across each item's loop (sm_90a, Triton 3.6)
    allowed = 3 if (head_dim == 128 and causal) else (2 if (head_dim == 64 and not causal) else 0)
    in_loop = any(op.startswith(("STL", "LDL")) for op in (*loop, *fast_loop))
    outside = sass.count("STL") <= 2 * allowed and fast_sass.count("STL") <= 2 * (3 if causal and head_dim == 128 else 0)
    expect_register_fit(form, not in_loop and outside, "spills in the main loop, or more than the few outside it")


# --------------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.gpu
TOL = {torch.bfloat16: 1.2e-2, torch.float16: 2e-3}


@pytest.fixture
def force_secure_gluon(monkeypatch):
    monkeypatch.setenv(knobs.SECURE_KERNEL_ENV, "gluon_ws")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def _inputs(B, Hq, Hkv, S, D, dtype, seed, Sk=None):
    """q [B, Hq, S, D], k and v [B, Hkv, Sk (default S), D], random."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h, s: torch.randn(B, h, s, D, device="cuda", generator=g, dtype=torch.float32).to(dtype)  # noqa
    return mk(Hq, S), mk(Hkv, Sk or S), mk(Hkv, Sk or S)


def _runs_secure_gluon(q, k, v, causal, lens) -> bool:
    """Whether the secure call's plan launches the Gluon kernel in secure mode."""
    from flashcore import ops

    main = ops.dense_plan(q, k, v, None, lens, causal, q.shape[-1] ** -0.5, False, True, False).main
    return isinstance(main, sm90_fwd.GluonLaunch) and main.step.constexprs["SECURE"]


SECURE_CASES = [
    # B, Hq, Hkv, S, D, causal, lengths
    (4, 8, 8, 1024, 128, False, [1024, 517, 1, 0]),
    (4, 8, 8, 1024, 128, True, [1024, 517, 1, 0]),
    (3, 8, 2, 1000, 64, False, [1000, 333, 64]),
    (3, 8, 2, 1000, 64, True, [999, 128, 2]),
    (2, 4, 1, 333, 128, True, [333, 200]),
    (1, 16, 16, 2048, 64, False, [1500]),
]


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", SECURE_CASES)
def test_secure_gluon_matches_reference_and_ignores_padding(case, dtype, force_secure_gluon):
    B, Hq, Hkv, S, D, causal, lengths = case
    q, k, v = _inputs(B, Hq, Hkv, S, D, dtype, seed=hash((str(case), str(dtype))) % 2**31)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    _, lse = flashcore.attention(q, k, v, causal=causal, secure=True, seqlens_k=lens, return_lse=True, out=out)
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=causal, seqlens_k=lens, return_lse=True)
    torch.cuda.synchronize()
    assert _runs_secure_gluon(q, k, v, causal, lens)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[dtype]
    for b, n in enumerate(lengths):
        assert bool((out[b, :, n:] == 0).all()), "rows past the true length must be exact zeros"
        assert bool(torch.isneginf(lse[b, :, n:]).all())
        if n:
            assert torch.allclose(lse[b, :, :n].double(), ref_lse[b, :, :n], atol=2e-2, rtol=0)
    # whatever the padding holds (NaN, Inf, huge), the output bytes are the same
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for b, n in enumerate(lengths):
        q2[b, :, n:] = float("nan"); k2[b, :, n:] = float("inf"); v2[b, :, n:] = float("nan")
    out2 = flashcore.attention(q2, k2, v2, causal=causal, secure=True, seqlens_k=lens)
    assert torch.equal(out, out2)
    for _ in range(3):  # bitwise repeatable
        assert torch.equal(flashcore.attention(q, k, v, causal=causal, secure=True, seqlens_k=lens), out)


@gpu
@pytest.mark.parametrize("case", [(3, 8, 2, 1000, 64, [999, 128, 2]), (4, 16, 16, 1024, 64, [1024, 1023, 517, 65]),
                                  (2, 8, 2, 1000, 128, [999, 1]), (2, 8, 8, 777, 64, [777, 0])])
def test_in_kernel_v_padding_gives_the_pre_pass_bits(case, force_secure_gluon):
    """Causal secure mode with V's padding written by the kernel's loader warpgroup (one- and two-warpgroup forms,
    D 64/128, GQA, a length of 0) gives the V pre-pass's output bit for bit (a valid row never meets a padding key),
    matches float64, and ignores what the padding holds (NaN, Inf)."""
    B, Hq, Hkv, S, D, lengths = case
    q, k, v = _inputs(B, Hq, Hkv, S, D, torch.bfloat16, seed=hash(str(case)) % 2**31)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    outs = {}
    for mode in ("on", "off"):
        with knobs.override(secure_in_kernel_padding=mode):
            plan = flashcore.plan_attention(q, k, v, causal=True, secure=True, seqlens_k=lens)
            assert plan.main.step.constexprs["SANITISE"] == (mode == "on")
            assert (plan.prepass is None) == (mode == "on")
            outs[mode] = torch.full_like(q, float("nan"))
            flashcore.attention(q, k, v, causal=True, secure=True, seqlens_k=lens, out=outs[mode])
    torch.cuda.synchronize()
    assert torch.equal(outs["on"], outs["off"])
    ref = flashcore.reference.attention(q, k, v, causal=True, seqlens_k=lens)
    assert rel_err(outs["on"], ref) < TOL[torch.bfloat16]
    k2, v2 = k.clone(), v.clone()
    for b, n in enumerate(lengths):
        k2[b, :, n:] = float("inf"); v2[b, :, n:] = float("nan")
    with knobs.override(secure_in_kernel_padding="on"):
        assert torch.equal(flashcore.attention(q, k2, v2, causal=True, secure=True, seqlens_k=lens), outs["on"])


@gpu
def test_secure_gluon_cross_lengths_and_cuda_graph(force_secure_gluon):
    from conftest import capture_cuda_graph

    B, H, S, D = 2, 8, 777, 128
    q, k, v = _inputs(B, H, H, S, D, torch.bfloat16, seed=77)
    lq = torch.tensor([700, 5], dtype=torch.int32, device="cuda")
    lk = torch.tensor([300, 777], dtype=torch.int32, device="cuda")
    out = flashcore.attention(q, k, v, secure=True, seqlens_q=lq, seqlens_k=lk)
    assert _runs_secure_gluon(q, k, v, False, lk)
    assert rel_err(out, flashcore.reference.attention(q, k, v, seqlens_q=lq, seqlens_k=lk)) < TOL[torch.bfloat16]
    # explicit query lengths with causal: a secret diagonal, the Gluon kernel's SECRET_DIAG form since v36
    outc = flashcore.attention(q, k, v, causal=True, secure=True, seqlens_q=lq, seqlens_k=lk)
    refc = flashcore.reference.attention(q, k, v, causal=True, seqlens_q=lq, seqlens_k=lk)
    assert rel_err(outc, refc) < TOL[torch.bfloat16]
    from flashcore import ops
    plan = ops.dense_plan(q, k, v, lq, lk, True, D ** -0.5, False, True, False)
    assert plan.selection.kernel == "sm90_fwd" and plan.main.step.constexprs["SECRET_DIAG"]
    lens = torch.tensor([777, 100], dtype=torch.int32, device="cuda")
    flashcore.attention(q, k, v, causal=True, secure=True, seqlens_k=lens)  # warm-up outside the graph
    g, out_g = capture_cuda_graph(lambda: flashcore.attention(q, k, v, causal=True, secure=True, seqlens_k=lens))
    q2, k2, v2 = _inputs(B, H, H, S, D, torch.bfloat16, seed=78)
    q.copy_(q2); k.copy_(k2); v.copy_(v2); lens.copy_(torch.tensor([5, 700], dtype=torch.int32))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_g, flashcore.attention(q2, k2, v2, causal=True, secure=True, seqlens_k=lens))
    assert bool((out_g[0, :, 5:] == 0).all())


@gpu
@pytest.mark.parametrize("shape", [(2, 8, 777, 128), (1, 8, 512, 64), (3, 8, 1000, 64)])
def test_secure_kernel_after_its_pre_pass_is_exact_eager_and_in_a_cuda_graph(shape, force_secure_gluon):
    """The secure Gluon kernel launched as its pre-pass's programmatic dependent (perf-notes v44; non-causal, below
    tables.SECURE_PDL_WORK) gives the bits of the launch after the pre-pass completes, eagerly and as a CUDA-graph
    replay with new inputs and new lengths."""
    from conftest import capture_cuda_graph
    from flashcore import ops

    B, H, S, D = shape
    q, k, v = _inputs(B, H, H, S, D, torch.bfloat16, seed=S + D)
    lens = torch.randint(1, S + 1, (B,), dtype=torch.int32, device="cuda")
    lens[0] = S
    plan = ops.dense_plan(q, k, v, None, lens, False, D ** -0.5, False, True, False)
    assert plan.main.step.constexprs["PDL_WAIT"] and plan.prepass.step.constexprs["PDL_TRIGGER"]
    out = flashcore.attention(q, k, v, secure=True, seqlens_k=lens)
    with knobs.override(secure_pdl="off"):
        assert not ops.dense_plan(q, k, v, None, lens, False, D ** -0.5, False, True, False).main.step.constexprs[
            "PDL_WAIT"]
        plain = flashcore.attention(q, k, v, secure=True, seqlens_k=lens)
    assert torch.equal(out, plain)
    assert rel_err(out, flashcore.reference.attention(q, k, v, seqlens_k=lens)) < TOL[torch.bfloat16]
    g, out_g = capture_cuda_graph(lambda: flashcore.attention(q, k, v, secure=True, seqlens_k=lens))
    q2, k2, v2 = _inputs(B, H, H, S, D, torch.bfloat16, seed=S + D + 1)
    q.copy_(q2); k.copy_(k2); v.copy_(v2)  # noqa: E702
    lens.copy_(torch.randint(1, S + 1, (B,), dtype=torch.int32))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_g, flashcore.attention(q2, k2, v2, secure=True, seqlens_k=lens))


SECRET_DIAG_CASES = [
    # B, Hq, Hkv, Sq, Sk, D, query lengths, key lengths (the diagonal len_k - len_q: positive, 0, negative)
    (4, 8, 8, 1024, 1024, 128, [1024, 517, 1, 300], [1024, 1000, 700, 0]),
    (3, 8, 2, 1000, 1000, 64, [999, 128, 1000], [500, 999, 3]),
    (2, 6, 6, 333, 1000, 128, [333, 100], [1000, 50]),
    (2, 16, 4, 1000, 512, 64, [1000, 7], [512, 512]),
    (1, 16, 16, 1024, 1024, 64, [1024], [1024]),
]


def _secret_diag_inputs(case, dtype=torch.bfloat16):
    B, Hq, Hkv, Sq, Sk, D, lq, lk = case
    q, k, v = _inputs(B, Hq, Hkv, Sq, D, dtype, hash((str(case), str(dtype))) % 2**31, Sk=Sk)
    lens = (torch.tensor(x, dtype=torch.int32, device="cuda") for x in (lq, lk))
    return (q, k, v, *lens)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", SECRET_DIAG_CASES)
def test_secret_diagonal_runs_gluon_matches_reference_and_ignores_padding(case, dtype, force_secure_gluon):
    """Secure causal attention with explicit query lengths (a secret diagonal, len_k - len_q, positive, zero or
    negative; Sq != Sk too) on the Gluon kernel's SECRET_DIAG form, as the planner chooses it: every key tile
    visited, each masked with both secret lengths. Matches float64; rows past len_q (and valid rows that see no
    key) are exact zeros with lse -inf; V's padding written by the loader or by the pre-pass gives the same bits;
    NaN/Inf padding in q, k and v changes no output bit."""
    q, k, v, lq, lk = _secret_diag_inputs(case, dtype)
    lq_list, lk_list = case[6], case[7]
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=True, seqlens_q=lq, seqlens_k=lk, return_lse=True)
    outs = {}
    for mode in ("on", "off"):
        with knobs.override(secure_in_kernel_padding=mode):
            plan = flashcore.plan_attention(q, k, v, causal=True, secure=True, seqlens_q=lq, seqlens_k=lk)
            ce = plan.main.step.constexprs
            assert isinstance(plan.main, sm90_fwd.GluonLaunch) and ce["SECURE"] and ce["SECRET_DIAG"]
            assert not ce["CAUSAL"] and not ce["SUM_MMA"] and ce["SANITISE"] == (mode == "on")
            out = torch.full_like(q, float("nan"))
            _, lse = flashcore.attention(q, k, v, causal=True, secure=True, seqlens_q=lq, seqlens_k=lk,
                                         return_lse=True, out=out)
            outs[mode] = (out, lse)
    torch.cuda.synchronize()
    out, lse = outs["off"]
    assert torch.equal(outs["on"][0], out)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[dtype]
    for b, (n, m) in enumerate(zip(lq_list, lk_list)):
        assert bool((out[b, :, n:] == 0).all()), "rows past the true query length must be exact zeros"
        assert bool(torch.isneginf(lse[b, :, n:]).all())
        seen = torch.arange(n, device="cuda") + (m - n) >= 0  # a valid row that sees a key
        if seen.any():
            assert torch.allclose(lse[b, :, :n][:, seen].double(), ref_lse[b, :, :n][:, seen], atol=2e-2, rtol=0)
        assert bool((out[b, :, :n][:, ~seen] == 0).all()) and bool(torch.isneginf(lse[b, :, :n][:, ~seen]).all())
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for b, (n, m) in enumerate(zip(lq_list, lk_list)):
        q2[b, :, n:] = float("nan"); k2[b, :, m:] = float("inf"); v2[b, :, m:] = float("nan")
    for mode in ("on", "off"):
        with knobs.override(secure_in_kernel_padding=mode):
            assert torch.equal(flashcore.attention(q2, k2, v2, causal=True, secure=True, seqlens_q=lq,
                                                   seqlens_k=lk), out)


@gpu
def test_secret_diagonal_cuda_graph_replays_with_new_lengths(force_secure_gluon):
    """One capture of the SECRET_DIAG form, replayed with new query and key lengths (a diagonal of the other sign):
    the eager call's bits."""
    from conftest import capture_cuda_graph

    case = (2, 8, 2, 777, 777, 128, [700, 5], [300, 777])
    q, k, v, lq, lk = _secret_diag_inputs(case)
    call = lambda: flashcore.attention(q, k, v, causal=True, secure=True, seqlens_q=lq, seqlens_k=lk)  # noqa
    call()  # warm-up outside the graph
    g, out_g = capture_cuda_graph(call)
    lq.copy_(torch.tensor([5, 777], dtype=torch.int32)); lk.copy_(torch.tensor([777, 100], dtype=torch.int32))
    g.replay()
    torch.cuda.synchronize()
    want = flashcore.attention(q, k, v, causal=True, secure=True, seqlens_q=lq, seqlens_k=lk)
    assert torch.equal(out_g, want)
    ref = flashcore.reference.attention(q, k, v, causal=True, seqlens_q=lq, seqlens_k=lk)
    assert rel_err(out_g, ref) < TOL[torch.bfloat16] and bool((out_g[0, :, 5:] == 0).all())


def test_static_gate_certifies_the_secure_kernel_and_still_sees_a_length_leak():
    """Gate 1 on the warp-specialised kernel (sm_90a, no GPU): the secure form has no violation; the same
    analysis on the fast form with the key length declared secret finds its length-dependent loop bounds
    (so the shared-memory and dispatch refinements did not blind it)."""
    import os
    import subprocess
    import sys

    code = """
import json
from flashcore.audit import specs
from flashcore.audit.sass import sass_taint
out = []
for secure, secret in ((True, None), (False, {"seqlen_k", "q_desc", "k_desc", "v_desc"})):
    spec = specs.gluon_spec(128, False, secure=secure)
    r = sass_taint(spec["fn"], spec["signature"], spec["constexprs"], secret or spec["secret"], attrs=spec["attrs"],
                   maxnreg=spec["maxnreg"])
    out.append((len(r.violations), sum(v.kind == "branch" for v in r.violations),
                any("control area from" in n for n in r.notes)))
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    import json
    (secure_n, _, secure_split), (fast_n, fast_branches, fast_split) = json.loads(res.stdout.strip().splitlines()[-1])
    assert secure_split and fast_split  # the two-area model was in use
    assert secure_n == 0
    assert fast_n > 0 and fast_branches > 0


_LEAKY_PAD = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from flashcore.kernels.sm90 import secure_pad as sp


@gluon.jit
def pad_v_tile(tile, col, len_k, row0, salt, BLOCK_N: gl.constexpr):
    # the in-kernel padding, but skipping the groups of rows below the secret length: a length-dependent branch
    words = sp._words(tile)
    col = gl.expand_dims(col, 0)
    for g in gl.static_range(BLOCK_N // sp.GROUP_ROWS):
        if row0 + (g + 1) * sp.GROUP_ROWS > len_k:
            part = words.slice(g * sp.GROUP_ROWS, sp.GROUP_ROWS, dim=0)
            x = part.load(sp.WORD_LAYOUT)
            rows = row0 + g * sp.GROUP_ROWS + gl.arange(0, sp.GROUP_ROWS, layout=gl.SliceLayout(1, sp.WORD_LAYOUT))
            part.store(gl.where(gl.expand_dims(rows < len_k, 1), x, col))
"""


def _gate_clean_and_leaky(tmp_path, module: str, source: str, patch: str, spec_call: str, flag: str) -> None:
    """Gate 1 on a Gluon form built by ``spec_call`` (an ``audit.specs.gluon_spec(...)`` expression), as shipped and
    with one device function replaced (``patch``: a statement run after ``import <module>``, the module written from
    ``source``), each in a process of its own (compiled kernels are cached per process): the shipped form has no
    violation, the mutated one has branches on the secret; the form's constexpr ``flag`` is on in both."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / f"{module}.py").write_text(source)
    code = f"""
import json, sys
from flashcore.audit import specs
from flashcore.audit.sass import sass_taint
from flashcore.kernels.sm90 import fwd, pipeline
if sys.argv[1] == "leaky":
    import {module}
    {patch}
spec = {spec_call}
r = sass_taint(spec["fn"], spec["signature"], spec["constexprs"], spec["secret"], attrs=spec["attrs"],
               maxnreg=spec["maxnreg"])
print(json.dumps((spec["constexprs"]["{flag}"], len(r.violations), sum(v.kind == "branch" for v in r.violations))))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, str(tmp_path), env.get("PYTHONPATH")) if p)
    found = []
    for variant in ("clean", "leaky"):
        res = subprocess.run([sys.executable, "-c", code, variant], capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        found.append(json.loads(res.stdout.strip().splitlines()[-1]))
    (clean_form, clean_n, _), (leaky_form, leaky_n, leaky_branches) = found
    assert clean_form and leaky_form
    assert clean_n == 0
    assert leaky_n > 0 and leaky_branches > 0


def test_static_gate_passes_the_in_kernel_padding_and_sees_a_length_dependent_skip(tmp_path):
    """Gate 1 on the secure causal form whose loader writes V's padding (sm_90a, no GPU): clean; the same form with
    a padding function that skips the row groups below the secret key length (a leak the loader could have) is
    caught as branches on the secret."""
    _gate_clean_and_leaky(tmp_path, "leaky_pad", _LEAKY_PAD, "pipeline.pad_v_tile = leaky_pad.pad_v_tile",
                          "specs.gluon_spec(64, True, S=1024, Hq=16, Hkv=16, B=1, cfg=specs.tables.gluon_one_wg(), "
                          "secure=True, sanitise=True)", "SANITISE")


_LEAKY_SOFTMAX = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from flashcore.kernels.sm90 import softmax as sm


@gluon.jit
def leaky_softmax_step(s, m_i, l_i, col0, row, seqlen_k, diag, qk_scale, MASK: gl.constexpr, CAUSAL: gl.constexpr,
                       ROW_SUM: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    # the masked step, but skipping the mask on tiles wholly left of the diagonal: a branch on the secret diagonal
    if col0 + BLOCK_N <= gl.min(row, axis=0) + diag:
        p, alpha, m_new, l_new = sm._softmax_step(s, m_i, l_i, col0, row, seqlen_k, diag, qk_scale, False, False,
                                                  ROW_SUM, BLOCK_N, s_layout)
    else:
        p, alpha, m_new, l_new = sm._softmax_step(s, m_i, l_i, col0, row, seqlen_k, diag, qk_scale, MASK, CAUSAL,
                                                  ROW_SUM, BLOCK_N, s_layout)
    return p, alpha, m_new, l_new
"""


@pytest.mark.parametrize("head_dim,sanitise", [(128, False), (64, True)])
def test_static_gate_passes_the_secret_diagonal_and_sees_a_diagonal_dependent_skip(tmp_path, head_dim, sanitise):
    """Gate 1 on the SECRET_DIAG form (sm_90a, no GPU): clean; the same form whose softmax skips the mask on tiles
    left of the secret diagonal (what the fast path does on its public one) is caught as branches on the secret
    (so the key lengths pointer is declared secret and followed)."""
    _gate_clean_and_leaky(tmp_path, "leaky_softmax", _LEAKY_SOFTMAX,
                          "fwd._softmax_step = leaky_softmax.leaky_softmax_step",
                          f"specs.gluon_spec({head_dim}, True, S=1000, Hq=8, Hkv=2, return_lse=True, secure=True, "
                          f"sanitise={sanitise}, secret_diag=True)", "SECRET_DIAG")


@gpu
@pytest.mark.parametrize("case", [(2, 8, 8, 1024, 64, False, [1024, 300]), (2, 8, 8, 1024, 64, True, [1024, 300]),
                                  (2, 8, 2, 1000, 128, False, [999, 1]), (1, 16, 16, 2048, 64, True, [1500])])
def test_strict_is_secure_bit_for_bit_and_ignores_padding(case):
    """secure="strict" on the GPU (the one- and two-warpgroup Gluon forms): q's and k's padding rows are replaced
    before the kernel, which changes no output bit, whatever the padding holds."""
    B, Hq, Hkv, S, D, causal, lengths = case
    q, k, v = _inputs(B, Hq, Hkv, S, D, torch.bfloat16, seed=hash(str(case)) % 2**31)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    ref = flashcore.attention(q, k, v, causal=causal, secure=True, seqlens_k=lens)
    plan = flashcore.plan_attention(q, k, v, causal=causal, secure="strict", seqlens_k=lens)
    assert plan.fill_q is not None and isinstance(plan.main, sm90_fwd.GluonLaunch)
    out = flashcore.attention(q, k, v, causal=causal, secure="strict", seqlens_k=lens)
    assert torch.equal(out, ref)
    for b, n in enumerate(lengths):
        q[b, :, n:] = float("nan"); k[b, :, n:] = float("inf"); v[b, :, n:] = float("nan")
    assert torch.equal(flashcore.attention(q, k, v, causal=causal, secure="strict", seqlens_k=lens), ref)


@gpu
@pytest.mark.parametrize("case", SECRET_DIAG_CASES[:4])
def test_strict_with_a_secret_diagonal_is_secure_bit_for_bit_and_ignores_padding(case):
    """secure="strict" with explicit query lengths (the SECRET_DIAG form, as the planner chooses it): the padding rows
    of q (past each query length) and of k and v (past each key length) are replaced before the kernel, which changes
    no output bit against secure=True, and NaN/Inf in every padding row changes none either."""
    q, k, v, lq, lk = _secret_diag_inputs(case)
    lq_list, lk_list = case[6], case[7]
    ref = flashcore.attention(q, k, v, causal=True, secure=True, seqlens_q=lq, seqlens_k=lk)
    plan = flashcore.plan_attention(q, k, v, causal=True, secure="strict", seqlens_q=lq, seqlens_k=lk)
    assert plan.fill_q is not None and isinstance(plan.main, sm90_fwd.GluonLaunch)
    assert plan.main.step.constexprs["SECRET_DIAG"]
    out = flashcore.attention(q, k, v, causal=True, secure="strict", seqlens_q=lq, seqlens_k=lk)
    assert torch.equal(out, ref)
    for b, (n, m) in enumerate(zip(lq_list, lk_list)):
        q[b, :, n:] = float("nan"); k[b, :, m:] = float("inf"); v[b, :, m:] = float("nan")
    assert torch.equal(flashcore.attention(q, k, v, causal=True, secure="strict", seqlens_q=lq, seqlens_k=lk), ref)
