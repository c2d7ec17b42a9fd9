"""The training benchmark's pieces that run without a GPU: suites, FLOP counting, the tables, the CLI's errors, and
the README's backward table, which must be the committed run's (generated, never typed)."""
import json
import os
import re
import subprocess
import sys

import pytest

from flashcore.bench.training import (BWD_FLOP_FACTOR, SUITES, TrainCase, best_peer, deterministic_table,
                                      markdown_table, results_table,
                                      training_suite)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_suites_hold_the_issue_shapes():
    large = {c.label for c in training_suite("large")}
    assert {"4x32x4096x128", "4x32x4096x128 causal", "1x32x16384x128", "1x32x16384x128 causal", "8x16x2048x64",
            "4x32x4096x64 causal"} == large
    for c in SUITES["train"]():
        assert c.B * c.S == 16384 and c.Hkv == 8 and 16 <= c.Hq <= 64 and c.D in (64, 128) and c.causal
    assert len(training_suite("all")) == len(training_suite("train")) + len(training_suite("train-large"))
    with pytest.raises(ValueError, match="training suites"):
        training_suite("decode")


def test_flops_count_the_pairs_the_mask_keeps():
    c = TrainCase(2, 4, 4, 8, 16, False)
    assert c.fwd_flops == 4 * 2 * 4 * 16 * 64
    assert TrainCase(2, 4, 4, 8, 16, True).fwd_flops == 4 * 2 * 4 * 16 * 36  # 8 * 9 / 2 pairs
    assert BWD_FLOP_FACTOR == 2.5


def _doc():
    ok = lambda tf: {"status": "ok", "fwd_tflops": tf, "bwd_tflops": tf / 2, "fwdbwd_tflops": tf / 3}  # noqa: E731
    return {"config": {"passes": ["fwd", "bwd"], "backends": ["flashcore", "sdpa-cudnn", "fa4"]},
            "results": [{"label": "1x2x64x64", "backends": {"flashcore": ok(300.0), "sdpa-cudnn": ok(400.0),
                                                            "fa4": {"status": "unavailable"}}}]}


def test_tables_name_the_fastest_peer_and_the_ratio():
    doc = _doc()
    assert best_peer(doc["results"][0], "bwd_tflops") == (200.0, "sdpa-cudnn")
    md = markdown_table(doc)
    assert "| 1x2x64x64 | 150 | 200 | unavailable | 0.75x (sdpa-cudnn) |" in md
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(results_table(doc))
    assert "0.75x sdpa-cudnn" in console.export_text()


def test_sustained_rows_join_the_tables_when_the_run_has_them():
    """A run with --sustained reports the steady-load backward and forward+backward beside do_bench's, each with
    its own fastest peer (the peer can differ between the two ways of timing)."""
    doc = _doc()
    doc["config"]["sustained_s"] = 2.0
    r = doc["results"][0]["backends"]
    r["flashcore"].update(bwd_sustained_tflops=380.0, fwdbwd_sustained_tflops=350.0)
    r["sdpa-cudnn"].update(bwd_sustained_tflops=400.0, fwdbwd_sustained_tflops=360.0)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(results_table(doc))
    text = console.export_text()
    assert "bwd, sustained" in text and "0.95x sdpa-cudnn" in text and "0.75x sdpa-cudnn" in text
    assert "| 1x2x64x64 | 380 | 400 | unavailable | 0.95x (sdpa-cudnn) |" in markdown_table(doc, "bwd_sustained_tflops")
    del doc["config"]["sustained_s"]  # a run without it: no sustained rows
    console = Console(width=200, record=True)
    console.print(results_table(doc))
    assert "sustained" not in console.export_text()


