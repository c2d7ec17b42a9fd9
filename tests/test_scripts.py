"""CPU checks of the GPU tools' pure parts: ``flashcore.bench.experiments`` and what is left in scripts/ (the GPU
parts run only on the device). The ``flashcore bench`` tools are checked in test_bench_cli.py."""
import importlib
import json
import os
import pkgutil
import re

import pytest

from flashcore.bench import experiments
from flashcore.bench.experiments import audit_gpu, cost_fit, gluon_ab, ncu_compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = sorted(m.name for m in pkgutil.iter_modules(experiments.__path__))


def test_scripts_holds_only_what_is_not_part_of_the_library():
    assert sorted(os.listdir(os.path.join(ROOT, "scripts"))) == ["demo.sh", "l2_control.py", "l2_control_fp8.py"]


def test_the_fp8_l2_control_summary_groups_launches_by_class_in_launch_order(tmp_path, capsys):
    """scripts/l2_control_fp8.py's per-class table (docs/security.md §5.17): ncu numbers its launches in the order the
    script makes them (classes interleaved, repetition by repetition), and each launch goes to its class."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("l2_control_fp8", os.path.join(ROOT, "scripts", "l2_control_fp8.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    header = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Metric Name", "Metric Unit",
              "Metric Value"]
    rows = [header]
    n = len(mod.CLASSES)
    for launch in range(2 * n):  # two repetitions; the value says which class the script launched
        rows.append([str(launch), "1", "python", "h", "stream_kernel", "lts__t_sectors.sum", "sector",
                     f"{1000 * (launch % n) + launch // n:,}"])
    path = tmp_path / "log.csv"
    path.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in rows))
    mod.summarize(str(path))
    cells = dict(re.findall(r"(\w+) ([\d,]+±[\d,]+)", capsys.readouterr().out))
    # each class: the mean of 1000*i and 1000*i + 1 (as printed, rounded), spread 1
    assert cells == {name: f"{1000 * i + 0.5:,.0f}±1" for i, name in enumerate(mod.CLASSES)}, cells


def test_the_experiments_docstring_lists_every_experiment():
    listed = re.findall(r"^\* ``(\w+)``", experiments.__doc__, re.M)
    assert sorted(listed) == EXPERIMENTS and len(EXPERIMENTS) == 17


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_runs_as_a_module_with_help(name, capsys):
    mod = importlib.import_module(f"flashcore.bench.experiments.{name}")
    with pytest.raises(SystemExit) as info:
        mod.main(["--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m flashcore.bench.experiments.{name} [-h] [--out OUT]")


@pytest.mark.parametrize("attrs", [["fast_sum_mma"], ["fast_sum_mma", "causal_pairs"],
                                   ["softmax_turns", "serial_pv", "tree_reductions"],
                                   ["softmax_turns", "sum_tiles"]])  # the same initials
def test_gluon_ab_variants_are_distinct(attrs):
    """Every on/off combination of the switches gets its own variant name (two switches with the same first
    letter once collided, and one combination silently went unmeasured)."""
    ab = gluon_ab
    ab.set_variants(attrs)
    n = 2 ** len(attrs)
    assert len(ab.VARIANTS) == 2 * n
    assert len(ab.names("auto")) == n and len(ab.names("gluon")) == n
    combos = {tuple(sorted(ons.items())) for cfg, ons in ab.VARIANTS.values() if cfg is None}
    assert len(combos) == n
    assert ab.VARIANTS["auto_-"][1] == {a: False for a in attrs}


def test_gluon_ab_integer_settings():
    """``name=v1,v2`` compares an integer switch (``stagger``) at those values; a boolean switch keeps off/on; a
    name that is neither, or values of the wrong type, is refused."""
    ab = gluon_ab
    assert ab.parse_attr("stagger=0,1,2") == ("stagger", (0, 1, 2))
    assert ab.parse_attr("fast_sum_mma") == ("fast_sum_mma", (False, True))
    for bad in ("stagger", "stagger=a", "fast_sum_mma=1", "no_such_switch", "no_such=1", "probe_depth=0,1"):
        with pytest.raises(ValueError):
            ab.parse_attr(bad)
    ab.set_variants([ab.parse_attr("stagger=0,2"), ab.parse_attr("fast_sum_mma")])
    assert list(ab.VARIANTS)[:4] == ["auto_s0", "auto_s0.fsm", "auto_s2", "auto_s2.fsm"]
    assert ab.VARIANTS["auto_s2.fsm"][1] == {"stagger": 2, "fast_sum_mma": True}
    assert ab.resolve("gluon") == "gluon_s2.fsm"


def test_gluon_ab_variants_are_valid_knob_overrides():
    """A variant's switches are what ``knobs.override`` takes (an unknown name would raise TypeError there)."""
    from flashcore.plan import knobs

    gluon_ab.set_variants([gluon_ab.parse_attr(a) for a in ("stagger=0,2", "fast_sum_mma", "early_loads")])
    for _, ons in gluon_ab.VARIANTS.values():
        with knobs.override(**ons) as sw:
            assert all(getattr(sw, a) == v for a, v in ons.items())
    assert knobs.gluon_switches() == knobs.GluonSwitches()  # restored


