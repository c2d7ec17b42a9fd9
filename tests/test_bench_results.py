"""Result documents: schema validation, JSON round trip, comparison of two runs."""
from __future__ import annotations

import copy
import json

import pytest

from flashcore.bench import results as R
from flashcore.bench.stats import summarize_ms
from flashcore.bench.suites import Shape

ENV = {"date": "2025-03-04T05:06:07+00:00", "git_sha": "0123456789abcdef", "gpu": {"name": "NVIDIA H100 80GB HBM3"},
       "versions": {"torch": "2.11.0", "triton": "3.6.0"}}
CEILINGS = {"matmul_tflops": 700.0, "copy_gbps": 3000.0, "matmul": {"dtype": "bfloat16"}, "copy": {}}


def synthetic_document(medians: dict, env=ENV) -> dict:
    """medians: {shape: {backend: median µs or a status string}} → a complete result document."""
    names = sorted({n for per in medians.values() for n in per})
    config = {"suite": "custom", "dtype": "bf16", "backends": names, "rep_ms": 100.0, "tolerance": 0.02, "method": {}}
    doc = R.new_document(copy.deepcopy(env), config, dict(CEILINGS),
                         {n: {"label": n, "available": True, "reason": ""} for n in names})
    for shape, per in medians.items():
        entry = {"key": shape.key, "label": shape.label, "shape": shape.to_dict(), "flops": shape.flops,
                 "io_bytes": shape.io_bytes(2), "method": "l2-flush", "input_sets": 1, "fastest_peer": None,
                 "backends": {}}
        for name, value in per.items():
            if isinstance(value, str):
                entry["backends"][name] = R.empty_backend_result(value, f"synthetic {value}")
                continue
            r = R.empty_backend_result("ok")
            r["rel_err"] = 4e-3
            r["timing"] = summarize_ms([value / 1000 * f for f in (0.98, 1.0, 1.0, 1.02, 1.5)])
            r["timing"]["do_bench_median_us"] = value * 1.01
            entry["backends"][name] = r
        R.fill_derived(entry, CEILINGS)
        doc["results"].append(entry)
    doc["complete"] = True
    return doc


S1 = Shape.dense(1, 8, 512, 64)
S2 = Shape.dense(4, 32, 4096, 128, causal=True)
S3 = Shape.dense(1, 16, 1024, 64)


def test_synthetic_document_is_valid_and_round_trips(tmp_path):
    doc = synthetic_document({S1: {"flashcore": 10.0, "sdpa-default": 20.0, "fa4": 8.0, "sdpa-math": "skipped"},
                              S2: {"flashcore": 1000.0, "sdpa-default": 1500.0, "fa4": "unsupported"}})
    R.validate_document(doc)
    path = R.save_document(doc, str(tmp_path / "out" / R.result_filename(doc)))
    assert path.endswith("bench-nvidia-h100-80gb-hbm3-20250304-050607-0123456.json")
    with open(path) as f:
        raw = json.load(f)
    assert raw == doc
    assert R.load_document(path) == doc


def test_derived_ratios_and_fractions():
    doc = synthetic_document({S1: {"flashcore": 10.0, "flashcore-secure": 12.0, "sdpa-default": 20.0, "fa4": 8.0}})
    e = doc["results"][0]
    fc = e["backends"]["flashcore"]
    assert e["fastest_peer"] == "fa4"  # flashcore-secure is not a peer
    assert fc["vs_sdpa_default"] == pytest.approx(2.0)
    assert fc["vs_fastest_peer"] == pytest.approx(0.8)
    assert fc["us_per_head"] == pytest.approx(10.0 / 8)
    assert fc["tflops"] == pytest.approx(S1.flops / 10e-6 / 1e12)
    assert fc["frac_matmul_ceiling"] == pytest.approx(fc["tflops"] / 700.0)
    assert fc["frac_copy_ceiling"] == pytest.approx(S1.io_bytes(2) / 10e-6 / 1e9 / 3000.0)


