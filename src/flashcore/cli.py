"""`flashcore` console script: one sub-command per job.

Each sub-command lives in its own module and registers itself through ``register(subparsers)``
(sets ``func`` on its parser); ``func(args) -> int`` is the exit code.
"""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashcore", description="Fused attention for Hopper GPUs: demo, benchmarks, audits.")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from . import demo
    from .bench import cli as bench_cli
    from .audit import cli as audit_cli

    demo.register(sub)
    bench_cli.register(sub)
    audit_cli.register(sub)
    return parser


def version_text() -> str:
    """flashcore's version and the torch/triton it runs on (what a bug report needs)."""
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    def v(pkg):
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "not installed"
    return f"flashcore {__version__} (torch {v('torch')}, triton {v('triton')})"


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
