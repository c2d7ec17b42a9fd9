"""CPU tests of the GPU audit tooling: statistics, the ncu CSV parser, the counters comparison,
the CLI's behaviour without CUDA, and the input-class builder."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import flashcore
from flashcore import cli as flashcore_cli
from flashcore.audit import _inputs as I
from flashcore.audit import cli as audit_cli
from flashcore.audit import counters as C
from flashcore.audit import stats as S
from flashcore.audit import timing as T


# ---------------------------------------------------------------------------------------------- stats

def test_welch_t_hand_computed():
    # a: mean 2.5, var 5/3; b: mean 6, var 10.  se^2 = (5/3)/4 + 10/5 = 29/12.
    r = S.welch_t([1, 2, 3, 4], [2, 4, 6, 8, 10])
    se = math.sqrt(29 / 12)
    assert r["mean_a"] == pytest.approx(2.5)
    assert r["var_a"] == pytest.approx(5 / 3)
    assert r["var_b"] == pytest.approx(10.0)
    assert r["diff"] == pytest.approx(-3.5)
    assert r["se"] == pytest.approx(se)
    assert r["t"] == pytest.approx(-3.5 / se)            # -2.25143...
    assert r["t"] == pytest.approx(-2.251433, abs=1e-5)
    # Welch-Satterthwaite: (29/12)^2 / ((5/12)^2/3 + 2^2/4)
    df = (29 / 12) ** 2 / ((5 / 12) ** 2 / 3 + 1.0)
    assert r["df"] == pytest.approx(df)
    assert r["df"] == pytest.approx(5.520786, abs=1e-5)
    lo, hi = r["ci"]
    assert lo < -3.5 < hi


def test_welch_t_degenerate_samples():
    assert S.welch_t([1, 1, 1], [1, 1]).get("t") == 0.0
    assert S.welch_t([2, 2, 2], [1, 1])["t"] == math.inf
    with pytest.raises(ValueError):
        S.welch_t([1], [1, 2])


def test_welch_t_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    a = rng.normal(10.0, 2.0, 137)
    b = rng.normal(10.7, 5.0, 311)
    r = S.welch_t(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert r["t"] == pytest.approx(float(ref.statistic), rel=1e-10)
    if hasattr(ref, "df"):
        assert r["df"] == pytest.approx(float(ref.df), rel=1e-10)
    # the CI uses our t quantile: compare with scipy's
    q = stats.t.ppf(0.975, r["df"])
    assert r["ci"][1] - r["diff"] == pytest.approx(q * r["se"], rel=1e-7)
    pr = S.paired_t(a[:100], b[:100])
    ref2 = stats.ttest_rel(a[:100], b[:100])
    assert pr["t"] == pytest.approx(float(ref2.statistic), rel=1e-10)


@pytest.mark.parametrize("df", [1, 3, 5.5, 30, 1000])
def test_t_quantile_against_scipy(df):
    stats = pytest.importorskip("scipy.stats")
    for p in (0.025, 0.9, 0.975, 0.995):
        assert S.t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-7)
        assert S.t_cdf(S.t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_t_quantile_normal_limit():
    assert S.t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    assert S.t_quantile(0.5, 10) == pytest.approx(0.0, abs=1e-9)
    assert S.t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-5)  # the t table's value


def test_dudect_percentiles_and_cropping():
    rng = np.random.default_rng(0)
    a = rng.normal(1000.0, 10.0, 20000)
    b = rng.normal(1000.0, 10.0, 20000)
    b[rng.random(b.size) < 0.01] += 1e4  # one-sided outliers in one class only (an "interrupt")
    thr = S.dudect_percentiles(np.concatenate([a, b]))
    assert thr.shape == (100,)
    assert np.all(np.diff(thr) >= 0)
    assert thr[0] == pytest.approx(np.quantile(np.concatenate([a, b]), 1 - 0.5 ** 0.1))
    r = S.dudect(a, b)
    # The outliers dominate the uncropped test; the first crops remove them.
    assert abs(r["uncropped"]["t"]) > S.T_THRESHOLD
    for c in r["crops"]:  # every crop keeps exactly the measurements below its threshold
        assert c["n_a"] == int((a < c["threshold"]).sum()) and c["n_b"] == int((b < c["threshold"]).sum())
    tested = [c for c in r["crops"] if c["t"] is not None]
    assert tested and tested[0]["i"] > 0  # the first crops hold fewer than min_n samples per class
    assert all(abs(c["t"]) < S.T_THRESHOLD for c in tested if c["threshold"] < 5000)  # outliers cropped away
    assert r["leak"]  # dudect reports the max over tests


def test_dudect_flags_shift_and_not_null():
    rng = np.random.default_rng(7)
    base = rng.normal(5000.0, 50.0, (2, 30000))
    null = S.dudect(base[0], base[1])
    assert not null["leak"], null["max_abs_t"]
    shifted = S.dudect(base[0] + 5.0, base[1])  # 0.1 sd over 3e4 samples: t ~ 12
    assert shifted["leak"] and shifted["max_abs_t"] > 8


def test_paired_test_detects_planted_shift_only():
    rng = np.random.default_rng(11)
    n = 20000
    drift = np.cumsum(rng.normal(0, 0.5, n))      # slow drift shared by the two members of a pair
    a0 = 20000 + drift + rng.normal(0, 30, n)
    b0 = 20000 + drift + rng.normal(0, 30, n)
    same = S.paired_t(a0, b0)
    assert abs(same["t"]) < S.T_THRESHOLD
    lo, hi = same["ci"]
    assert lo < 0 < hi
    planted = S.paired_t(a0 + 3.0, b0)            # 3 ns on a 30 ns noise: t ~ 7
    assert planted["t"] > S.T_THRESHOLD
    assert planted["ci"][0] > 0 and planted["mean_diff"] == pytest.approx(3.0 + same["mean_diff"])


def test_timing_analyse_end_to_end_synthetic():
    rng = np.random.default_rng(5)
    n = 20000
    a_first = rng.integers(0, 2, n).astype(bool)
    a = rng.normal(30000, 40, n)
    b = rng.normal(30000, 40, n)
    res = T.analyse(a, b, a_first)
    assert not res["leak"]
    assert res["detectable_diff_ns"] == pytest.approx(4.5 * math.sqrt(2 * 40 ** 2 / n), rel=0.05)
    res2 = T.analyse(a + 5.0, b, a_first)
    assert res2["leak"] and res2["mean_diff_ns"] == pytest.approx(5.0, abs=2.0)


# ---------------------------------------------------------------------------------------------- ncu CSV

SAMPLE_CSV = '''==PROF== Connected to process 582 (/usr/bin/python3.12)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","device__attribute_display_name","dram__bytes_read.sum","gpu__time_duration.sum","launch__grid_size","lts__t_sectors.sum","sass__inst_executed_per_opcode","smsp__inst_executed.sum","smsp__sass_inst_executed_op_branch.sum"
"","","","","","","","","","","","","byte","ns","","sector","","inst","inst"
"0","582","python3.12","127.0.0.1","attn_fwd_kernel","1","7","(128, 1, 1)","(4, 8, 1)","0","9.0","NVIDIA H100 80GB HBM3","266,752","3,616","32 (0: 32)","69,771","83,968 (ISETP: 12,288; BRA: 12,288; LDG: 4,096; FFMA: 55,296)","83,968","12,288"
"1","582","python3.12","127.0.0.1","attn_fwd_kernel","1","7","(128, 1, 1)","(4, 8, 1)","0","9.0","NVIDIA H100 80GB HBM3","266,496","3,552","32 (0: 32)","70,266","83,968 (ISETP: 12,288; BRA: 12,288; LDG: 4,096; FFMA: 55,296)","83,968","12,288"
'''


def test_parse_ncu_csv_raw_page():
    rows = C.parse_ncu_csv(SAMPLE_CSV)
    assert [r["id"] for r in rows] == [0, 1]
    r0 = rows[0]
    assert r0["kernel"] == "attn_fwd_kernel"
    m = r0["metrics"]
    assert "device__attribute_display_name" not in m
    assert m["dram__bytes_read.sum"]["value"] == 266752.0 and m["dram__bytes_read.sum"]["unit"] == "byte"
    assert m["gpu__time_duration.sum"]["value"] == 3616.0
    assert m["launch__grid_size"]["value"] == 32.0
    assert m["launch__grid_size"]["instances"] == {"0": 32.0}
    op = m["sass__inst_executed_per_opcode"]
    assert op["value"] == 83968.0
    assert op["instances"] == {"ISETP": 12288.0, "BRA": 12288.0, "LDG": 4096.0, "FFMA": 55296.0}
    assert rows[1]["metrics"]["lts__t_sectors.sum"]["value"] == 70266.0


def test_parse_ncu_csv_accepts_cells_over_the_csv_default_limit():
    """A warp-specialised kernel's raw page has cells over 128 KiB (seen on the H100)."""
    import csv

    limit = csv.field_size_limit()
    huge = "; ".join(f"OP{i}: {i}" for i in range(20000))  # ~200 KB
    text = SAMPLE_CSV.replace("(ISETP: 12,288; BRA: 12,288; LDG: 4,096; FFMA: 55,296)", f"({huge})", 1)
    rows = C.parse_ncu_csv(text)
    assert len(rows[0]["metrics"]["sass__inst_executed_per_opcode"]["instances"]) == 20000
    assert csv.field_size_limit() == limit  # restored