def test_readme_backward_table_is_the_committed_run():
    readme = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- train-table: (\S+) -->\n(.*?)\n<!-- /train-table -->", readme, re.S)
    assert m, "README lost its generated backward table"
    doc = json.load(open(os.path.join(ROOT, m.group(1))))
    gpu = doc["environment"]["gpu"]["name"]
    assert gpu.startswith(("NVIDIA H100", "NVIDIA H200"))
    intro = readme[:m.start()].rsplit("\n\n", 1)[-1]  # the paragraph that introduces the table names its GPU
    assert gpu.removeprefix("NVIDIA ") in intro and doc["environment"]["git_sha"] in intro
    assert m.group(2).strip() == markdown_table(doc).strip(), "README's backward table is stale: regenerate it"


def test_readme_sustained_backward_table_is_the_committed_run():
    """The steady-load table (``--sustained``) is generated from a committed run that has those timings."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- train-sustained-table: (\S+) -->\n(.*?)\n<!-- /train-sustained-table -->", readme, re.S)
    assert m, "README lost its generated steady-load backward table"
    doc = json.load(open(os.path.join(ROOT, m.group(1))))
    assert doc["config"]["sustained_s"] > 0 and doc["config"]["sustained_rounds"] >= 2
    assert doc["environment"]["gpu"]["name"].removeprefix("NVIDIA ") in readme[m.start() - 1500:m.start()]
    assert m.group(2).strip() == markdown_table(doc, "bwd_sustained_tflops").strip(), "stale: regenerate it"


def test_deterministic_table_gives_its_speed_as_a_fraction_of_the_default():
    doc = _doc()
    r = doc["results"][0]["backends"]
    r["flashcore"].update(bwd_sustained_tflops=400.0)
    r["flashcore-deterministic"] = dict(status="ok", bwd_sustained_tflops=340.0)
    assert "| 1x2x64x64 | 400 | 340 | 0.85x |" in deterministic_table(doc)
    del r["flashcore-deterministic"]
    assert "| 1x2x64x64 | - | - | - |" in deterministic_table(doc)


def test_readme_deterministic_table_is_the_committed_run():
    """deterministic=True beside the default, steady-load backward, from a committed run with both."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- train-deterministic-table: (\S+) -->\n(.*?)\n<!-- /train-deterministic-table -->", readme,
                  re.S)
    assert m, "README lost its generated deterministic table"
    doc = json.load(open(os.path.join(ROOT, m.group(1))))
    assert {"flashcore", "flashcore-deterministic"} <= set(doc["config"]["backends"])
    assert doc["environment"]["gpu"]["name"].removeprefix("NVIDIA ") in readme[m.start() - 1500:m.start()]
    assert doc["environment"]["git_sha"] in readme[m.start() - 1500:m.start()]
    assert m.group(2).strip() == deterministic_table(doc).strip(), "stale: regenerate it"


def test_cli_refuses_a_suite_it_does_not_know():
    r = subprocess.run([sys.executable, "-m", "flashcore", "bench", "--pass", "bwd", "--suite", "decode"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src")))
    assert r.returncode == 2 and "training suites" in r.stdout + r.stderr


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "two"])
def test_cli_refuses_a_sustained_window_that_is_not_a_number_of_seconds(value):
    """--sustained takes seconds (0 turns it off): a negative, NaN, infinite or non-number is refused by name, before any
    GPU."""
    r = subprocess.run([sys.executable, "-m", "flashcore", "bench", "--pass", "bwd", "--sustained", value],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src")))
    assert r.returncode == 2 and "--sustained" in r.stderr


@pytest.mark.parametrize("argv", [["--sustained", "2"], ["--pass", "fwd", "--sustained", "2"],
                                  ["--suite", "decode", "--sustained", "2"]])
def test_cli_refuses_sustained_without_a_backward_pass(argv):
    """--sustained times training steps: without --pass bwd or fwd+bwd it is an error, not silently ignored."""
    r = subprocess.run([sys.executable, "-m", "flashcore", "bench", *argv], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src")))
    assert r.returncode == 2 and "--sustained" in r.stdout + r.stderr
