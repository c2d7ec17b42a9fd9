"""The decode suite (``flashcore bench --suite decode``) on CPU: its cases, the byte arithmetic, the result schema
extension, the command line, and one end-to-end run with the GPU parts faked (real inputs, real float64 check,
flashcore's kernels under TRITON_INTERPRET=1, real SDPA; fake timer, ceilings and environment)."""
from __future__ import annotations

import copy
import functools
import json

import pytest
import torch

import flashcore
from flashcore._checks import SECURE_PAGE_SIZES
from conftest import INTERPRET

from flashcore.bench import cli as bench_cli
from flashcore.bench import decode as D
from flashcore.bench import decode_backends as DB
from flashcore.bench import decode_runner as DR
from flashcore.bench import results as R
from flashcore.bench import timing
from flashcore.bench.stats import summarize_ms

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
no_gpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
K = 1024
GiB = 1024 ** 3


# ---------------------------------------------------------------- the suite
# (B, Hq, Hkv, D, cache_len, Sq, page_size (0: contiguous), kv dtype, causal): the list, written out here
# rather than derived from decode.MUST, so that dropping or changing a case there fails this test.
REQUIRED = [
    (64, 32, 8, 128, 8 * K, 1, 0, "bf16", True), (64, 32, 8, 128, 16 * K, 1, 0, "bf16", True),
    (64, 32, 8, 128, 8 * K, 1, 16, "bf16", True), (64, 32, 8, 128, 16 * K, 1, 16, "bf16", True),
    (1, 32, 8, 128, 64 * K, 1, 0, "bf16", True), (1, 32, 8, 128, 4 * K, 1, 0, "bf16", True),
    *[(64, 32, 8, 128, 8 * K, 1, p, "bf16", True) for p in (1, 16, 64, 128)],
    *[(1, 32, 8, 128, 64 * K, 1, p, "bf16", True) for p in (1, 16, 64, 128)],
    (64, 32, 8, 128, 16 * K, 1, 0, "fp8", True), (1, 32, 8, 128, 64 * K, 1, 0, "fp8", True),
    (4, 32, 8, 128, 8 * K, 512, 0, "bf16", True),  # chunked prefill
]


def _spec(c):
    return (c.B, c.Hq, c.Hkv, c.D, c.cache_len, c.Sq, c.page_size, c.kv, c.causal)


def test_required_shapes_are_in_the_suite_and_run_first():
    specs = [_spec(c) for c in D.DECODE]
    for required in REQUIRED:
        assert required in specs, required
    assert D.DECODE[:len(D.MUST)] == D.MUST  # a time budget cuts the main grid, never the required shapes
    must = {_spec(c) for c in D.MUST}
    assert all(r in must for r in REQUIRED)
    assert D.DECODE_SUITES["decode-must"] == D.MUST and D.DECODE_SUITES["decode"] == D.DECODE
    # the chunked-prefill rows alone: MUST's cases with many queries, contiguous and paged
    assert D.DECODE_SUITES["decode-prefill"] and set(D.DECODE_SUITES["decode-prefill"]) <= set(D.MUST)
    assert all(c.Sq == 512 for c in D.PREFILL) and {c.page_size for c in D.PREFILL} == {0, 16}


def test_every_axis_is_covered_around_the_base():
    cases = D.DECODE
    assert {c.B for c in cases if c.Sq == 1} == {1, 8, 64, 128}  # B 4: the chunked-prefill shape
    assert {(c.Hq, c.Hkv) for c in cases} == {(32, 8), (64, 8), (32, 32)}
    assert {c.D for c in cases} == {64, 128, 256}
    assert {c.page_size for c in cases} == {0, 1, 16, 64, 128}
    assert {c.kv for c in cases} == {"bf16", "fp8"}
    assert {c.Sq for c in cases} == {1, 4, 512}
    assert min(c.cache_len for c in cases) >= K and max(c.cache_len for c in cases) == 128 * K
    lengths = {B: {c.cache_len for c in cases if c.B == B and c.Hq == 32} for B in (1, 8, 64)}
    assert lengths[1] >= {4 * K, 16 * K, 64 * K, 128 * K} and lengths[8] == {8 * K, 32 * K}
    assert lengths[64] == {4 * K, 8 * K, 16 * K}
    # each variation leaves the other axes at the base (32/8 heads, D128, bf16, Sq 1) unless it is an FP8 or
    # chunked-prefill shape, and has a page-16 twin wherever it is contiguous
    for c in cases:
        moved = [c.D != 128, (c.Hq, c.Hkv) != (32, 8) and c.B != 128, c.kv != "bf16", c.Sq != 1]
        assert sum(moved) <= 1, c
    specs = {_spec(c) for c in cases}
    for c in cases:
        if c.page_size == 0 and not (c.B == 1 and c.Sq == 4):
            assert (*_spec(c)[:6], 16, *_spec(c)[7:]) in specs, c