def test_validator_rejects_broken_documents():
    good = synthetic_document({S1: {"flashcore": 10.0, "sdpa-default": 20.0}})

    def broken(mutate):
        doc = copy.deepcopy(good)
        mutate(doc)
        return doc

    cases = [
        (lambda d: d.pop("environment"), r"\$: missing key 'environment'"),
        (lambda d: d.update(schema="other/2"), r"\$.schema"),
        (lambda d: d["config"].update(rep_ms="100"), r"\$.config.rep_ms"),
        (lambda d: d["results"][0].update(flops=1.5), r"\$.results\[0\].flops"),
        (lambda d: d["results"][0]["shape"].update(causal=1), r"shape.causal"),
        (lambda d: d["results"][0]["backends"]["flashcore"].update(status="fast"), r"backends.flashcore.status"),
        (lambda d: d["results"][0]["backends"]["flashcore"].update(timing=None), r"backends.flashcore.timing"),
        (lambda d: d["results"][0]["backends"]["flashcore"]["timing"].pop("p99_us"), r"missing key 'p99_us'"),
        (lambda d: d["results"][0]["backends"]["flashcore"]["timing"].update(median_us=float("nan")), r"median_us"),
        (lambda d: d["results"][0]["backends"]["flashcore"]["timing"].update(min_us=1e9), r"min_us <= median_us"),
        (lambda d: d["results"][0]["backends"]["sdpa-default"].update(tflops=True), r"sdpa-default.tflops"),
    ]
    for mutate, message in cases:
        with pytest.raises(R.SchemaError, match=message):
            R.validate_document(broken(mutate))
    with pytest.raises(R.SchemaError):
        R.validate_document([good])