def test_ncu_compare_parses_sweep_config_names():
    nc = ncu_compare
    assert nc.parse_config("auto") is None
    cfg = nc.parse_config("gluon_ws_192x128s3")
    assert (cfg.block_m, cfg.block_n, cfg.num_stages, cfg.kernel) == (192, 128, 3, "gluon_ws")
    cfg = nc.parse_config("64x128w4s3_r168")
    assert (cfg.block_m, cfg.num_warps, cfg.maxnreg, cfg.kernel) == (64, 4, 168, "triton")
    with pytest.raises(SystemExit):
        nc.parse_config("nonsense")


@pytest.mark.parametrize("text", ["auto", "gluon_ws_64x128s3", "gluon_ws_192x128s3", "128x64w8s3", "64x128w4s2_r168",
                                  "128x64w8s3_inloop", "128x64w8s3_tma"])
def test_config_names_round_trip(text):
    from flashcore.plan.tables import config_name, parse_config_name

    assert config_name(parse_config_name(text)) == text


def test_gluon_ab_config_families():
    """--config adds a family per config; with no switches each family is one variant, named by its config."""
    ab = gluon_ab
    ab.set_variants([], ["gluon_ws_64x128s3", "gluon_ws_64x128s2"])
    assert list(ab.VARIANTS) == ["auto_-", "gluon_-", "gluon_ws_64x128s3_-", "gluon_ws_64x128s2_-"]
    cfg, ons = ab.VARIANTS["gluon_ws_64x128s3_-"]
    assert (cfg.block_m, cfg.num_stages, cfg.kernel, ons) == (64, 3, "gluon_ws", {})
    with pytest.raises(ValueError):
        ab.set_variants([], ["no_such_config"])


def test_gluon_ab_parses_shapes_and_maps_config_families_to_variants():
    ab = gluon_ab
    assert ab.parse_shapes("1x16x1024x64,4x16x1024x64c") == [((1, 16, 1024, 64), False), ((4, 16, 1024, 64), True)]
    with pytest.raises(ValueError, match="BxHxSxD"):
        ab.parse_shapes("1x16x1024")
    ab.set_variants([], ["gluon_ws_64x128s2"])
    # a family name (what the checks pass) resolves to its variant, not a KeyError (a device run once failed so)
    assert ab.resolve("gluon_ws_64x128s2") == "gluon_ws_64x128s2_-"
    ab.set_variants(["fast_sum_mma"], ["gluon_ws_64x128s2"])
    assert ab.resolve("gluon_ws_64x128s2") == "gluon_ws_64x128s2_fsm" and ab.resolve("auto") == "auto_fsm"