def test_cases_are_sane_unique_and_fit_in_memory_and_time():
    keys = [c.key for c in D.DECODE]
    assert len(set(keys)) == len(keys) and len({c.label for c in D.DECODE}) == len(keys)
    assert 20 <= len(D.DECODE) <= 60
    for c in D.DECODE:
        assert c.Hq % c.Hkv == 0 and (c.page_size == 0 or c.cache_len % c.page_size == 0)
        assert c.Sq <= c.cache_len
        assert D.memory_estimate(c, timing.DEFAULT_L2_BYTES) < D.MAX_CASE_BYTES, c.label
        assert D.time_estimate_s(c, n_backends=5, rep_ms=DR.DECODE_REP_MS) < 1.5, c.label  # a few hundred ms each
    total = sum(D.time_estimate_s(c, 5, DR.DECODE_REP_MS) for c in D.DECODE)
    assert total < 90  # timing alone; compilation (first calls) comes on top, the time budget bounds the run
    # the largest case: 32/32 heads, B64, 8k, paged: 8 GiB of cache, its dense copy, the reference's temporaries
    worst = max(D.DECODE, key=lambda c: D.memory_estimate(c, timing.DEFAULT_L2_BYTES))
    assert (worst.Hkv, worst.page_size) == (32, 16) and 16 * GiB < D.memory_estimate(worst, 50 * 2**20) < 24 * GiB


def test_case_validation_and_key():
    c = D.case(64, 8 * K, page=16)
    assert c.key == "dec-64x32x1x128-L8192-kv8-page16-bf16" and c.label == "64×32/8×D128 L8k q1 p16 bf16"
    assert D.case(4, 8 * K, Sq=512).key.endswith("contig-bf16-causal")
    assert c.num_pages == 64 * 8 * K // 16 and D.case(1, 4 * K).num_pages == 0
    for bad in (dict(page=48), dict(kv="fp16"), dict(heads=(32, 6)), dict(Sq=9 * K)):
        with pytest.raises(ValueError):
            D.case(2, 8 * K, **bad)


# ---------------------------------------------------------------- bytes and bandwidth
def test_kv_bytes_arithmetic():
    c = D.case(64, 8 * K)
    assert c.kv_bytes() == 64 * 8192 * 8 * 128 * 2 * 2 == 2 * GiB
    fp8 = D.case(64, 16 * K, kv="fp8")
    assert fp8.kv_bytes() == 64 * 16384 * 8 * 128 * 2 * 1 == 2 * GiB and fp8.kv_bytes_bf16 == 4 * GiB
    assert c.kv_bytes_bf16 == c.kv_bytes()
    assert c.io_bytes() == c.kv_bytes() + 2 * 64 * 1 * 32 * 128 * 2
    assert D.case(8, 32 * K, heads=(32, 32), D=64).kv_bytes() == 8 * 32768 * 32 * 64 * 4
    # causal chunked prefill: query i of 512 sees 8192 - 512 + i + 1 keys
    cp = D.case(4, 8 * K, Sq=512)
    pairs = sum(8192 - 512 + i + 1 for i in range(512))
    assert cp.flops == 4 * 32 * 128 * 4 * pairs
    assert D.case(64, 8 * K).flops == 4 * 32 * 128 * 64 * 8192


def _ok(median_us):
    r = R.empty_backend_result("ok")
    r["rel_err"] = 1e-3
    r["timing"] = summarize_ms([median_us / 1000.0] * 3)
    r["timing"]["do_bench_median_us"] = median_us
    return r