def test_parse_cell_variants():
    assert C.parse_cell("6,668.80")["value"] == pytest.approx(6668.8)
    assert C.parse_cell("n/a")["value"] is None
    assert C.parse_cell("1.5e+03")["value"] == 1500.0
    assert C.parse_cell("83,968 (12,288; 71,680)")["instances"] == [12288.0, 71680.0]
    with pytest.raises(ValueError):
        C.parse_ncu_csv("==ERROR== no kernels were profiled\n")


def test_assign_rows_multiple_and_mismatch():
    rows = C.parse_ncu_csv(SAMPLE_CSV)
    launches = [{"config": "x", "class": "a", "rep": 0}, {"config": "x", "class": "b", "rep": 0}]
    m = C.assign_rows(rows, launches)
    assert m[1]["lts__t_sectors.sum"]["value"] == 70266.0
    m1 = C.assign_rows(rows, launches[:1])  # one call launched two kernels
    assert "k0:smsp__inst_executed.sum" in m1[0] and "k1:smsp__inst_executed.sum" in m1[0]
    with pytest.raises(ValueError, match="not a multiple"):
        C.assign_rows(rows, launches + launches[:1])


# ---------------------------------------------------------------------------------------------- comparison

def _cell(v, inst=None):
    return {"raw": str(v), "value": float(v) if v is not None else None, "instances": inst}


