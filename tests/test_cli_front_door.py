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
