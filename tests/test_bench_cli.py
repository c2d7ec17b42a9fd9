"""`flashcore bench` / `flashcore info` argument handling, on a machine without a GPU."""
from __future__ import annotations

import argparse
import json
import os

import pytest
import torch

from flashcore.bench import cli as bench_cli
from flashcore.bench import results as R
from flashcore.bench.suites import Shape

no_gpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


def _main(argv):
    """Through flashcore's own CLI (``flashcore.cli.main``)."""
    from flashcore import cli

    return cli.main(argv)


def _own_parser():
    parser = argparse.ArgumentParser(prog="flashcore")
    sub = parser.add_subparsers(dest="command")
    bench_cli.register(sub)
    return parser


def test_register_adds_bench_and_info_with_funcs():
    parser = _own_parser()
    args = parser.parse_args(["bench", "--suite", "large", "--backends", "flashcore", "fa4", "--dtype", "fp16",
                              "--plot", "--out", "x"])
    assert args.func is bench_cli.run_bench
    assert (args.suite, args.backends, args.dtype, args.plot, args.out) == ("large", ["flashcore", "fa4"], "fp16", True, "x")
    assert parser.parse_args(["info"]).func is bench_cli.run_info
    defaults = parser.parse_args(["bench"])
    assert (defaults.suite, defaults.dtype, defaults.compare) == ("seed", "bf16", None)


@no_gpu_only
def test_bench_without_gpu_exits_2_with_a_clear_message(capsys):
    assert _main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device is present" in err
    assert "--compare" in err  # says what still works


def test_bad_dtype_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        _main(["bench", "--dtype", "fp8"])
    assert info.value.code == 2
    assert "--dtype" in capsys.readouterr().err


def test_compare_needs_two_files(capsys):
    with pytest.raises(SystemExit) as info:
        _main(["bench", "--compare", "only_one.json"])
    assert info.value.code == 2
    assert "--compare" in capsys.readouterr().err


def test_missing_suite_file(tmp_path, capsys):
    assert _main(["bench", "--suite", str(tmp_path / "nope.json")]) == 2
    assert "suite file not found" in capsys.readouterr().err


def test_bad_suite_file_names_the_field(tmp_path, capsys):
    path = tmp_path / "suite.json"
    path.write_text(json.dumps([{"B": 1, "Hq": 8, "Hkv": 3, "Sq": 64, "D": 64}]))
    assert _main(["bench", "--suite", str(path)]) == 2
    err = capsys.readouterr().err
    assert "'Hkv'" in err and "shape #0" in err
    assert "no CUDA" not in err  # the suite is validated before the device check


def test_unknown_backend(capsys):
    assert _main(["bench", "--backends", "flashcore,nosuch"]) == 2
    assert "unknown backend 'nosuch'" in capsys.readouterr().err


def test_bad_rep_ms(capsys):
    with pytest.raises(SystemExit) as info:
        _main(["bench", "--rep-ms", "-3"])
    assert info.value.code == 2


