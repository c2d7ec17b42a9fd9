"""End-to-end run of the harness on CPU with the GPU parts faked.

The CUDA timer, ceilings and environment are replaced by deterministic fakes; everything else
(registry, correctness check against the float64 reference, status handling, derived ratios,
document schema, table, plot, comparison) is the real code. Backends run on CPU tensors:
flashcore and flashcore-secure (under TRITON_INTERPRET=1 their ``backend="auto"`` calls run the Triton
kernel, as on CUDA tensors, so the check compares a kernel with the reference; the tests assert that
the kernel ran), SDPA default and math, SDPA flash (refuses CPU → "unsupported"), plus two injected
backends: one wrong, one that raises.
"""
from __future__ import annotations

import functools
import io
import json

import pytest
import torch

import flashcore
from conftest import INTERPRET

from flashcore.bench import backends as B
from flashcore.bench import results as R
from flashcore.bench import runner, timing
from flashcore.bench.suites import Shape

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAKE_US = {"flashcore": 50.0, "flashcore-secure": 60.0, "sdpa-default": 100.0, "sdpa-math": 400.0, "sdpa-flash": 80.0}


class FakeTimer:
    device = torch.device("cpu")

    def __init__(self):
        self.calls = {}

    def measure(self, fns, *, flush, rep_ms=100.0, warmup_ms=25.0):
        assert flush == (len(fns) == 1)  # tiny shapes rotate input sets instead of flushing L2
        for fn in (fns[0], fns[-1]):  # the first and last input sets both run
            assert fn() is not None
        name = fns[0].backend_name
        self.calls[name] = self.calls.get(name, 0) + 1
        base = FAKE_US[name] / 1000.0
        return [base * f for f in (1.0, 1.0, 0.9, 1.1, 1.0, 1.3)]


def _tagged(backend):
    """Wrap make_fn so the fake timer knows which backend a callable belongs to."""
    build = backend.build

    def make(inputs):
        fn = build(inputs)

        def tagged():
            return fn()

        tagged.backend_name = backend.name
        return tagged

    backend.build = make
    return backend


def _wrong_build(inputs):
    def fn():
        out = torch.nn.functional.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v, is_causal=inputs.shape.causal)
        return out.flip(-2)  # rows permuted: plausible values, wrong answer
    return fn


def _raising_build(inputs):
    def fn():
        raise RuntimeError("this shape is not supported by the fake library")
    return fn