def _entry(c, medians, statuses=None):
    run = type("Run", (), {"shape": c, "io_bytes": c.io_bytes(), "method": "l2-flush", "n_sets": 1,
                           "memory": D.memory_estimate(c, 50 * 2**20)})()
    entry = DR.entry_skeleton(run)
    for name, us in medians.items():
        entry["backends"][name] = _ok(us) if us is not None else R.empty_backend_result((statuses or {})[name], "x")
    return entry


CEILINGS = {"matmul_tflops": 700.0, "copy_gbps": 3000.0, "read_gbps": 3200.0, "matmul": {"dtype": "bfloat16"},
            "copy": {}}


def test_bandwidth_and_ceiling_fractions():
    c = D.case(64, 16 * K, kv="fp8")
    reg = DB.make_decode_registry()
    entry = _entry(c, {"flashcore": 1000.0, "sdpa-default": 2000.0, "fa4": None}, {"fa4": "unsupported"})
    DR.fill_decode_derived(entry, CEILINGS, {n: reg[n].kv_bytes(c) for n in entry["backends"]})
    fc, sdpa, fa4 = (entry["backends"][n] for n in ("flashcore", "sdpa-default", "fa4"))
    assert fc["kv_bytes"] == 2 * GiB and sdpa["kv_bytes"] == 4 * GiB  # SDPA reads the dequantised bf16 copy
    assert fc["kv_gbps"] == pytest.approx(2 * GiB / 1e-3 / 1e9)  # 2147.5 GB/s
    assert fc["kv_gbps_bf16_equiv"] == pytest.approx(2 * fc["kv_gbps"])
    assert sdpa["kv_gbps"] == pytest.approx(sdpa["kv_gbps_bf16_equiv"]) == pytest.approx(4 * GiB / 2e-3 / 1e9)
    assert fc["frac_copy_ceiling"] == pytest.approx(fc["kv_gbps"] / 3000.0)
    assert fc["frac_read_ceiling"] == pytest.approx(fc["kv_gbps"] / 3200.0)
    assert fc["vs_fastest_peer"] == pytest.approx(2.0) and entry["fastest_peer"] == "sdpa-default"
    assert fa4["kv_gbps"] is None and fa4["frac_copy_ceiling"] is None
    bf16 = D.case(64, 8 * K)
    entry = _entry(bf16, {"flashcore": 1000.0, "sdpa-default": 800.0})
    DR.fill_decode_derived(entry, None, {n: reg[n].kv_bytes(bf16) for n in entry["backends"]})
    assert entry["backends"]["sdpa-default"]["kv_bytes"] == entry["backends"]["flashcore"]["kv_bytes"] == 2 * GiB
    assert entry["backends"]["flashcore"]["frac_copy_ceiling"] is None  # no ceilings measured: no fraction


# ---------------------------------------------------------------- result document
ENV = {"date": "2026-11-25T01:02:03+00:00", "git_sha": "0123456789abcdef", "gpu": {"name": "NVIDIA H100 80GB HBM3"},
       "versions": {"torch": "2.11.0"}}


def synthetic_decode_document() -> dict:
    reg = DB.make_decode_registry()
    names = ["flashcore", "flashcore-secure", "sdpa-default", "fa4"]
    config = DR.decode_config("decode", torch.bfloat16, names, 25.0, 0.02, 240.0)
    doc = R.new_document(copy.deepcopy(ENV), config, dict(CEILINGS),
                         {n: {"label": n, "available": True, "reason": ""} for n in names})
    for c, med in ((D.case(64, 8 * K, page=16), 700.0), (D.case(1, 64 * K, kv="fp8"), 60.0)):
        entry = _entry(c, {"flashcore": med, "flashcore-secure": med * 1.1, "sdpa-default": med * 1.2, "fa4": None},
                       {"fa4": "unsupported"})
        DR.fill_decode_derived(entry, CEILINGS, {n: reg[n].kv_bytes(c) for n in names})
        doc["results"].append(entry)
    doc["complete"] = True
    return doc


def test_decode_document_is_valid_and_round_trips(tmp_path):
    doc = synthetic_decode_document()
    R.validate_document(doc)
    assert R.is_decode_document(doc)
    name = R.result_filename(doc)
    assert name == "bench-decode-nvidia-h100-80gb-hbm3-20261125-010203-0123456.json"
    path = R.save_document(doc, str(tmp_path / name))
    assert R.load_document(path) == json.loads(open(path).read()) == doc
    cmp = R.compare_documents(doc, doc)  # --compare works on decode runs too
    assert cmp["by_backend"]["flashcore"]["geomean_ratio"] == pytest.approx(1.0)