def _synthetic_document(medians):
    """The document builder of test_bench_results.py, loaded by path (works in any pytest import mode)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).with_name("test_bench_results.py")
    spec = importlib.util.spec_from_file_location("_bench_results_for_cli", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synthetic_document(medians)


def _write_run(path, medians):
    R.save_document(_synthetic_document(medians), str(path))
    return str(path)


def test_compare_two_runs_without_gpu(tmp_path, capsys):
    s = Shape.dense(1, 8, 512, 64)
    a = _write_run(tmp_path / "a.json", {s: {"flashcore": 10.0, "sdpa-default": 20.0}})
    b = _write_run(tmp_path / "b.json", {s: {"flashcore": 5.0, "sdpa-default": 20.0}})
    assert _main(["bench", "--compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "0.500" in out and "1.000" in out and "+100.0% speed" in out


def test_compare_merges_several_runs_per_side(tmp_path, capsys):
    s = Shape.dense(1, 8, 512, 64)
    a = ",".join(_write_run(tmp_path / f"a{i}.json", {s: {"flashcore": t}}) for i, t in enumerate((10.0, 30.0, 10.0)))
    b = ",".join(_write_run(tmp_path / f"b{i}.json", {s: {"flashcore": t}}) for i, t in enumerate((5.0, 5.0, 1.0)))
    assert _main(["bench", "--compare", a, b]) == 0
    assert "0.500" in capsys.readouterr().out  # median 5 over median 10: neither outlier decides
    assert _main(["bench", "--compare", a + "," + str(tmp_path / "missing.json"), b]) == 2
    assert "not found" in capsys.readouterr().err


def test_compare_with_a_missing_or_invalid_file(tmp_path, capsys):
    s = Shape.dense(1, 8, 512, 64)
    a = _write_run(tmp_path / "a.json", {s: {"flashcore": 10.0}})
    assert _main(["bench", "--compare", a, str(tmp_path / "missing.json")]) == 2
    assert "not found" in capsys.readouterr().err
    junk = tmp_path / "junk.json"
    junk.write_text(json.dumps({"hello": 1}))
    assert _main(["bench", "--compare", a, str(junk)]) == 2
    assert "not a flashcore bench result" in capsys.readouterr().err


@no_gpu_only
def test_info_works_without_gpu(capsys):
    assert _main(["info"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out
    assert torch.__version__ in out
    for name in ("flashcore", "sdpa-cudnn", "flex", "fa4", "unfused"):
        assert name in out


# ---------------------------------------------------------------- the tools: flashcore bench gpu-check|sweep|timeline
def test_every_earlier_bench_invocation_still_runs_the_benchmark():
    """The tools are sub-commands of ``bench``; ``bench`` alone and with its own options still means the run."""
    parser = _own_parser()
    for argv in (["bench"], ["bench", "--suite", "all"], ["bench", "--compare", "a.json", "b.json"],
                 ["bench", "--backends", "flashcore", "sdpa-default", "--suite", "large"]):
        args = parser.parse_args(argv)
        assert args.func is bench_cli.run_bench and args.bench_tool is None, argv
    args = parser.parse_args(["bench", "--backends", "flashcore", "sdpa-default"])
    assert args.backends == ["flashcore", "sdpa-default"] and args.suite == "seed"


def test_the_tools_are_registered_under_bench():
    from flashcore.bench import gpu_check, sweep, timeline_run

    parser = _own_parser()
    args = parser.parse_args(["bench", "gpu-check"])
    assert args.func is gpu_check.run
    assert (args.suite, args.out, args.skip_tests) == ("all", bench_cli.DEFAULT_OUT, False)
    assert os.path.isdir(os.path.join(args.tests_root, "tests"))  # this checkout's
    args = parser.parse_args(["bench", "gpu-check", "--suite", "seed", "--skip-tests", "--out", "o"])
    assert (args.suite, args.out, args.skip_tests) == ("seed", "o", True)
    args = parser.parse_args(["bench", "sweep", "--quick", "--d64"])
    assert args.func is sweep.run and (args.suite, args.quick, args.d64, args.current) == ("all", True, True, False)
    args = parser.parse_args(["bench", "timeline", "--shapes", "1x16x1024x64", "--reps", "2"])
    assert args.func is timeline_run.run and (args.shapes, args.config, args.reps) == ("1x16x1024x64", "auto", 2)
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "no-such-tool"])


@pytest.mark.parametrize("tool", ["gpu-check", "sweep"])
def test_a_tool_refuses_a_bad_suite_before_looking_for_a_gpu(tool, tmp_path, capsys):
    assert _main(["bench", tool, "--suite", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown suite 'nosuch'" in err and f"flashcore bench {tool}" in err


@no_gpu_only
@pytest.mark.parametrize("tool", ["gpu-check", "sweep"])
def test_a_tool_without_gpu_exits_2(tool, tmp_path, capsys):
    assert _main(["bench", tool, "--suite", "seed", "--out", str(tmp_path)]) == 2
    assert "CUDA device" in capsys.readouterr().err
    assert not os.listdir(tmp_path)


def _gpu_check_row(statuses, us=None):
    row = {"key": "1x8x512x64", "shape": {}, "flops": 1}
    for name, status in statuses.items():
        row[name] = {"status": status} if status != "ok" else {"status": "ok", "us": us[name]}
        if status != "ok":
            row[name]["error"] = "why"
    return row


def test_gpu_check_ratios_exit_code_and_table():
    from flashcore.bench import gpu_check as G

    names = [G.key(n) for n in G.BACKENDS]
    assert names == ["flashcore", "flashcore_secure", "sdpa_default", "sdpa_cudnn", "sdpa_flash"]
    us = {"flashcore": 50.0, "flashcore_secure": 80.0, "sdpa_default": 100.0, "sdpa_cudnn": 90.0}
    row = _gpu_check_row({**{n: "ok" for n in us}, "sdpa_flash": "unsupported"}, us)
    G.add_ratios(row)
    assert row["flashcore"]["speedup_vs_sdpa_default"] == 2.0 and row["sdpa_default"]["speedup_vs_sdpa_default"] == 1.0
    assert row["secure_throughput_fraction"] == 50.0 / 80.0 and "speedup_vs_sdpa_default" not in row["sdpa_flash"]
    row["flashcore"]["host_latency_us"], row["sdpa_default"]["host_latency_us"] = 12.5, 20.0
    lines = G.table_lines([row])
    assert lines[1].split() == ["1x8x512x64", "50.0", "80.0", "100.0", "90.0", "-", "2.000", "0.625"]
    assert lines[2] == "host latency of one eager call, 1x8x512x64: flashcore 12.5 us, SDPA 20.0 us"
    doc = {"rows": [row]}
    assert G.exit_code(doc) == 0
    assert G.exit_code({**doc, "gpu_tests": {"exit_code": 0}}) == 0
    assert G.exit_code({**doc, "gpu_tests": {"exit_code": 4}}) == 1  # e.g. pytest found no tests
    for status in ("wrong", "error", "unavailable"):
        bad = _gpu_check_row({**{n: "ok" for n in us}, "flashcore_secure": status, "sdpa_flash": "skipped"}, us)
        G.add_ratios(bad)
        assert G.exit_code({"rows": [row, bad]}) == 1
        assert "secure_throughput_fraction" not in bad and G.table_lines([bad])[1].split()[2] == (
            "ERR" if status != "unavailable" else "-")
    sdpa_down = _gpu_check_row({**{n: "ok" for n in us}, "sdpa_default": "unsupported", "sdpa_flash": "ok"},
                               {**us, "sdpa_flash": 1.0})
    G.add_ratios(sdpa_down)
    assert G.exit_code({"rows": [sdpa_down]}) == 0 and "speedup_vs_sdpa_default" not in sdpa_down["flashcore"]


def test_gpu_check_result_filename():
    from flashcore.bench import gpu_check as G

    env = {"date": "2026-11-22T05:15:36+00:00", "git_sha": "e0d7c4c1234abcd", "gpu": {"name": "NVIDIA H100 80GB HBM3"}}
    assert G.result_filename(env) == "gpu_check-NVIDIA_H100_80GB_HBM3-2026-11-22-e0d7c4c1.json"
    assert G.result_filename({"date": "2026-11-22T05:15:36", "git_sha": "unknown", "gpu": None}) == \
        "gpu_check-nogpu-2026-11-22-unknown.json"


def test_gpu_check_checks_then_times_each_backend(monkeypatch):
    """One shape on CPU through the real inputs and float64 check, with fake backends and a fake do_bench: a
    correct backend is timed (host latency only for flashcore and SDPA on a small shape), a wrong or failing one
    is not, an unavailable or unsupported one is reported as such."""
    from flashcore.bench import backends as B
    from flashcore.bench import gpu_check as G
    from flashcore.bench import timing

    def sdpa(inputs):
        return lambda: torch.nn.functional.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v)

    def wrong(inputs):
        return lambda: sdpa(inputs)().flip(-2)

    def raising(inputs):
        def fn():
            raise RuntimeError("boom")
        return fn

    registry = {"flashcore": sdpa, "flashcore-secure": raising, "sdpa-default": sdpa, "sdpa-cudnn": wrong,
                "sdpa-flash": sdpa}
    registry = {n: B.Backend(n, n, B.Support(B.ALL_DTYPES, gqa=n != "sdpa-flash"), lambda: (True, ""), build)
                for n, build in registry.items()}
    timed = []
    monkeypatch.setattr(timing, "do_bench_median_us", lambda fn, rep_ms: timed.append(rep_ms) or 40.0 + len(timed))
    monkeypatch.setattr(timing, "host_latency_us", lambda fns, calls, budget_s: 9.0)
    available = {n: (n != "sdpa-default", "no such library") for n in registry}
    available["sdpa-default"] = (True, "")
    shape = Shape.dense(1, 2, 64, 16, Hkv=1)  # GQA: sdpa-flash (declared without GQA) is unsupported
    row = G.check_and_time(shape, registry, available, seed=3, device="cpu")
    assert row["key"] == shape.key and row["flops"] == shape.flops
    assert row["flashcore"]["status"] == "ok" and row["flashcore"]["us"] == 41.0 and row["flashcore"]["rel_err"] < 1e-2
    assert row["flashcore"]["host_latency_us"] == 9.0 and row["sdpa_default"]["host_latency_us"] == 9.0
    assert row["sdpa_default"]["us"] == 42.0 and row["flashcore"]["speedup_vs_sdpa_default"] == 42.0 / 41.0
    assert row["flashcore_secure"] == {"status": "error", "error": "RuntimeError: boom"}
    assert row["sdpa_cudnn"]["status"] == "wrong" and "rel err" in row["sdpa_cudnn"]["error"]
    assert row["sdpa_flash"]["status"] == "unsupported" and "GQA" in row["sdpa_flash"]["error"]
    assert timed == [G.REP_MS, G.REP_MS]  # only the two correct backends were timed
    available["flashcore"] = (False, "no such library")
    row = G.check_and_time(shape, registry, available, seed=3, device="cpu")
    assert row["flashcore"] == {"status": "unavailable", "error": "no such library"}


@pytest.mark.parametrize("fail", [False, True])
def test_gpu_check_runs_the_gpu_tests_in_the_given_checkout(tmp_path, fail):
    from flashcore.bench import gpu_check as G

    for path in G.GPU_TESTS:
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(f"def test_one():\n    assert {not fail}\n")
    res = G.run_gpu_tests(str(tmp_path))
    assert res["exit_code"] == (1 if fail else 0)
    assert res["summary"].startswith("3 failed" if fail else "3 passed")


def test_sweep_candidates_and_skips():
    from flashcore.bench import sweep as S
    from flashcore.bench.suites import LARGE, SEED

    seed, large, causal128 = SEED[0], LARGE[0], LARGE[3]
    assert S.candidates(seed) == ((False, S.FAST[64]), (True, []))  # no secure sweep on the seed shapes
    assert S.candidates(large) == ((False, S.FAST[64]), (True, S.SECURE[64]))
    assert S.candidates(causal128) == ((False, S.FAST[128]), (True, S.SECURE[128]))
    assert S.candidates(seed, d64=True) == ((False, S.D64),)
    gluon = S.candidates(seed, d64=True, gluon_only=True)[0][1]
    assert gluon[0] is None and len(gluon) > 1 and all(c.kernel == "gluon_ws" for c in gluon[1:])
    assert S.candidates(causal128, d64=True, current=True) == ((False, [None, S.C(128, 64, 8, 3)]), (True, [None]))
    assert S.skip_reason(seed) is None and S.skip_reason(LARGE[-1]) is None
    assert S.skip_reason(LARGE[-1], quick=True).startswith("--quick")
    assert S.skip_reason(Shape.dense(1, 32, 16384, 128), quick=True).startswith("--quick")
    assert S.skip_reason(Shape.dense(4, 32, 4096, 128), quick=True) is None
    assert S.skip_reason(causal128, d64=True).startswith("--d64") and S.skip_reason(causal128, d64=True, current=True) is None
    for odd in (Shape.dense(1, 8, 512, 64, Hkv=2), Shape.dense(1, 8, 512, 64, Sk=256),
                Shape.packed([100, 200], 8, 64), Shape.dense(1, 8, 512, 96)):
        assert not S.skip_reason(odd).startswith("--")  # a suite file's shape the sweep cannot run: reported


def test_sweep_shape_line():
    from flashcore.bench import sweep as S

    res = {"shape": [1, 8, 512, 64, False], "seed": True, "sdpa_default": 10.0, "sdpa_default_graph": 8.0,
           "fast": {"a": {"us": 8.0, "graph_us": 7.0}, "b": {"us": 5.0, "graph_us": 7.5}, "c": "FAIL x"},
           "secure": {"s": {"us": 10.0}, "t": "WRONG 1"}}
    line = S.shape_line(res)
    assert line.startswith("1x8x512x64  sdpa     10.0 | best fast ")
    assert "b      5.0 (2.000x)" in line and "graph sdpa 8.0 best a 7.0" in line and "best secure s 10.0 (0.500 of fast)" in line
    res["fast"] = {"c": "FAIL x"}
    assert S.shape_line(res).endswith("no fast candidate ran: c FAIL x")


def _without_matplotlib(monkeypatch):
    """As if matplotlib (the ``plot`` extra) were not installed: importing it fails."""
    import sys

    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path):
    from flashcore.bench.plot import PlotUnavailable, plot_document

    _without_matplotlib(monkeypatch)
    doc = {"results": [], "backends": {}}
    with pytest.raises(PlotUnavailable, match=r"install flashcore\[plot\]"):
        plot_document(doc, str(tmp_path / "run.png"))
    assert not (tmp_path / "run.png").exists()


def test_bench_plot_without_matplotlib_stops_before_running(monkeypatch, capsys, tmp_path):
    """``--plot`` without matplotlib is a usage error with the install hint, found before anything is timed (the
    chart is drawn after the run), and no traceback."""
    _without_matplotlib(monkeypatch)
    assert _main(["bench", "--plot", "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "install flashcore[plot]" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())