def test_load_document_errors(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        R.load_document(str(tmp_path / "nope.json"))
    p = tmp_path / "x.json"
    p.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        R.load_document(str(p))
    p.write_text(json.dumps({"schema": R.SCHEMA_VERSION}))
    with pytest.raises(ValueError, match="not a flashcore bench result"):
        R.load_document(str(p))


def test_nan_is_written_as_null(tmp_path):
    doc = synthetic_document({S1: {"flashcore": 10.0}})
    doc["results"][0]["backends"]["flashcore"]["vs_sdpa_default"] = float("nan")
    path = R.save_document(doc, str(tmp_path / "n.json"))
    text = open(path).read()
    assert "NaN" not in text
    assert json.loads(text)["results"][0]["backends"]["flashcore"]["vs_sdpa_default"] is None


def test_compare_ratios_and_missing_shapes():
    a = synthetic_document({S1: {"flashcore": 10.0, "sdpa-default": 20.0},
                            S2: {"flashcore": 1000.0, "sdpa-default": 1500.0, "fa4": "unsupported"}})
    b = synthetic_document({S1: {"flashcore": 8.0, "sdpa-default": 20.0, "fa4": 7.0},
                            S3: {"flashcore": 30.0},
                            S2: {"flashcore": 1100.0, "sdpa-default": 1500.0, "fa4": 900.0}},
                           env=dict(ENV, gpu={"name": "NVIDIA H200"}))
    cmp = R.compare_documents(a, b)
    rows = {(r["key"], r["backend"]): r for r in cmp["rows"]}
    assert rows[(S1.key, "flashcore")]["ratio"] == pytest.approx(0.8)
    assert rows[(S1.key, "sdpa-default")]["ratio"] == pytest.approx(1.0)
    assert rows[(S2.key, "flashcore")]["ratio"] == pytest.approx(1.1)
    assert rows[(S1.key, "fa4")]["ratio"] is None and rows[(S1.key, "fa4")]["note"] == "backend only in B"
    assert rows[(S2.key, "fa4")]["note"] == "A unsupported, B ok"
    assert rows[(S3.key, "flashcore")]["note"] == "shape only in B" and rows[(S3.key, "flashcore")]["ratio"] is None
    assert cmp["by_backend"]["flashcore"]["shapes"] == 2
    assert cmp["by_backend"]["flashcore"]["geomean_ratio"] == pytest.approx((0.8 * 1.1) ** 0.5)
    assert any("gpu differs" in w for w in cmp["warnings"])
    only_a = R.compare_documents(b, a)
    assert {r["note"] for r in only_a["rows"] if r["key"] == S3.key} == {"shape only in A"}


def test_nvidia_smi_parsing(monkeypatch):
    class Done:
        returncode = 0
        stdout = "NVIDIA H100 80GB HBM3, 535.104, 1980, 1980, 2619, 2619, 700.00, 34, P0\n"

    monkeypatch.setattr(R.shutil, "which", lambda exe: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(R.subprocess, "run", lambda *a, **k: Done())
    smi = R._nvidia_smi("NVIDIA H100 80GB HBM3")
    assert smi["driver_version"] == "535.104" and smi["clocks.max.sm"] == 1980 and smi["power.limit"] == 700
    assert smi["pstate"] == "P0"
    monkeypatch.setattr(R.shutil, "which", lambda exe: None)
    assert R._nvidia_smi("x") is None


def test_git_sha_can_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("FLASHCORE_GIT_SHA", "feedbeef" * 5)
    assert R._git_sha() == "feedbeef" * 5


def test_a_result_names_the_code_that_ran_when_git_names_another(tmp_path, monkeypatch):
    """A copy of a working tree run on another machine may carry an older ``.git`` than its files (the GPU machine's
    copy did on 2026-11-30: a run of bc4553b's tree recorded e6cc8ec). The environment then says the tracked files
    differ from ``git_sha`` (``git_dirty``, and ``-dirty`` in the file name), and ``source_sha256`` names the
    package's sources whatever git says: it changes with any source byte or path."""
    import subprocess

    repo = tmp_path / "repo"
    pkg = repo / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    run("-c", "user.email=a@b", "-c", "user.name=a", "add", ".")
    run("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "-m", "one")
    here = str(pkg)
    real_run = R.subprocess.run
    monkeypatch.delenv("FLASHCORE_GIT_SHA", raising=False)
    monkeypatch.setattr(R.subprocess, "run", lambda cmd, cwd=None, **k: real_run(cmd, cwd=here, **k))
    assert R._git_dirty() is False
    digest = R.source_sha256(str(pkg))
    (pkg / "a.py").write_text("x = 2\n")
    assert R._git_dirty() is True
    assert R.source_sha256(str(pkg)) != digest
    (pkg / "a.py").write_text("x = 1\n")
    assert R.source_sha256(str(pkg)) == digest
    (pkg / "b.py").write_text("")
    assert R.source_sha256(str(pkg)) != digest
    env = dict(ENV, git_dirty=True)
    assert R.result_filename({"environment": env}).endswith("-0123456-dirty.json")
    assert not R.result_filename({"environment": ENV}).endswith("-dirty.json")
    monkeypatch.setenv("FLASHCORE_GIT_SHA", "feedbeef" * 5)  # named by the caller: not compared
    assert R._git_dirty() is None
    env = R.collect_environment()
    assert len(env["source_sha256"]) == 64 and "git_dirty" in env


def test_merged_runs_compare_by_the_median_of_medians():
    """Several runs per side (``--compare A1,A2,A3 B1,B2,B3``): each shape x backend compares the median of the
    runs' medians, so one noisy run does not decide; a backend that failed in one run uses the others."""
    a_runs = [synthetic_document({S1: {"flashcore": t, "sdpa-default": 20.0}}) for t in (10.0, 13.0, 10.2)]
    b_runs = [synthetic_document({S1: {"flashcore": t, "sdpa-default": s}})
              for t, s in ((10.1, 20.0), (9.9, "failed"), (30.0, 21.0))]
    merged_a, merged_b = R.merge_runs(a_runs), R.merge_runs(b_runs)
    fc = merged_a["results"][0]["backends"]["flashcore"]["timing"]
    assert fc["median_us"] == pytest.approx(10.2) and fc["runs"] == 3
    sd = merged_b["results"][0]["backends"]["sdpa-default"]
    assert sd["status"] == "ok" and sd["timing"]["runs"] == 2 and sd["timing"]["median_us"] == pytest.approx(20.5)
    rows = {r["backend"]: r for r in R.compare_documents(merged_a, merged_b)["rows"]}
    assert rows["flashcore"]["ratio"] == pytest.approx(10.1 / 10.2)
    assert merged_a["environment"]["git_sha"] == ENV["git_sha"]
    other = synthetic_document({S1: {"flashcore": 1.0}}, env=dict(ENV, git_sha="fedcba9876543210"))
    assert R.merge_runs([a_runs[0], other])["environment"]["git_sha"] == "mixed"
    assert R.merge_runs([a_runs[1]]) is a_runs[1]
    assert a_runs[0]["results"][0]["backends"]["flashcore"]["timing"]["median_us"] == pytest.approx(10.0)  # inputs kept


def test_readme_triton_versions_table_is_the_committed_runs():
    """The README's Triton-versions table is generated from the two committed runs it names (one machine, the newer
    Triton first), never typed; both runs are on an H100 at one git SHA, one per version."""
    import os
    import re

    from flashcore.bench.report import versions_markdown_table

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "README.md")).read()
    m = re.search(r"<!-- triton-versions-table: (\S+) (\S+) -->\n(.*?)\n<!-- /triton-versions-table -->", readme, re.S)
    assert m, "README lost its generated Triton-versions table"
    a, b = (json.load(open(os.path.join(root, m.group(i)))) for i in (1, 2))
    assert [d["environment"]["versions"]["triton"] for d in (a, b)] == ["3.9.0", "3.6.0"]
    assert a["environment"]["git_sha"] == b["environment"]["git_sha"]
    assert all(d["environment"]["gpu"]["name"].startswith("NVIDIA H100") for d in (a, b))
    assert m.group(3).strip() == versions_markdown_table(a, b).strip(), "README's Triton-versions table is stale"


def test_readme_decode_tables_are_the_committed_runs():
    """The README's decode tables (one per GPU) are generated from the committed decode runs they name (never
    typed), and each run holds the peers it compares against (SDPA and FA4 in the same run)."""
    import os
    import re

    from flashcore.bench.report import decode_markdown_table

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "README.md")).read()
    tables = re.findall(r"<!-- decode-table: (\S+) -->\n(.*?)\n<!-- /decode-table -->", readme, re.S)
    assert tables, "README lost its generated decode table"
    gpus = []
    for path, table in tables:
        doc = json.load(open(os.path.join(root, path)))
        assert doc["config"]["suite"].startswith("decode") and doc["complete"]
        assert {"flashcore", "flashcore-secure", "sdpa-default", "fa4"} <= set(doc["config"]["backends"])
        assert table.strip() == decode_markdown_table(doc).strip(), f"README's decode table of {path} is stale"
        gpus.append(doc["environment"]["gpu"]["name"])
    assert gpus[0].startswith("NVIDIA H100"), "the first decode table is the H100 run (the GPU of the issue's bars)"


