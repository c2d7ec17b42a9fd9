"""The front door: `flashcore --version`, and a demo that says what actually ran."""
import os
import subprocess
import sys

import pytest

import flashcore
from flashcore import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_names_flashcore_torch_and_triton(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    import torch
    import triton
    assert text.startswith(f"flashcore {flashcore.__version__} ")
    assert f"torch {torch.__version__}" in text and f"triton {triton.__version__}" in text


def _demo(*args, interpret: bool):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "flashcore", "demo", "--seed", "5", *args], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU demo")
def test_cpu_demo_without_the_interpreter_still_runs_the_kernels():
    r = _demo(interpret=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all checks passed (kernels: triton_fwd)" in r.stdout
    assert "backend=triton" in r.stdout


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU demo")
def test_reference_only_demo_says_no_kernel_ran():
    r = _demo("--reference-only", interpret=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no kernel ran" in r.stdout
    assert "all checks passed" not in r.stdout


def test_the_readme_test_command_does_not_print_the_interpreters_warnings(tmp_path):
    """The interpreter warns about numpy conversions on every kernel call; pytest's configuration filters
    those (not ours), so the README's test command output stays readable."""
    test = tmp_path / "test_one_kernel.py"
    test.write_text("import torch, flashcore\n"
                    "def test_kernel():\n"
                    "    q = torch.randn(1, 2, 16, 32)\n"
                    "    flashcore.attention(q, q, q, backend='triton')\n")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", os.path.join(ROOT, "pyproject.toml"),
                        "--rootdir", str(tmp_path), str(test)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout
    assert "DeprecationWarning" not in r.stdout and "warnings summary" not in r.stdout, r.stdout


def test_audit_reports_default_to_a_working_directory_not_the_committed_results(monkeypatch):
    """`flashcore audit sass` without --out must not rewrite the committed audit/results/sass.json."""
    from flashcore.audit import cli as audit_cli

    seen = {}

    class FakeSass:
        @staticmethod
        def add_arguments(p):
            p.add_argument("--json", default=None)

        @staticmethod
        def run(ns):
            seen["json"] = ns.json
            return 0

    monkeypatch.setattr(audit_cli, "_load_sass", lambda: (FakeSass, None))
    monkeypatch.chdir(__import__("tempfile").mkdtemp())
    assert audit_cli._run_sass(__import__("argparse").Namespace(sass_args=[], out=None)) == 0
    assert not os.path.normpath(seen["json"]).startswith(os.path.normpath("audit/results")), seen


# ---------------------------------------------------------------------------------------------
# `flashcore audit --help` and `flashcore audit sass --help` say what the options do; these run them.


@pytest.fixture
def no_sass_kernels(monkeypatch):
    """The real sass gate over an empty kernel list (no compiler needed): it fails (an empty gate does not
    pass) but writes its report; records the V-zeroing knob audit_specs saw."""
    import types

    from flashcore.plan import knobs

    seen = []
    mod = types.ModuleType("flashcore.audit.specs")

    def audit_specs(secure, **kw):
        seen.append(os.environ.get(knobs.SECURE_V_ZEROING_ENV))
        return []

    mod.audit_specs = audit_specs
    monkeypatch.setitem(sys.modules, "flashcore.audit.specs", mod)
    monkeypatch.setenv(knobs.SECURE_V_ZEROING_ENV, "auto")  # restored afterwards (the CLI sets it)
    return seen


def _report(path):
    import json

    doc = json.loads(path.read_text())
    assert set(doc) >= {"ok", "secure", "fast"}, doc
    return doc


def test_audit_help_documents_each_gates_json_and_out():
    from flashcore.audit import cli as audit_cli

    doc = audit_cli.__doc__
    assert "--json PATH writes the JSON report to the file PATH" in doc
    assert "--json (a flag) prints the JSON report on stdout" in doc
    assert "<out>/<gate>.json" in doc and "<out>/sass.json" in doc


def test_audit_sass_out_dir_writes_sass_json_there(no_sass_kernels, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["audit", "sass", "--out", "reports"]) == 1  # empty gate: FAIL, report still written
    assert not _report(tmp_path / "reports" / "sass.json")["ok"]
    assert cli.main(["audit", "sass", "--out=other"]) == 1
    assert (tmp_path / "other" / "sass.json").is_file()
    assert cli.main(["audit", "sass"]) == 1  # default: ./flashcore-audit
    assert (tmp_path / "flashcore-audit" / "sass.json").is_file()


def test_audit_sass_json_path_writes_that_file_instead(no_sass_kernels, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["audit", "sass", "--out", "reports", "--json", "elsewhere/r.json"]) == 1
    _report(tmp_path / "elsewhere" / "r.json")
    assert not (tmp_path / "reports").exists()
    assert "FAIL" in capsys.readouterr().out  # the table/summary is printed either way
    with pytest.raises(SystemExit) as e:  # sass's --json takes a PATH
        cli.main(["audit", "sass", "--json"])
    assert e.value.code == 2
    assert "--json: expected one argument" in capsys.readouterr().err


def test_gpu_gates_json_is_a_flag():
    parser = cli.build_parser()
    for gate in ("counters", "repro", "timing", "all"):
        args = parser.parse_args(["audit", gate, "--json", "--out", "d"])
        assert args.json is True and args.out == "d", gate
        with pytest.raises(SystemExit):
            parser.parse_args(["audit", gate, "--json", "some/path.json"])


def test_audit_sass_secure_v_zeroing_reaches_the_audited_specs(no_sass_kernels, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["audit", "sass", "--secure-v-zeroing", "prepass"]) == 1
    assert no_sass_kernels == ["prepass"]


def test_audit_all_passes_its_options_to_every_gate(no_sass_kernels, tmp_path, monkeypatch, capsys):
    from flashcore.audit import cli as audit_cli
    from flashcore.plan import knobs

    ran = {}

    def fake_handler(name):
        def handler(ns):
            ran[name] = (ns.out, ns.json, ns.secure_v_zeroing, os.environ.get(knobs.SECURE_V_ZEROING_ENV))
            return 0
        return handler

    monkeypatch.setattr(audit_cli, "_gpu_handler", fake_handler)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["audit", "all", "--out", "d", "--json", "--secure-v-zeroing", "in_loop"]) == 1  # sass: empty
    assert ran == {g: ("d", True, "in_loop", "in_loop") for g in ("counters", "repro", "timing")}
    assert no_sass_kernels == ["in_loop"]
    _report(tmp_path / "d" / "sass.json")  # the sass step writes <out>/sass.json under --json too
