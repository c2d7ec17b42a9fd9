"""Benchmark harness: correctness-checked, cold-L2 CUDA-event timings of attention backends.

Python entry point::

    from flashcore.bench import run_suite, SUITES
    doc = run_suite("all")                       # or a list of Shape / suite dicts
    doc = run_suite(SUITES["seed"], backends=["flashcore", "sdpa-flash"], dtype=torch.float16)

The command line is ``flashcore bench`` / ``flashcore info`` (see :mod:`flashcore.bench.cli`), with the GPU tools
``flashcore bench gpu-check`` (:mod:`~flashcore.bench.gpu_check`), ``sweep`` (:mod:`~flashcore.bench.sweep`) and
``timeline`` (:mod:`~flashcore.bench.timeline_run`); A/B and investigation tools are in
:mod:`flashcore.bench.experiments` (``python -m flashcore.bench.experiments.<name>``).
"""
from .suites import LARGE, SEED, SUITES, Shape

__all__ = ["run_suite", "Shape", "SUITES", "SEED", "LARGE"]


def run_suite(shapes, backends=None, dtype=None, progress=True, **kwargs) -> dict:
    """Benchmark ``shapes`` and return the result document (see :mod:`flashcore.bench.results`)."""
    import torch

    from .runner import run_suite as _run

    return _run(shapes, backends, torch.bfloat16 if dtype is None else dtype, progress, **kwargs)