def _per_class(metric_values: dict) -> dict:
    """{class: [ {metric: cell} per rep ]} from {metric: {class: [values]}}."""
    out = {}
    for metric, by_class in metric_values.items():
        for c, vals in by_class.items():
            reps = out.setdefault(c, [dict() for _ in vals])
            for i, v in enumerate(vals):
                reps[i][metric] = v if isinstance(v, dict) else _cell(v)
    return out


def test_compare_identical_passes():
    pc = _per_class({"smsp__inst_executed.sum": {"random": [100, 100], "zeros": [100, 100], "len1": [100, 100]},
                     "dram__bytes_read.sum": {"random": [512, 512], "zeros": [512, 512], "len1": [512, 512]}})
    res = C.compare_config(pc)
    assert res["pass"] and not res["failed"]
    assert res["metrics"]["smsp__inst_executed.sum"]["status"] == "identical"


def test_compare_one_differing_metric_fails_and_is_named():
    pc = _per_class({"smsp__inst_executed.sum": {"random": [100, 100], "zeros": [100, 100], "len1": [100, 100]},
                     "smsp__sass_inst_executed_op_branch.sum": {"random": [7, 7], "zeros": [7, 7], "len1": [9, 9]}})
    res = C.compare_config(pc)
    assert not res["pass"]
    assert res["failed"] == ["smsp__sass_inst_executed_op_branch.sum"]
    r = res["metrics"]["smsp__sass_inst_executed_op_branch.sum"]
    assert r["status"] == "DIFFERS" and r["differs_from_random"] == ["len1"] and r["spread"] == 2


def test_compare_memory_noise_policy():
    within = _per_class({"lts__t_sectors.sum": {"random": [1000, 1003], "zeros": [1001, 1002], "len1": [1000, 1001]}})
    r = C.compare_config(within)
    assert r["pass"] and r["within_noise"] == ["lts__t_sectors.sum"]
    assert r["metrics"]["lts__t_sectors.sum"]["noise"] == 3 and r["metrics"]["lts__t_sectors.sum"]["spread"] == 3
    assert not C.compare_config(within, strict_memory=True)["pass"]
    beyond = _per_class({"lts__t_sectors.sum": {"random": [1000, 1001], "zeros": [1000, 1001], "len1": [1500, 1501]}})
    rb = C.compare_config(beyond)
    assert not rb["pass"] and rb["metrics"]["lts__t_sectors.sum"]["status"] == "DIFFERS"
    # one repetition per class: no noise estimate, any difference is a difference
    single = _per_class({"dram__bytes_read.sum": {"random": [512], "len1": [640]}})
    assert C.compare_config(single)["metrics"]["dram__bytes_read.sum"]["status"] == "DIFFERS"
    # realistic: 11 classes x 3 reps of L2 noise; one class shifted far beyond the noise is caught
    rng = np.random.default_rng(0)
    noise = {f"c{i}": (45076 + rng.integers(0, 600, 3)).tolist() for i in range(11)}
    assert C.compare_config(_per_class({"lts__t_sectors.sum": noise}))["pass"]
    noise["c7"] = [v + 5000 for v in noise["c7"]]
    r7 = C.compare_config(_per_class({"lts__t_sectors.sum": noise}))
    assert not r7["pass"] and r7["metrics"]["lts__t_sectors.sum"]["p_class_effect"] < 1e-6
    # informational metrics never fail
    info = _per_class({"gpu__time_duration.sum": {"random": [3000, 3100], "len1": [900, 950]}})
    assert C.compare_config(info)["pass"]


def test_compare_per_opcode_names_the_opcode():
    same = {"BRA": 10.0, "FFMA": 50.0}
    other = {"BRA": 12.0, "FFMA": 50.0}
    pc = _per_class({"sass__inst_executed_per_opcode": {
        "random": [_cell(60, dict(same)), _cell(60, dict(same))],
        "len1": [_cell(62, dict(other)), _cell(62, dict(other))]}})
    res = C.compare_config(pc)
    r = res["metrics"]["sass__inst_executed_per_opcode"]
    assert not res["pass"] and r["status"] == "DIFFERS"
    assert set(r["opcode_diff"]) == {"BRA"}
    # same totals but a different mix is still a difference
    pc2 = _per_class({"sass__inst_executed_per_opcode": {
        "random": [_cell(60, {"BRA": 10.0, "FFMA": 50.0})], "len1": [_cell(60, {"BRA": 11.0, "FFMA": 49.0})]}})
    assert not C.compare_config(pc2)["pass"]


def test_compare_missing_values_reported():
    pc = _per_class({"smsp__inst_executed.sum": {"random": [5], "zeros": [5]}})
    pc["zeros"][0].pop("smsp__inst_executed.sum")
    r = C.compare_config(pc, metrics=["smsp__inst_executed.sum", "dram__bytes_write.sum"])
    assert r["metrics"]["smsp__inst_executed.sum"]["missing_in"] == ["zeros"]
    assert not r["pass"]  # a value missing for one class is not "identical"
    assert r["metrics"]["dram__bytes_write.sum"]["status"] == "unavailable"