def test_readme_generate_tables_are_the_committed_runs():
    """The README's transformers generate tables are generated from the committed ``hf_generate`` runs they name
    (never typed): each run compares flashcore with sdpa in the same process, over at least 3 repeats on the GPU the
    table is for, and the static-cache run is one of them."""
    import os
    import re

    from flashcore.bench.report import generate_markdown_table

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "README.md")).read()
    tables = re.findall(r"<!-- generate-table: (\S+) -->\n(.*?)\n<!-- /generate-table -->", readme, re.S)
    assert len(tables) >= 3, "README lost its generated transformers tables"
    caches = set()
    for path, table in tables:
        doc = json.load(open(os.path.join(root, path)))
        impls = {r["impl"] for r in doc["rows"]}
        assert "sdpa" in impls and impls - {"sdpa"}, f"{path}: flashcore and sdpa in one run"
        assert table.strip() == generate_markdown_table(doc).strip(), f"README's generate table of {path} is stale"
        caches.add(doc.get("cache", "dynamic"))
        assert doc["repeats"] >= 3, f"{path}: medians of at least 3 repeats (sdpa's first one builds cuDNN graphs)"
    assert caches == {"dynamic", "static"}


def test_generate_table_reads_every_row_against_sdpa_of_its_batch():
    from flashcore.bench.report import generate_markdown_table

    rows = [dict(impl="sdpa", batch=1, padded=False, prefill_tok_s=100.0, decode_tok_s=50.0, decode_ms_per_step=20.0),
            dict(impl="fcore", batch=1, padded=False, prefill_tok_s=110.0, decode_tok_s=75.0, decode_ms_per_step=13.3,
                 agree=7),
            dict(impl="sdpa", batch=8, padded=False, prefill_tok_s=400.0, decode_tok_s=200.0, decode_ms_per_step=40.0),
            dict(impl="fcore", batch=8, padded=False, prefill_tok_s=360.0, decode_tok_s=100.0,
                 decode_ms_per_step=80.0, agree=0)]
    lines = generate_markdown_table(dict(rows=rows, cache="static")).splitlines()
    assert lines[0].startswith("| impl | batch | prefill tok/s | x sdpa | decode tok/s | x sdpa | ms/step")
    assert lines[3] == "| fcore | 1 | 110 | 1.10 | 75 | 1.50 | 13.30 | 7 |"
    assert lines[5] == "| fcore | 8 | 360 | 0.90 | 100 | 0.50 | 80.00 | 0 |"
    assert lines[2] == "| sdpa | 1 | 100 | 1.00 | 50 | 1.00 | 20.00 | - |"