def test_cost_fit_series_vary_one_count_each(monkeypatch):
    """cost_fit fits time against x per series, so x must be the count that series varies and everything else
    fixed: key tiles per 128-row item at 4 items per program (132 SMs), or items per program at 8 key tiles each."""
    mod = cost_fit
    keys = [s for s in mod.SERIES if s[0] == "keys"]
    items = [s for s in mod.SERIES if s[0] == "items"]
    assert len(keys) >= 3 and len(items) >= 3
    for _, x, B, H, Sq, Sk in keys:
        assert x == Sk // 128 and B * H * (Sq // 128) == 4 * 132
    for _, x, B, H, Sq, Sk in items:
        assert Sq == Sk == 1024 and B * H * (Sq // 128) == x * 132
    monkeypatch.setattr(mod.torch.cuda, "is_available", lambda: False)
    for argv, message in ((["--config", "bogus"], "--config: cannot parse"), (["--rounds", "0"], "--rounds must be"),
                          ([], "needs a CUDA device")):
        with pytest.raises(SystemExit, match=message):
            mod.main(argv)


@pytest.mark.parametrize("quick", [True, False])
def test_audit_gpu_gate_arguments_parse_with_the_gates_own_parsers(quick, tmp_path):
    """audit_gpu drives the gates through flashcore.audit.cli: every option it passes (its --quick plan, and the
    timing gate's budget) must still be one the gate takes, and arrive."""
    plan = audit_gpu._plan(quick)
    assert sorted(plan) == ["counters", "repro", "timing"]
    for gate, extra in plan.items():
        extra = extra + (["--budget-s", "45"] if gate == "timing" else [])
        ns = audit_gpu._gate_args(gate, str(tmp_path), extra)
        assert ns.out == str(tmp_path) and not hasattr(ns, "_import_error")
        if quick:
            assert ns.seqlen == int(extra[extra.index("--seqlen") + 1])
        if gate == "timing":
            assert ns.budget_s == 45


def test_audit_gpu_summary_rows(tmp_path):
    """The summary table's key numbers come from each gate's JSON report; a missing report is an empty cell."""
    (tmp_path / "repro.json").write_text(json.dumps({"modes": {"a": {"distinct_outputs": 1}, "b": {}},
                                                     "cross_process": {"x": {"identical": True}}}))
    assert audit_gpu._summary_row("repro", tmp_path) == "distinct outputs per mode a:1 b:err; cross-process identical"
    (tmp_path / "timing.json").write_text(json.dumps({"tests": [
        {"scope": "in_scope", "test": "t1", "max_abs_t": 1.5, "mean_diff_ns": -2.0},
        {"scope": "in_scope", "test": "t2", "max_abs_t": 3.25, "mean_diff_ns": 4.0},
        {"scope": "contrast", "max_abs_t": 40.0}]}))
    assert audit_gpu._summary_row("timing", tmp_path) == "secure max|t| 3.25 (t2, +4.0 ns); fast contrast max|t| 40.0"
    assert audit_gpu._summary_row("counters", tmp_path) == ""


def test_ncu_compare_splits_a_backward_report_per_kernel():
    """--pass bwd reads one ncu report holding every kernel of a backward: the committed H200 reports (perf-notes v38)
    split into their kernels in launch order, with grids, and each kernel's own metric values, C++ template names
    with spaces and parentheses (cuDNN's) included."""
    import gzip

    base = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results", "sweeps",
                        "ncu-bwd-v38-h200")
    nc = ncu_compare
    with gzip.open(os.path.join(base, "ncu-bwd-4x32x4096x128-fa4-cache-all.txt.gz"), "rt") as f:
        blocks = nc.kernel_blocks(f.read())
    assert [("preprocess" in n, "bwd_sm90" in n, "postprocess" in n) for n, *_ in blocks] == [
        (True, False, False), (False, True, False), (False, False, True)]
    assert [g for _, g, _, _ in blocks] == [(52, 32, 4), (32, 32, 4), (52, 32, 4)] and blocks[1][2] == (384, 1, 1)
    vals = [nc.metric_values(body, nc.BWD_METRICS) for *_, body in blocks]
    assert [v["gpu__time_duration.sum"] for v in vals] == ["155,616", "3,997,888", "93,664"]
    assert vals[1]["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"] == "77.52"
    with gzip.open(os.path.join(base, "ncu-bwd-4x32x4096x128-sdpa-cudnn-cache-all.txt.gz"), "rt") as f:
        names = [n for n, *_ in nc.kernel_blocks(f.read())]
    assert len(names) == 3 and names[0].startswith("void cudnn::compute_dot_do_o_specialized<1, 128>(")
    assert "bprop" in names[1] and "convert_dq" in names[2]