@pytest.fixture
def fake_gpu(monkeypatch, ran):
    timer = FakeTimer()
    if INTERPRET:  # "auto" on CUDA tensors runs the kernels: on these CPU tensors, the interpreter's
        for name in ("attention", "attention_varlen"):
            monkeypatch.setattr(flashcore, name, functools.partial(getattr(flashcore, name), backend="triton"))
    registry = B.make_registry()
    keep = {n: _tagged(registry[n]) for n in ("flashcore", "flashcore-secure", "sdpa-default", "sdpa-flash", "sdpa-math")}
    for b in keep.values():
        b.probe = lambda: (True, "")
    keep["flex"] = registry["flex"]
    keep["flex"].probe = lambda: (False, "no CUDA device")
    keep["wrongimpl"] = B.Backend("wrongimpl", "deliberately wrong", B.Support(B.ALL_DTYPES), lambda: (True, ""),
                                  _wrong_build)
    keep["raiser"] = B.Backend("raiser", "raises", B.Support(B.ALL_DTYPES), lambda: (True, ""), _raising_build)
    monkeypatch.setattr(runner, "make_registry", lambda math_max_seq=None: keep)
    monkeypatch.setattr(runner, "parse_backend_names", lambda names: list(names))
    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner.torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(runner.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(runner.torch.cuda, "mem_get_info", lambda *a: (80 * 2**30, 80 * 2**30))
    monkeypatch.setattr(timing, "Timer", lambda *a, **k: timer)
    monkeypatch.setattr(timing, "do_bench_median_us", lambda fn, rep_ms=100.0: 123.0)
    monkeypatch.setattr(timing, "host_latency_us", lambda fns: 77.0)
    monkeypatch.setattr(timing, "cuda_graph_us", lambda fn: 11.0)
    monkeypatch.setattr(timing, "measure_ceilings", lambda timer, dtype, rep_ms=100.0: {
        "matmul_tflops": 500.0, "copy_gbps": 2500.0,
        "matmul": {"m": 8192, "n": 8192, "k": 8192, "dtype": "float32", "timing": None},
        "copy": {"bytes": 1, "timing": None}})
    env = {"date": "2025-01-02T03:04:05+00:00", "git_sha": "abcdef1234567", "versions": {"torch": torch.__version__},
           "gpu": {"name": "FAKE GPU", "l2_bytes": 50 * 2**20, "sm_count": 132, "capability": "9.0"}}
    monkeypatch.setattr(runner, "collect_environment", lambda: dict(env))
    return timer


NAMES = ["flashcore", "flashcore-secure", "sdpa-default", "sdpa-flash", "sdpa-math", "flex", "wrongimpl", "raiser"]


def _run(shapes, **kw):
    return runner.run_suite(shapes, NAMES, torch.float32, progress=False, tolerance=1e-4, **kw)


def test_pipeline_statuses_and_derived_figures(fake_gpu, ran):
    shapes = [Shape.dense(2, 4, 64, 16), Shape.dense(1, 4, 48, 16, causal=True, Hkv=2, Sk=80)]
    doc = _run(shapes)
    R.validate_document(doc)
    assert doc["complete"] and doc["aborted"] is None
    dense, cross = (e["backends"] for e in doc["results"])

    # correct backends are timed; wrong/raising ones never are
    assert dense["flashcore"]["status"] == "ok" and dense["flashcore"]["rel_err"] < 1e-6
    assert dense["sdpa-math"]["status"] == "ok"
    assert dense["wrongimpl"]["status"] == "wrong" and dense["wrongimpl"]["timing"] is None
    assert dense["wrongimpl"]["rel_err"] > 1e-2
    assert dense["raiser"]["status"] == "unsupported" and "not supported by the fake" in dense["raiser"]["reason"]
    assert dense["flex"]["status"] == "unavailable"
    assert dense["sdpa-flash"]["status"] == "unsupported"  # declared: no float32
    assert "wrongimpl" not in fake_gpu.calls and "raiser" not in fake_gpu.calls

    # declared limits: SDPA cannot do bottom-right causal with Sq != Sk, flashcore can (GQA too)
    assert cross["flashcore"]["status"] == "ok" and cross["flashcore-secure"]["status"] == "ok"
    assert cross["sdpa-default"]["status"] == "unsupported" and "Sq != Sk" in cross["sdpa-default"]["reason"]

    # what was checked is the kernel (secure and not, dense and cross shapes), never the reference itself
    if INTERPRET:
        assert ran.reference == 0
        runs = {(name, p.secure, p.seqlen_q, p.seqlen_k) for name, p in ran.kernels}
        assert {("triton_fwd", secure, 64, 64) for secure in (False, True)} <= runs, runs
        assert {("triton_fwd", secure, 48, 80) for secure in (False, True)} <= runs, runs
        assert 0 < dense["flashcore"]["rel_err"] and 0 < cross["flashcore-secure"]["rel_err"]

    # derived figures from the fake medians (flashcore 50 µs, SDPA default 100 µs, math 400 µs)
    fc = dense["flashcore"]
    assert fc["timing"]["median_us"] == pytest.approx(50.0)
    assert fc["timing"]["do_bench_median_us"] == 123.0
    assert fc["us_per_head"] == pytest.approx(50.0 / 8)
    flops = 4 * 2 * 4 * 64 * 64 * 16
    assert doc["results"][0]["flops"] == flops
    assert fc["tflops"] == pytest.approx(flops / 50e-6 / 1e12)
    assert fc["frac_matmul_ceiling"] == pytest.approx(fc["tflops"] / 500.0)
    assert fc["vs_sdpa_default"] == pytest.approx(2.0)
    assert dense["flashcore-secure"]["status"] == "ok" and dense["flashcore-secure"]["rel_err"] < 1e-6
    assert doc["results"][0]["fastest_peer"] == "sdpa-default"  # flashcore-secure (60 µs) is not a peer
    assert fc["vs_fastest_peer"] == pytest.approx(2.0)
    assert dense["sdpa-math"]["vs_fastest_peer"] == pytest.approx(0.25)
    assert fc["host_latency_us"] == 77.0 and fc["cuda_graph_us"] == 11.0  # small shape → extras measured
    # cross shape: no SDPA default result, so no ratio against it
    assert cross["flashcore"]["vs_sdpa_default"] is None


def test_pipeline_document_roundtrip_table_plot_compare(fake_gpu, tmp_path):
    doc = _run([Shape.dense(1, 2, 32, 16)])
    path = R.save_document(doc, str(tmp_path / R.result_filename(doc)))
    assert path.endswith("bench-fake-gpu-20250102-030405-abcdef1.json")
    loaded = R.load_document(path)
    assert loaded == json.loads(json.dumps(doc))

    from rich.console import Console

    from flashcore.bench.report import results_table

    buf = io.StringIO()
    Console(file=buf, width=250).print(results_table(loaded))
    text = buf.getvalue()
    assert "flashcore" in text and "wrong" in text and "2.00×" in text

    from flashcore.bench.plot import plot_document

    png = plot_document(loaded, str(tmp_path / "run.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    # B: flashcore twice as fast → ratio 0.5; SDPA unchanged → 1.0
    faster = json.loads(json.dumps(loaded))
    faster["results"][0]["backends"]["flashcore"]["timing"]["median_us"] = 25.0
    faster["results"][0]["backends"]["flashcore"]["timing"]["min_us"] = 20.0
    cmp = R.compare_documents(loaded, faster)
    ratios = {row["backend"]: row["ratio"] for row in cmp["rows"]}
    assert ratios["flashcore"] == pytest.approx(0.5)
    assert ratios["sdpa-default"] == pytest.approx(1.0)
    assert ratios["wrongimpl"] is None


def test_pipeline_checkpoints_after_every_shape(fake_gpu):
    seen = []
    _run([Shape.dense(1, 2, 32, 16), Shape.dense(1, 2, 40, 16)], checkpoint=lambda d: seen.append(
        (len(d["results"]), d["complete"])))
    assert seen == [(1, False), (2, False), (2, True)]


def test_pipeline_varlen_shape(fake_gpu, ran):
    doc = _run([Shape.packed([5, 0, 17, 9], 4, 16, causal=True, Hkv=2)])
    r = doc["results"][0]["backends"]
    assert r["flashcore"]["status"] == "ok"
    if INTERPRET:
        assert ran.reference == 0 and any(name == "triton_fwd" and p.varlen for name, p in ran.kernels)
    assert r["sdpa-default"]["status"] == "unsupported" and "varlen" in r["sdpa-default"]["reason"]
    # exact FLOPs: each sequence is causal with Sq == Sk, counted as n²/2 pairs
    assert doc["results"][0]["flops"] == 4 * 4 * 16 * sum(n * n // 2 for n in (5, 0, 17, 9))


def test_pipeline_aborts_cleanly_when_the_cuda_context_is_lost(fake_gpu, monkeypatch):
    def lost(inputs):
        def fn():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return fn

    registry = runner.make_registry()
    registry["raiser"].build = lost
    doc = _run([Shape.dense(1, 2, 32, 16), Shape.dense(1, 2, 40, 16)])
    assert doc["complete"] is False
    assert "illegal memory access" in doc["aborted"]
    assert doc["results"] == []  # the shape that lost the context is not reported as measured
    R.validate_document(doc)


def test_cli_bench_writes_json_and_png(fake_gpu, tmp_path, capsys):
    from flashcore import cli

    suite = tmp_path / "tiny.json"
    suite.write_text(json.dumps([{"B": 1, "Hq": 2, "Sq": 24, "D": 16}, {"Hq": 2, "D": 16, "varlen": [5, 9]}]))
    out_dir = tmp_path / "results"
    rc = cli.main(["bench", "--suite", str(suite), "--backends", "flashcore", "sdpa-default",
                   "--dtype", "fp16", "--out", str(out_dir), "--plot", "--no-progress"])
    assert rc == 0
    files = sorted(p.name for p in out_dir.iterdir())
    assert len(files) == 2 and files[0].endswith(".json") and files[1].endswith(".png")
    doc = R.load_document(str(out_dir / files[0]))
    assert doc["config"]["dtype"] == "fp16" and doc["config"]["suite"] == str(suite)
    assert [e["key"] for e in doc["results"]] == [Shape.dense(1, 2, 24, 16).key, Shape.packed([5, 9], 2, 16).key]
    assert list(doc["results"][0]["backends"]) == ["flashcore", "sdpa-default"]
    out = capsys.readouterr().out
    assert "summary" in out and files[0] in out


def test_cli_exit_code_flags_a_wrong_flashcore(fake_gpu, tmp_path):
    from flashcore import cli

    runner.make_registry()["flashcore"].build = _wrong_build
    rc = cli.main(["bench", "--suite", _tiny_suite(tmp_path), "--backends", "flashcore", "--out", str(tmp_path),
                   "--no-progress"])
    assert rc == 1


def _tiny_suite(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps([{"B": 1, "Hq": 2, "Sq": 16, "D": 16}]))
    return str(path)


def test_internal_errors_keep_earlier_shapes(fake_gpu, monkeypatch):
    calls = {"n": 0}
    real = runner.fill_derived

    def flaky(entry, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyError("boom")
        return real(entry, *a, **k)

    monkeypatch.setattr(runner, "fill_derived", flaky)
    doc = _run([Shape.dense(1, 2, 32, 16), Shape.dense(1, 2, 40, 16), Shape.dense(1, 2, 48, 16)])
    assert len(doc["results"]) == 1 and doc["complete"] is False
    assert "internal error on 1×2×40×16" in doc["aborted"] and "KeyError" in doc["traceback"]


def test_time_budget_stops_before_the_next_shape(fake_gpu):
    doc = _run([Shape.dense(1, 2, 32, 16), Shape.dense(1, 2, 40, 16)], time_budget_s=1e-9)
    assert doc["results"] == [] and doc["complete"] is False
    assert "not run: 1×2×32×16, 1×2×40×16" in doc["stopped"]
    R.validate_document(doc)