def test_readme_performance_table_is_the_committed_run():
    """The README's main performance table is generated from the committed dense bench run it names, an H100 run
    with SDPA, FA4, flex and secure mode in it."""
    import os
    import re

    from flashcore.bench.report import bench_markdown_table

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "README.md")).read()
    m = re.search(r"<!-- bench-table: (\S+) -->\n(.*?)\n<!-- /bench-table -->", readme, re.S)
    assert m, "README lost its generated performance table"
    doc = json.load(open(os.path.join(root, m.group(1))))
    assert doc["complete"] and doc["environment"]["gpu"]["name"].startswith("NVIDIA H100")
    assert {"flashcore", "flashcore-secure", "sdpa-default", "fa4", "flex"} <= set(doc["config"]["backends"])
    assert m.group(2).strip() == bench_markdown_table(doc).strip(), "README's performance table is stale"


def test_interleaved_rounds_alternate_implementations_and_drop_the_warm_up(monkeypatch):
    """hf_generate.interleaved_rounds (the generate A/Bs of perf-notes v61-v62): each round runs every implementation
    in turn, with its patch active only while it generates; per round (generate(new + 1) - generate(1)) / new ms;
    the warm-up rounds are not kept; the tokens are the last round's first 16 after the prompt."""
    import contextlib

    import torch

    from flashcore.bench.experiments import hf_generate as hg

    clock = [0.0]
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(hg.time, "perf_counter", lambda: clock[0])
    active, log = [], []

    class Model:
        impl = None

        def set_attn_implementation(self, impl):
            self.impl = impl

        def generate(self, ids, attention_mask=None, max_new_tokens=0, **kw):
            log.append((self.impl, tuple(active), max_new_tokens))
            cost = {"a": 1.0, "b": 2.0}[self.impl] * (1 + len(active))  # seconds per generated token
            clock[0] += cost * max_new_tokens
            return torch.arange(ids.shape[1] + max_new_tokens).repeat(ids.shape[0], 1) + (self.impl == "b")

    @contextlib.contextmanager
    def patch():
        active.append("p")
        try:
            yield
        finally:
            active.pop()

    ids = torch.zeros(2, 5, dtype=torch.long)
    res, tokens = hg.interleaved_rounds(Model(), ids, None, {"a": ("a", None), "b": ("b", patch)}, new=4, rounds=3,
                                        warmup=2)
    assert log[:4] == [("a", (), 1), ("a", (), 5), ("b", ("p",), 1), ("b", ("p",), 5)] and len(log) == 4 * 5
    assert res == {"a": [1000.0] * 3, "b": [4000.0] * 3} and not active
    assert tokens["a"] == [list(range(5, 10))] * 2 and tokens["b"] == [list(range(6, 11))] * 2  # new + 1 = 5