@pytest.mark.parametrize("break_it,where", [
    (lambda d: d["results"][0].pop("decode"), r"\$\.results\[0\]: missing key 'decode'"),
    (lambda d: d["results"][1]["decode"].update(kv_bytes=2 * d["results"][1]["decode"]["kv_bytes"]),
     r"\$\.results\[1\]\.decode\.kv_bytes"),
    (lambda d: d["results"][1]["decode"].update(kv_bytes_bf16=1), r"\$\.results\[1\]\.decode\.kv_bytes_bf16"),
    (lambda d: d["results"][0]["decode"].update(kv_dtype="int4"), r"\$\.results\[0\]\.decode\.kv_dtype"),
    (lambda d: d["results"][0]["backends"]["flashcore"].pop("kv_gbps"),
     r"\$\.results\[0\]\.backends\.flashcore: missing key 'kv_gbps'"),
    (lambda d: d["results"][0]["backends"]["flashcore"].update(kv_gbps=None),
     r"\$\.results\[0\]\.backends\.flashcore\.kv_gbps: required"),
    (lambda d: d["config"].update(decode="yes"), r"\$\.config\.decode"),
])
def test_decode_schema_errors_name_the_key(break_it, where):
    doc = synthetic_decode_document()
    break_it(doc)
    with pytest.raises(R.SchemaError, match=where):
        R.validate_document(doc)


def test_flushed_cases_are_timed_again_with_a_clean_l2(fake_gpu):
    """A case larger than the L2 (flushed) gets a second time with a clean L2 for every correct backend, and the
    README's table shows it; a rotated case gets none."""
    from flashcore.bench.report import decode_markdown_table

    cases = [D.case(2, 64, heads=(4, 2), D=16), D.case(2, 512, heads=(4, 2), D=16)]  # 16 KiB and 128 KiB of K/V
    doc = DR.run_decode_suite(cases, ["flashcore", "sdpa-default", "wrong"], torch.float16, progress=False,
                              tolerance=2e-2, time_budget_s=None)
    R.validate_document(doc)
    rotated, flushed = doc["results"]
    assert rotated["method"] == "rotate" and flushed["method"] == "l2-flush"
    assert all("timing_clean_l2" not in r for r in rotated["backends"].values())
    for name, us in (("flashcore", 40.0), ("sdpa-default", 80.0)):
        assert flushed["backends"][name]["timing_clean_l2"]["median_us"] == pytest.approx(0.8 * us)
    assert "timing_clean_l2" not in flushed["backends"]["wrong"]
    assert fake_gpu.timed.count("flashcore clean") == 1 and "wrong clean" not in fake_gpu.timed
    rows = decode_markdown_table(doc).splitlines()
    assert rows[0].endswith("| clean L2 µs: flashcore / SDPA |")
    assert rows[2].endswith("| - |") and rows[3].endswith("| 32.0 / 64.0 |")


def test_a_failed_clean_l2_time_keeps_the_first(fake_gpu, monkeypatch):
    measure = fake_gpu.measure

    def failing(fns, *, flush, clean=False, **kw):
        if clean:
            raise RuntimeError("CUDA out of memory (test)")
        return measure(fns, flush=flush, **kw)

    monkeypatch.setattr(fake_gpu, "measure", failing)
    doc = DR.run_decode_suite([D.case(2, 512, heads=(4, 2), D=16)], ["flashcore"], torch.float16, progress=False,
                              tolerance=2e-2, time_budget_s=None)
    r = doc["results"][0]["backends"]["flashcore"]
    assert r["status"] == "ok" and r["timing"]["median_us"] == pytest.approx(40.0)
    assert "timing_clean_l2" not in r and "out of memory" in r["timing_clean_l2_error"]