def test_ncu_compare_builds_its_profiler_commands(tmp_path, monkeypatch):
    """The forward profiles one kernel by name after two launches; the backward every kernel between the child's
    profiler start and stop, its main kernel's per-instruction page with --source; each report lands in --out."""
    import subprocess
    import sys

    nc = ncu_compare
    calls = []

    class Done:
        stdout, stderr = "  attn_fwd (1, 1, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n", ""

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if "--import" not in cmd:
            (tmp_path / "ncu-bwd-1x2x128x64-causal-fa4-cache-all.ncu-rep").write_text("")
        return Done()

    monkeypatch.setattr(subprocess, "run", fake_run)
    nc.main(["--shape", "1,2,128,64", "--out", str(tmp_path)])
    fwd = calls[-1]
    assert fwd[fwd.index("-k") + 1] == "regex:attn_fwd" and fwd[fwd.index("--launch-skip") + 1] == "2"
    assert fwd[-4:] == ["--shape", "1,2,128,64", "--child", "auto"] and sys.executable in fwd
    calls.clear()
    nc.main(["--pass", "bwd", "--shape", "1,2,128,64", "--causal", "--peer", "fa4", "--source", "--out",
             str(tmp_path)])
    bwd = calls[0]
    assert bwd[bwd.index("--profile-from-start") + 1] == "off" and "--launch-skip" not in bwd
    assert bwd[bwd.index("-k") + 1] == nc.MAIN_BWD_KERNEL["fa4"] and "SourceCounters" in bwd
    assert bwd[-7:] == ["--pass", "bwd", "--shape", "1,2,128,64", "--child", "fa4", "--causal"]
    assert [c[c.index("--page") + 1] for c in calls[1:]] == ["source", "details"]
    assert (tmp_path / "ncu-bwd-1x2x128x64-causal-fa4-cache-all.txt").exists()
    assert (tmp_path / "ncu-src-bwd-1x2x128x64-causal-fa4-cache-all.csv").exists()
    calls.clear()
    wide = "32x128w4s3-64x64w4s3-atomic-gluon128x128w8s2"
    nc.main(["--pass", "bwd", "--shape", "1,2,128,64", "--peer", "flashcore", "--config", wide, "--out", str(tmp_path)])
    assert calls[0][-7:] == ["--pass", "bwd", "--shape", "1,2,128,64", "--child", "flashcore", "--bwd-config=" + wide]
    assert (tmp_path / f"ncu-bwd-1x2x128x64-flashcore-{wide}-cache-all.txt").exists()
    with pytest.raises(SystemExit):
        nc.main(["--shape", "1,2,128,64", "--causal", "--out", str(tmp_path)])  # --causal is for --pass bwd
    for bad in (["--peer", "fa4", "--config", wide], ["--peer", "flashcore", "--config", "64x64"]):
        with pytest.raises(SystemExit):
            nc.main(["--pass", "bwd", "--shape", "1,2,128,64", *bad, "--out", str(tmp_path)])