def test_class_effect_pvalue_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(4)
    groups = [rng.normal(100, 5, 3).tolist() for _ in range(6)] + [rng.normal(108, 5, 3).tolist()]
    ref = stats.f_oneway(*groups)
    assert C.class_effect_pvalue(groups) == pytest.approx(float(ref.pvalue), rel=1e-8)
    assert C.class_effect_pvalue([[1, 1], [1, 1]]) == 1.0
    assert C.class_effect_pvalue([[1, 1], [2, 2]]) == 0.0
    assert C.class_effect_pvalue([[1], [2]]) is None


def test_metric_policies():
    assert C.policy_of("smsp__inst_executed.sum") == "exact"
    assert C.policy_of("k1:dram__bytes_read.sum") == "noisy"
    assert C.policy_of("gpu__time_duration.sum") == "info"
    assert "smsp__sass_branch_targets_threads_divergent.sum" in C.all_metrics()


# ---------------------------------------------------------------------------------------------- CLI

@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("gate", ["counters", "repro", "timing"])
def test_cli_gpu_gates_exit_2_without_cuda(gate, no_cuda, capsys, tmp_path):
    code = flashcore_cli.main(["audit", gate, "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"flashcore audit {gate}" in err and "needs a CUDA GPU" in err
    assert not list(tmp_path.iterdir())  # nothing was run, nothing written


def test_cli_missing_sass_module(monkeypatch, capsys, tmp_path, no_cuda):
    real = audit_cli._gate_module

    def fake(name):
        if name == "sass":
            raise ModuleNotFoundError("No module named 'flashcore.audit.sass'", name="flashcore.audit.sass")
        return real(name)

    monkeypatch.setattr(audit_cli, "_gate_module", fake)
    assert flashcore_cli.main(["audit", "sass", "--out", str(tmp_path)]) == 2
    assert "sass: unavailable" in capsys.readouterr().err
    # 'all' still runs the other gates (each exits 2 here: no CUDA) and reports 2 overall
    assert flashcore_cli.main(["audit", "all", "--out", str(tmp_path)]) == 2


def test_cli_registers_all_gates():
    import argparse

    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    audit_cli.register(sub)
    for gate in ("sass", "counters", "repro", "timing", "all"):
        ns = p.parse_args(["audit", gate] + (["--out", "x"] if gate != "sass" else ["--show", "3"]))
        assert callable(ns.func)
    ns = p.parse_args(["audit", "timing", "--pairs", "10", "--json"])
    assert ns.pairs == 10 and ns.json and ns.out == audit_cli.DEFAULT_OUT
    ns = p.parse_args(["audit", "sass", "--show", "3", "--out", "o"])
    assert ns.sass_args == ["--show", "3", "--out", "o"]


def test_combine_codes():
    assert audit_cli.combine_codes([0, 0]) == 0
    assert audit_cli.combine_codes([0, 2]) == 2
    assert audit_cli.combine_codes([2, 1, 0]) == 1


# ---------------------------------------------------------------------------------------------- inputs

SHAPE = dict(B=3, H=2, Hkv=1, S=16, D=8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_input_classes_properties(dtype):
    S_, half = SHAPE["S"], SHAPE["S"] // 2
    cases = {c.name: c for c in I.build_cases(I.CLASSES, dtype=dtype, seed=3, **SHAPE)}
    assert set(cases) == set(I.CLASSES)
    for c in cases.values():  # one public shape for every class
        assert c.q.shape == (3, 2, S_, 8) and c.k.shape == (3, 1, S_, 8) and c.v.shape == c.k.shape
        assert c.q.dtype == dtype and c.seqlens_q.dtype == torch.int32 and c.seqlens_k.shape == (3,)
        assert c.seqlens_q.tolist() == c.lens_q and c.seqlens_k.tolist() == c.lens_k
        assert all(0 <= n <= S_ for n in c.lens_q + c.lens_k)
    for name, fill in (("nan_pad", torch.isnan), ("inf_pad", torch.isinf)):
        c = cases[name]
        assert c.lens_q == c.lens_k == [half] * 3
        for t in (c.q, c.k, c.v):
            assert bool(fill(t[:, :, half:, :]).all()), name          # the whole padding
            assert bool(torch.isfinite(t[:, :, :half, :]).all()), name  # nothing in the valid region
            ref = getattr(cases["len_half"], "q" if t is c.q else ("k" if t is c.k else "v"))
            assert torch.equal(t[:, :, :half, :], ref[:, :, :half, :])  # shared valid region
    inf = cases["inf_pad"].q[:, :, half:, :].float()
    assert bool((inf > 0).any()) and bool((inf < 0).any())
    assert not bool(torch.isnan(cases["len_half"].q).any())
    assert all(bool((t == 0).all()) for t in (cases["zeros"].q, cases["zeros"].k, cases["zeros"].v))
    huge = cases["huge"].q.float()
    big = I.huge_value(dtype)
    assert bool(torch.isfinite(huge).all()) and bool((huge.abs() >= 0.49 * big).all())
    sub = cases["subnormal"].k.float()
    nz = sub[sub != 0]
    assert nz.numel() > 0 and bool((nz.abs() < torch.finfo(dtype).tiny).all())
    assert cases["len1"].lens_k == [1] * 3 and cases["len_full"].lens_k == [S_] * 3
    assert cases["masked_rows"].lens_q == [0, half, half] and cases["masked_rows"].lens_k == [half] * 3
    assert cases["empty_keys"].lens_k == [0, half, half] and cases["empty_keys"].lens_q == [half] * 3
    assert not cases["masked_rows"].same_lengths and cases["len1"].same_lengths
    assert all(1 <= n <= S_ for n in cases["random"].lens_k)


def test_input_classes_deterministic():
    a = I.build_case("random", seed=5, **SHAPE)
    b = I.build_case("random", seed=5, **SHAPE)
    c = I.build_case("random", seed=6, **SHAPE)
    assert I.tensor_bytes_hash(a.q) == I.tensor_bytes_hash(b.q) and a.lens_k == b.lens_k
    assert I.tensor_bytes_hash(a.q) != I.tensor_bytes_hash(c.q)
    with pytest.raises(ValueError):
        I.build_case("nope", **SHAPE)


def test_pack_varlen():
    c = I.build_case("masked_rows", seed=1, **SHAPE)
    qp, kp, vp, cq, ck, mq, mk = I.pack_varlen(c)
    assert cq.tolist() == [0, 0, 8, 16] and ck.tolist() == [0, 8, 16, 24]
    assert qp.shape == (16, 2, 8) and kp.shape == (24, 1, 8) and (mq, mk) == (8, 8)
    assert torch.equal(qp[0:8], c.q[1, :, :8, :].transpose(0, 1))
    assert torch.equal(vp[16:24], c.v[2, :, :8, :].transpose(0, 1))


def test_output_checks_with_reference_backend():
    """The child's output checks on real (reference-backend) outputs: masked rows are exact zeros and
    NaN/Inf padding does not change the output."""
    names = ["len_half", "nan_pad", "inf_pad", "masked_rows", "empty_keys"]
    cases = {n: I.build_case(n, dtype=torch.float32, seed=2, **SHAPE) for n in names}
    outs = {n: I.make_call("secure", c, causal=False, lens_mode="cross", backend="reference")() for n, c in cases.items()}
    res = C._output_checks(cases, outs)
    assert res["pass"], res
    assert res["padding_invariance"]["identical"]
    # and the check can fail: corrupt one padded output row
    outs["nan_pad"] = outs["nan_pad"].clone()
    outs["nan_pad"][0, 0, -1, 0] = 1.0
    bad = C._output_checks(cases, outs)
    assert not bad["pass"] and bad["zero_rows"]["nan_pad"] is False and not bad["padding_invariance"]["identical"]


def test_timing_class_specs():
    a, b = T.class_specs("short_vs_long", 1024)
    assert (a.length, b.length) == (1, 1024)
    a, b = T.class_specs("fixed_vs_random", 1024)
    assert a.values == "fixed" and b.values == "random" and a.length == b.length
    a, b = T.class_specs("pad_zeros_vs_random", 1024)
    assert a.pad == "zeros" and b.pad == "values" and a.length == b.length == 512
    with pytest.raises(ValueError):
        T.class_specs("nope", 8)


def test_timing_hardware_control_classes():
    from flashcore.audit import timing

    z, r = timing.control_specs("values_zeros_vs_random")
    assert (z.values, r.values) == ("zeros", "random") and z.length == r.length == timing.GEMM_N
    short, long_ = timing.control_specs("short_vs_long")
    assert short.length == 1 and long_.length == timing.GEMM_N and short.pad == long_.pad == "zeros"
    with pytest.raises(ValueError, match="unknown control test"):
        timing.control_specs("fixed_vs_random")


def test_secure_v_zeroing_override(monkeypatch):
    from flashcore.plan import knobs, select, tables

    kw = dict(head_dim=128, dtype_bytes=2, causal=False, secure=True, seqlen_q=4096, seqlen_k=4096, batch_heads=128)
    assert select.table_config((9, 0), **kw).v_prepass  # large: the pre-pass by default
    monkeypatch.setenv(knobs.SECURE_V_ZEROING_ENV, "in_loop")
    assert not select.table_config((9, 0), **kw).v_prepass
    assert select.table_config((9, 0), **dict(kw, secure=False)) == tables.hopper(**dict(kw, secure=False))
    monkeypatch.setenv(knobs.SECURE_V_ZEROING_ENV, "prepass")
    assert select.table_config((9, 0), **dict(kw, batch_heads=1, seqlen_q=64, seqlen_k=64)).v_prepass
    monkeypatch.setenv(knobs.SECURE_V_ZEROING_ENV, "bogus")
    with pytest.raises(ValueError, match="FLASHCORE_SECURE_V_ZEROING"):
        select.table_config((9, 0), **kw)


@pytest.mark.parametrize("as_json", [False, True])
def test_publish_writes_the_report_and_prints_once(tmp_path, capsys, as_json):
    import argparse
    import json as _json

    tables = []
    a = argparse.Namespace(out=str(tmp_path / "o"), json=as_json)
    path = I.publish(a, "repro", {"status": "pass", "x": float("nan")}, tables.append)
    assert path == tmp_path / "o" / "repro.json"
    assert _json.loads(path.read_text().replace("NaN", "null"))["status"] == "pass"
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == f"[repro] pass: report {path}"
    assert (len(tables), '"status": "pass"' in out) == ((0, True) if as_json else (1, False))


def test_assign_rows_splits_calls_at_their_main_kernel():
    # secure calls launch a pre-pass before the main kernel where the Gluon kernel runs, and none where the Triton
    # kernel zeroes V in its loop (causal with explicit lengths): 2, 2, 1 and 1 kernels for four calls
    names = ["attn_secure_sanitize_kv_kernel", "attn_fwd_hopper_kernel", "attn_secure_zero_v_padding_kernel",
             "attn_fwd_hopper_kernel", "attn_fwd_kernel", "attn_fwd_kernel"]
    rows = [{"id": i, "kernel": n, "grid": "", "block": "", "metrics": {"m": _cell(i)}} for i, n in enumerate(names)]
    launches = [{"config": c, "class": "a", "rep": 0} for c in ("self", "self", "cross", "cross")]
    m = C.assign_rows(rows, launches)
    assert m[0]["k0:m"]["value"] == 0 and m[0]["k1:m"]["value"] == 1 and m[1]["k1:__kernel__"]["raw"] == names[3]
    assert m[2]["m"]["value"] == 4 and m[3]["m"]["value"] == 5
    with pytest.raises(ValueError, match="main kernel"):  # a call whose main kernel was not profiled
        C.assign_rows(rows[:-1], launches)


def test_timing_decode_slots_pad_the_cache_past_its_length():
    """--kernel decode: one query token per sequence, contiguous caches [B, S_max, Hkv, D] whose positions past the
    secret length are the class's padding, and the call is the secure KV-cache step (here on the CPU reference)."""
    import warnings

    a, b = T.class_specs("pad_zeros_vs_random", 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slots = T.Slots("secure_decode", a, b, P=2, B=2, H=4, Hkv=2, S_max=64, D=64, dtype=torch.float32,
                        causal=True, backend="reference", seed=0, device="cpu")
        slot = slots.slots[0]
        assert slot["spec"] == a and slot["q"].shape == (2, 1, 4, 64) and slot["k"].shape == (2, 64, 2, 64)
        for t in (slot["k"], slot["v"]):
            assert bool((t[:, 32:] == 0).all()) and bool((t[:, :32] != 0).any())
        assert bool((slot["q"] != 0).all()) and slot["sk"].tolist() == [32, 32]
        slots._fill(slot, b, torch.Generator().manual_seed(1))  # the other class: random padding
        assert bool((slot["k"][:, 32:] != 0).any())
        assert slots.eager[0]().shape == (2, 1, 4, 64)


def test_decode_kind_is_the_secure_kvcache_step_on_the_cases_cache():
    """The counters and repro gates' decode input: q's row 0 (valid in every class) as the one query token, k and v
    as contiguous caches [B, S_max, Hkv, D], the key lengths as cache_seqlens; the padding family's outputs agree
    bit for bit, an empty cache outputs zeros (here on the CPU reference)."""
    import warnings

    from flashcore.audit import _inputs as I
    from flashcore.audit import repro

    assert "secure_decode" in I.SECURE_KINDS and "secure_decode" in repro.MODES
    cases = {c: I.build_case(c, B=2, H=4, Hkv=2, S=32, D=16, dtype=torch.float32, seed=3)
             for c in ("len_half", "nan_pad", "inf_pad", "empty_keys")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = {c: I.make_call("secure_decode", case, causal=True, backend="reference")() for c, case in cases.items()}
    assert outs["len_half"].shape == (2, 1, 4, 16)
    chk = C._decode_output_checks(cases, outs)
    assert chk["pass"] and chk["padding_invariance"]["identical"] and chk["zero_rows"]["empty_keys"]
    assert bool((outs["empty_keys"][0] == 0).all()) and not bool((outs["empty_keys"][1] == 0).all())
    assert C._is_secure_config("secure_decode/causal/n/a") and not C._is_secure_config("fast_varlen/causal/n/a")


def test_decode_kind_on_pages_is_the_same_attention():
    """page_size: the caches as pages in a public shuffled order with their table give the contiguous cache's output
    (the counters gate's paged decode input); the timing slots page the same memory in order."""
    import warnings

    from flashcore.audit import _inputs as I

    case = I.build_case("nan_pad", B=2, H=4, Hkv=2, S=64, D=16, dtype=torch.float32, seed=5)
    pages, table = I.paged_cache(case.k.transpose(1, 2).contiguous(), 16)
    assert pages.shape == (8, 16, 2, 16) and sorted(table.flatten().tolist()) == list(range(8))
    assert table.flatten().tolist() != list(range(8))  # shuffled: the gather is exercised
    assert torch.equal(pages[table[1, 1]], case.k.transpose(1, 2)[1, 16:32])  # (32: is the NaN padding)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flat = I.make_call("secure_decode", case, causal=True, backend="reference")()
        paged = I.make_call("secure_decode", case, causal=True, backend="reference", page_size=16)()
        assert torch.equal(flat, paged)
        a, b = T.class_specs("pad_zeros_vs_random", 64)
        slots = T.Slots("secure_decode", a, b, P=1, B=2, H=4, Hkv=2, S_max=64, D=16, dtype=torch.float32,
                        causal=True, backend="reference", seed=0, device="cpu", page_size=16)
        out = slots.eager[0]()
        slot = slots.slots[0]
        ref = torch.nn.functional.scaled_dot_product_attention(
            slot["q"].transpose(1, 2), slot["k"][:, :32].transpose(1, 2).repeat_interleave(2, 1),
            slot["v"][:, :32].transpose(1, 2).repeat_interleave(2, 1)).transpose(1, 2)
        assert torch.allclose(out, ref, atol=1e-5)


def test_prefill_kind_is_the_secure_kvcache_call_with_a_chunk_of_queries():
    """The gates' chunked-prefill input (``secure_prefill``): q's first PREFILL_QUERIES rows as the chunk, the case's
    k and v as the cache (contiguous or paged), the key lengths as cache_seqlens, causal bottom-right: the padding
    family's outputs agree bit for bit and an empty cache outputs zeros in every row (here on the CPU reference); the
    timing slots hold the same chunk."""
    import warnings

    from flashcore import reference as R
    from flashcore.audit import _inputs as I
    from flashcore.audit import repro

    assert "secure_prefill" in I.SECURE_KINDS and "secure_prefill" in repro.MODES and "secure_prefill" in T.SECURE_KERNELS
    S, sq = I.PREFILL_QUERIES + 64, I.PREFILL_QUERIES
    cases = {c: I.build_case(c, B=2, H=4, Hkv=2, S=S, D=16, dtype=torch.float32, seed=3)
             for c in ("len_half", "nan_pad", "inf_pad", "empty_keys")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = {c: I.make_call("secure_prefill", case, causal=True, backend="reference")() for c, case in cases.items()}
        paged = I.make_call("secure_prefill", cases["nan_pad"], causal=True, backend="reference", page_size=16)()
        c = cases["len_half"]
        q, k, v = (t.transpose(1, 2) for t in (I.prefill_queries(c.q), c.k, c.v))
        ref = R.attention_with_kvcache(q.double(), k.double(), v.double(), cache_seqlens=c.seqlens_k, causal=True)
    assert outs["len_half"].shape == (2, sq, 4, 16)
    assert torch.allclose(outs["len_half"].double(), ref, atol=1e-5)
    assert torch.equal(paged, outs["nan_pad"])
    chk = C._decode_output_checks(cases, outs)
    assert chk["pass"] and chk["padding_invariance"]["identical"] and chk["zero_rows"]["empty_keys"]
    assert bool((outs["empty_keys"][0] == 0).all()) and not bool((outs["empty_keys"][1] == 0).all())
    a, b = T.class_specs("short_vs_long", 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slots = T.Slots("secure_prefill", a, b, P=1, B=2, H=4, Hkv=2, S_max=64, D=16, dtype=torch.float32,
                        causal=True, backend="reference", seed=0, device="cpu")
        assert slots.slots[0]["q"].shape == (2, sq, 4, 16) and slots.eager[0]().shape == (2, sq, 4, 16)


def test_cross_lens_mode_times_and_reproduces_the_secret_diagonal_call():
    """The gates' inputs for causal attention with explicit query lengths (the secret-diagonal form, perf-notes v36):
    timing's ``lens_mode="cross"`` slots pass a query-length tensor of their own (the same tensor as the key
    lengths would be the self-attention form), rewritten with each class's length as the key lengths are; the repro
    gate's ``secure_cross_causal`` mode is that call (here on the CPU reference)."""
    import warnings

    from flashcore.audit import _inputs as I
    from flashcore.audit import repro

    assert "secure_cross_causal" in repro.MODES
    a, b = T.class_specs("short_vs_long", 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slots = T.Slots("secure", a, b, P=1, B=2, H=4, Hkv=2, S_max=64, D=16, dtype=torch.float32, causal=True,
                        backend="reference", seed=0, device="cpu", lens_mode="cross")
        slot = slots.slots[0]
        assert slot["sq"] is not slot["sk"] and slot["sq"].tolist() == slot["sk"].tolist() == [a.length] * 2
        slots._fill(slot, b, torch.Generator().manual_seed(1))
        assert slot["sq"].tolist() == slot["sk"].tolist() == [b.length] * 2
        out = slots.eager[0]()
        ref = flashcore.reference.attention(slot["q"], slot["k"], slot["v"], causal=True, seqlens_q=slot["sq"],
                                            seqlens_k=slot["sk"])
        assert torch.allclose(out.double(), ref, atol=1e-5)
        self_slots = T.Slots("secure", a, b, P=1, B=2, H=4, Hkv=2, S_max=64, D=16, dtype=torch.float32, causal=True,
                             backend="reference", seed=0, device="cpu")
        assert "sq" not in self_slots.slots[0]
        case = I.build_case("masked_rows", B=2, H=4, Hkv=2, S=32, D=16, dtype=torch.float32, seed=3)
        out = repro._mode_call("secure_cross_causal", case, "reference")()
        ref = flashcore.reference.attention(case.q, case.k, case.v, causal=True, seqlens_q=case.seqlens_q,
                                            seqlens_k=case.seqlens_k)
    assert torch.allclose(out.double(), ref, atol=1e-5)


def test_repro_paged_decode_modes_read_the_same_cache_as_the_contiguous_ones():
    """Gate 3's paged decode modes (a 16-bit cache through 16-position pages, FP8 through 16- and 128-position
    pages) are the contiguous modes' calls on the same cache, shuffled into pages: the same output on the CPU
    reference, bit for bit."""
    import warnings

    from flashcore.audit import _inputs as I
    from flashcore.audit import repro

    case = I.build_case("len_half", B=2, H=4, Hkv=2, S=256, D=16, dtype=torch.float16, seed=11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = {m: repro._mode_call(m, case, "reference")() for m in
               ("secure_decode", "secure_decode_page16", "secure_decode_fp8", "secure_decode_fp8_page16",
                "secure_decode_fp8_page128")}
    assert torch.isfinite(out["secure_decode"]).all() and torch.isfinite(out["secure_decode_fp8"]).all()
    assert torch.equal(out["secure_decode_page16"], out["secure_decode"])
    assert torch.equal(out["secure_decode_fp8_page16"], out["secure_decode_fp8"])
    assert torch.equal(out["secure_decode_fp8_page128"], out["secure_decode_fp8"])
    assert not torch.equal(out["secure_decode_fp8"], out["secure_decode"])  # the FP8 modes read the FP8 cache


def test_fp8_decode_input_descales_from_the_valid_rows_only():
    """kv_dtype="fp8": the gates' FP8 caches (float8_e4m3fn, descales per (sequence, K/V head)) take their descales
    from the true lengths' rows only, so NaN/Inf padding changes neither a descale nor a valid byte, and the padding
    family's outputs stay equal bit for bit (here on the CPU reference), contiguous or as shuffled pages; the FP8 cache
    is the case's cache within e4m3's rounding; the option is refused outside the KV-cache kinds."""
    import warnings

    from flashcore.audit import _inputs as I
    from flashcore.audit import repro

    assert {"secure_decode_fp8", "secure_decode_fp8_page16"} <= set(repro.MODES)
    cases = {c: I.build_case(c, B=2, H=4, Hkv=2, S=64, D=16, dtype=torch.float16, seed=7)
             for c in ("len_half", "nan_pad", "inf_pad", "empty_keys")}
    caches = {c: I.fp8_cache(case.k.transpose(1, 2).contiguous(), case.lens_k) for c, case in cases.items()}
    ref_cache, ref_scale = caches["len_half"]
    assert ref_cache.dtype == torch.float8_e4m3fn and ref_scale.shape == (2, 2) and ref_scale.dtype == torch.float32
    for c in ("nan_pad", "inf_pad"):
        cache, scale = caches[c]
        assert torch.equal(scale, ref_scale)
        assert torch.equal(cache[:, :32].view(torch.uint8), ref_cache[:, :32].view(torch.uint8))
    assert torch.isnan(caches["nan_pad"][0][:, 32:].float()).all()
    assert torch.equal(caches["empty_keys"][1][0], torch.ones(2))  # no valid row: descale 1
    k = cases["len_half"].k.transpose(1, 2)[:, :32].float()
    back = ref_cache[:, :32].float() * ref_scale[:, None, :, None]
    assert torch.allclose(back, k, rtol=0.07, atol=1e-6) and not torch.equal(back, k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for page in (0, 16):
            outs = {c: I.make_call("secure_decode", case, causal=True, backend="reference", kv_dtype="fp8",
                                   page_size=page)() for c, case in cases.items()}
            assert torch.equal(outs["len_half"], outs["nan_pad"]) and torch.equal(outs["len_half"], outs["inf_pad"])
            assert not torch.isnan(outs["len_half"]).any() and bool((outs["empty_keys"][0] == 0).all())
        flat = I.make_call("secure_decode", cases["len_half"], causal=True, backend="reference")()
        assert torch.allclose(outs["len_half"], flat, rtol=0.1, atol=0.05) and not torch.equal(outs["len_half"], flat)
    with pytest.raises(ValueError, match="kv_dtype"):
        I.make_call("secure", cases["len_half"], causal=False, lens_mode="self", kv_dtype="fp8")
    with pytest.raises(ValueError, match="kv_dtype"):
        I.make_call("secure_decode", cases["len_half"], causal=True, kv_dtype="e5m2")


@pytest.mark.parametrize("page", [0, 16])
def test_timing_slots_hold_an_fp8_cache(page):
    """Gate 4's FP8 input (``kv_dtype="fp8"``): the KV-cache slots hold float8_e4m3fn caches with the same constant
    descales for both classes, a class's zero padding is zero bytes past its length, and the slot's call attends to
    the dequantised cache (here on the CPU reference); other kernels refuse the option."""
    import warnings

    a, b = T.class_specs("pad_zeros_vs_random", 64)
    assert {a.pad, b.pad} == {"zeros", "values"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slots = T.Slots("secure_decode", a, b, P=1, B=2, H=4, Hkv=2, S_max=64, D=16, dtype=torch.float16,
                        causal=True, backend="reference", seed=0, device="cpu", page_size=page, kv_dtype="fp8")
        for slot, fn in zip(slots.slots, slots.eager):
            k, v, L = slot["k"], slot["v"], slot["spec"].length
            assert k.dtype == v.dtype == torch.float8_e4m3fn
            pad_bytes = k.view(torch.uint8)[:, L:]
            assert bool((pad_bytes == 0).all()) == (slot["spec"].pad == "zeros")
            assert not bool((k.view(torch.uint8)[:, :L] == 0).all())
            out = fn()
            kk, vv = (t[:, :L].float() * 0.25 for t in (k, v))
            ref = torch.nn.functional.scaled_dot_product_attention(
                slot["q"].float().transpose(1, 2), kk.transpose(1, 2).repeat_interleave(2, 1),
                vv.transpose(1, 2).repeat_interleave(2, 1)).transpose(1, 2)
            assert torch.allclose(out.float(), ref, atol=2e-3, rtol=1e-2)
    for kernel, kv in (("secure", "fp8"), ("secure_decode", "e5m2")):
        with pytest.raises(ValueError, match="kv_dtype"):
            T.Slots(kernel, a, b, P=1, B=2, H=4, Hkv=2, S_max=64, D=16, dtype=torch.float16, causal=True,
                    backend="reference", seed=0, device="cpu", kv_dtype=kv)