def test_decode_tables_and_plot(tmp_path):
    from rich.console import Console

    from flashcore.bench.plot import decode_series, plot_decode
    from flashcore.bench.report import decode_results_table, decode_summary_table

    doc = synthetic_decode_document()
    console = Console(record=True, width=220)
    console.print(decode_results_table(doc))
    console.print(decode_summary_table(doc))
    text = console.export_text()
    assert "copy 3.00 TB/s" in text and "700.0 (3.07)" in text  # 2 GiB in 700 µs = 3.07 TB/s
    assert "64×32/8×D128 L8k q1 p16 bf16 *" in text  # required shapes are starred
    series = decode_series(doc)
    assert [x for x, _ in series["flashcore"]] == [0, 1] and "fa4" not in series
    assert series["flashcore"][0][1] == pytest.approx(2 * GiB / 700e-6 / 1e12)
    pytest.importorskip("matplotlib")
    png = plot_decode(doc, str(tmp_path / "decode.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- command line
def _main(argv):
    from flashcore import cli

    return cli.main(argv)


def _parser():
    import argparse

    parser = argparse.ArgumentParser(prog="flashcore")
    bench_cli.register(parser.add_subparsers(dest="command"))
    return parser


def test_cli_parses_the_decode_suite():
    args = _parser().parse_args(["bench", "--suite", "decode", "--plot", "--out", "o", "--backends", "flashcore",
                                 "fa4,flashinfer", "--no-progress"])
    assert args.func is bench_cli.run_bench and args.bench_tool is None
    assert (args.suite, args.plot, args.out, args.rep_ms, args.time_budget) == ("decode", True, "o", None, None)
    assert DB.parse_decode_backend_names(args.backends) == ["flashcore", "fa4", "flashinfer"]
    assert DB.parse_decode_backend_names(None) == list(DB.DECODE_BACKEND_NAMES)
    assert (bench_cli.DECODE_REP_MS, bench_cli.DECODE_TIME_BUDGET_S) == (DR.DECODE_REP_MS, DR.DECODE_TIME_BUDGET_S)
    assert D.is_decode_suite("decode") and D.is_decode_suite("decode-must") and not D.is_decode_suite("seed")


def test_cli_decode_rejects_a_dense_only_backend(capsys):
    assert _main(["bench", "--suite", "decode", "--backends", "flex"]) == 2
    assert "unknown backend 'flex' for the decode suite" in capsys.readouterr().err


@no_gpu_only
def test_cli_decode_without_gpu_exits_2(capsys, tmp_path):
    assert _main(["bench", "--suite", "decode-must", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "no CUDA device is present" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_cli_decode_runs_the_decode_runner(monkeypatch, tmp_path, capsys):
    """The command line hands the suite, backends, rep and budget to run_decode_suite, writes the file where the
    other suites do (bench-decode-*.json) and prints the summary table last."""
    seen = {}

    def fake_run(cases, names, dtype, progress, **kw):
        seen.update(cases=cases, names=names, dtype=dtype, progress=progress, **kw)
        doc = synthetic_decode_document()
        kw["checkpoint"](doc)
        return doc

    monkeypatch.setattr(DR, "run_decode_suite", fake_run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _main(["bench", "--suite", "decode-must", "--out", str(tmp_path), "--no-progress", "--backends",
                  "flashcore", "sdpa-default"]) == 0
    assert seen["cases"] == D.MUST and seen["names"] == ["flashcore", "sdpa-default"]
    assert (seen["rep_ms"], seen["time_budget_s"], seen["suite_name"]) == (25.0, 240.0, "decode-must")
    assert seen["dtype"] == torch.bfloat16 and seen["progress"] is False
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith("*")  # the summary table's caption is the last line
    assert "decode summary" in out and "results: " in out
    files = [p.name for p in tmp_path.iterdir()]
    assert files == ["bench-decode-nvidia-h100-80gb-hbm3-20261125-010203-0123456.json"]
    assert _main(["bench", "--suite", "decode", "--out", str(tmp_path), "--no-progress", "--rep-ms", "10",
                  "--time-budget", "99"]) == 0
    assert (seen["rep_ms"], seen["time_budget_s"], seen["cases"]) == (10.0, 99.0, D.DECODE)


# ---------------------------------------------------------------- end to end on CPU
class FakeTimer:
    device = torch.device("cpu")

    def __init__(self):
        self.timed = []

    def measure(self, fns, *, flush, rep_ms=100.0, warmup_ms=25.0, clean=False):
        assert flush == (len(fns) == 1) and (flush or not clean)
        for fn in (fns[0], fns[-1]):
            assert fn() is not None
        self.timed.append(fns[0].backend_name + (" clean" if clean else ""))
        us = {"flashcore": 40.0, "flashcore-secure": 50.0, "sdpa-default": 80.0}[fns[0].backend_name]
        return [us / 1000.0 * f * (0.8 if clean else 1.0) for f in (1.0, 0.9, 1.1)]


def _tagged(backend):
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
    ok = DB._sdpa_build(inputs)
    return lambda: ok().flip(-1)  # plausible values, wrong answer


@pytest.fixture
def fake_gpu(monkeypatch):
    timer = FakeTimer()
    if INTERPRET:  # on CPU tensors "auto" runs the reference: force flashcore's kernels (interpreted)
        monkeypatch.setattr(flashcore, "attention_with_kvcache",
                            functools.partial(flashcore.attention_with_kvcache, backend="triton"))
    registry = DB.make_decode_registry()
    for name in ("flashcore", "flashcore-secure", "sdpa-default"):
        _tagged(registry[name]).probe = lambda: (True, "")
    registry["fa4"].probe = lambda: (False, "not installed (test)")
    registry["wrong"] = DB.DecodeBackend("wrong", "deliberately wrong", lambda: (True, ""), _wrong_build, DB._any,
                                         DB._identity, reads="dense")
    monkeypatch.setattr(DR, "make_decode_registry", lambda: registry)
    monkeypatch.setattr(DR, "parse_decode_backend_names", lambda names: list(names))
    monkeypatch.setattr(DR.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(DR.torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(DR.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(timing, "Timer", lambda *a, **k: timer)
    monkeypatch.setattr(timing, "do_bench_median_us", lambda fn, rep_ms=100.0: 99.0)
    monkeypatch.setattr(timing, "host_latency_us", lambda fns: 30.0)
    graphs = []
    monkeypatch.setattr(timing, "cuda_graph_us", lambda fns: graphs.append(len(fns)) or 20.0)
    monkeypatch.setattr(timing, "measure_ceilings", lambda timer, dtype, rep_ms: {
        "matmul_tflops": 500.0, "copy_gbps": 2.0, "matmul": {"dtype": "float16"}, "copy": {}})
    monkeypatch.setattr(timing, "measure_read_ceiling", lambda timer, rep_ms: {"read_gbps": 2.5})
    env = {"date": "2026-11-25T01:02:03+00:00", "git_sha": "abcdef1234567", "versions": {}, "platform": "x",
           "gpu": {"name": "FAKE GPU", "l2_bytes": 20 * 1024}}  # 20 KiB "L2": the small cases rotate 3-4 sets
    monkeypatch.setattr(DR, "collect_environment", lambda: copy.deepcopy(env))
    timer.graphs = graphs
    return timer


def test_decode_pipeline_end_to_end_on_cpu(fake_gpu):
    """Real inputs (shuffled pages, FP8 with descales, causal Sq > 1) checked against the float64 reference:
    flashcore's kernels, secure mode and SDPA are correct and timed, a wrong backend is caught and not timed,
    unavailable peers are reported, and the document carries the decode fields."""
    from flashcore.plan.decode import DecodePlan

    ran = []
    real_call = DecodePlan.__call__

    def spy(self, *a, **k):
        ran.append((self.shape.paged, self.shape.page_size if self.shape.paged else 0, self.shape.fp8,
                    self.shape.secure))
        return real_call(self, *a, **k)

    cases = [D.case(2, 64, heads=(4, 2), D=16), D.case(2, 64, heads=(4, 2), D=16, page=16, kv="fp8"),
             D.case(1, 32, heads=(4, 2), D=16, page=1), D.case(2, 64, heads=(4, 2), D=16, Sq=4, page=16)]
    names = ["flashcore", "flashcore-secure", "sdpa-default", "fa4", "flashinfer", "wrong"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DecodePlan, "__call__", spy)
        doc = DR.run_decode_suite(cases, names, torch.float16, progress=False, tolerance=2e-2, time_budget_s=None)
    R.validate_document(doc)
    assert doc["complete"] and [e["key"] for e in doc["results"]] == [c.key for c in cases]
    for entry, c in zip(doc["results"], cases):
        b = entry["backends"]
        secure_ok = not c.page_size or c.page_size in SECURE_PAGE_SIZES
        if not secure_ok:  # a page size secure mode refuses is recorded as unsupported, with the reason
            assert b["flashcore-secure"]["status"] == "unsupported", b["flashcore-secure"]
            assert "page sizes" in b["flashcore-secure"]["reason"]
        for name in ("flashcore", "flashcore-secure", "sdpa-default") if secure_ok else ("flashcore", "sdpa-default"):
            assert b[name]["status"] == "ok" and b[name]["rel_err"] < 5e-3, (c.label, name, b[name])
            assert b[name]["kv_gbps"] == pytest.approx(b[name]["kv_bytes"] / (b[name]["timing"]["median_us"] * 1e3))
        assert b["wrong"]["status"] == "wrong" and b["wrong"]["timing"] is None
        assert b["fa4"]["status"] == "unavailable" and b["flashinfer"]["status"] == "unavailable"
        assert b["flashcore"]["kv_bytes"] == c.kv_bytes() and b["sdpa-default"]["kv_bytes"] == c.kv_bytes(2)
        assert b["flashcore"]["frac_copy_ceiling"] == pytest.approx(b["flashcore"]["kv_gbps"] / 2.0)
        assert b["flashcore"]["cuda_graph_us"] == 20.0 and entry["decode"]["must_have"] is False
        assert entry["input_sets"] > 1 and entry["method"] == "rotate"
    assert "wrong" not in fake_gpu.timed and fake_gpu.timed.count("flashcore") == len(cases)
    assert all(n > 1 for n in fake_gpu.graphs)  # the CUDA graphs cycle through the input sets
    if INTERPRET:  # the kernels ran, fast and secure, on every layout (secure refuses page size 1)
        assert {(p, ps, f8, s) for p, ps, f8, s in ran} == {
            (False, 0, False, False), (False, 0, False, True), (True, 16, True, False), (True, 16, True, True),
            (True, 1, False, False), (True, 16, False, False), (True, 16, False, True)}


def test_fa4_support_is_read_from_its_signature():
    full = dict.fromkeys(("q", "k", "v", "seqused_k", "page_table", "softmax_scale", "causal"))
    bf16 = torch.bfloat16
    assert DB.fa4_supports(D.case(64, 8 * K, page=16), bf16, full) == (True, "")
    ok, why = DB.fa4_supports(D.case(64, 8 * K, page=16), bf16, {k: v for k, v in full.items() if k != "page_table"})
    assert not ok and "page_table" in why
    assert DB.fa4_supports(D.case(64, 8 * K), bf16, {k: v for k, v in full.items() if k != "page_table"})[0]
    ok, why = DB.fa4_supports(D.case(1, 64 * K, kv="fp8"), bf16, full)
    assert not ok and "k_descale" in why
    assert DB.fa4_supports(D.case(1, 64 * K, kv="fp8"), bf16, dict(full, k_descale=None, v_descale=None))[0]
    assert not DB.fa4_supports(D.case(64, 8 * K, D=256), bf16, full)[0]
    assert not DB.fa4_supports(D.case(64, 8 * K), bf16, {k: v for k, v in full.items() if k != "seqused_k"})[0]
    assert DB.flashinfer_supports(D.case(64, 8 * K, page=16), bf16)[0]
    assert not DB.flashinfer_supports(D.case(64, 8 * K), bf16)[0]
    assert not DB.flashinfer_supports(D.case(64, 8 * K, Sq=4, page=16), bf16)[0]


def test_paged_inputs_hold_the_dense_cache_in_shuffled_pages():
    c = D.case(2, 64, heads=(4, 2), D=16, page=16, kv="fp8")
    inp = DB.make_decode_inputs(c, torch.bfloat16, "cpu", seed=1)
    table = inp.page_table.long()
    assert inp.page_table.dtype == torch.int32 and tuple(table.shape) == (2, 4)
    assert sorted(table.flatten().tolist()) == list(range(8)) and table.flatten().tolist() != list(range(8))
    logical = inp.k_cache[table].reshape(2, 64, 2, 16).to(torch.bfloat16) * DB.K_DESCALE  # pages back in order
    assert torch.equal(logical, inp.dense_k)
    assert torch.equal(inp.k_descale, torch.full((2, 2), DB.K_DESCALE))
    contig = DB.make_decode_inputs(D.case(2, 64, heads=(4, 2), D=16), torch.bfloat16, "cpu")
    assert contig.k_cache is contig.dense_k and contig.page_table is None  # SDPA reads the cache itself
