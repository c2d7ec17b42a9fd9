"""`flashcore bench` / `flashcore info` argument handling, on a machine without a GPU."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from flashcore.bench import cli as bench_cli
from flashcore.bench import results as R
from flashcore.bench.suites import Shape

no_gpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


def _main(argv):
    """Through flashcore's own CLI when its other sub-commands import, else through register() alone."""
    from flashcore import cli

    try:
        cli.build_parser()
    except ImportError:  # demo/audit sub-commands not written yet
        return bench_cli.main(argv)
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
