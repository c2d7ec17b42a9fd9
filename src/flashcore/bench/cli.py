"""`flashcore bench` and `flashcore info`.

``flashcore bench [--suite ...]`` runs the benchmark; ``flashcore bench TOOL ...`` runs one of the GPU tools
(``gpu-check``, ``sweep``, ``timeline``; each module's ``register(tools)`` adds it). A tool's options go after
its name (``flashcore bench gpu-check --suite seed``); the benchmark's own options apply to the benchmark only.

``flashcore bench --pass fwd|bwd|fwd+bwd [--suite train|train-large|all]`` runs the training benchmark
(:mod:`flashcore.bench.training`): forward and backward against SDPA (cuDNN, flash) and FlashAttention-4.

``flashcore bench --suite decode`` (or ``decode-must``: only the shapes the issue requires) runs the KV-cache decode
suite instead (:mod:`flashcore.bench.decode`): flashcore fast and secure, SDPA, FlashAttention-4 and FlashInfer
where installed, K/V bytes read per second against the copy ceiling of the same run.

Exit codes of ``bench``: 0 the run completed (and flashcore was correct wherever it ran);
1 flashcore was wrong, failed or could not be imported on a shape, or the CUDA context was lost; 2 usage errors (bad
suite, unknown backend, missing file, --plot without matplotlib) and no CUDA device. The tools document their own.
"""
from __future__ import annotations

import argparse
import os

from rich.console import Console

from . import gpu_check, sweep, timeline_run

DEFAULT_OUT = os.path.join("bench", "results")
DEFAULT_REP_MS = 100.0
DECODE_REP_MS = 25.0  # = decode_runner.DECODE_REP_MS (not imported here: the parser must not import torch)
DECODE_TIME_BUDGET_S = 240.0  # = decode_runner.DECODE_TIME_BUDGET_S
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def register(sub) -> None:
    _register_bench(sub)
    _register_info(sub)


def _register_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmark attention backends; GPU tools (needs a CUDA GPU)",
                       usage="flashcore bench [options]\n       flashcore bench TOOL [tool options]",
                       description="Check every available attention backend against the float64 reference, "
                                   "then time it (median of CUDA events, cold L2). Writes one JSON file per run.")
    p.add_argument("--suite", default="seed", metavar="SUITE",
                   help="seed | large | all | decode | decode-must | decode-prefill | path of a JSON suite file (default: "
                        "seed); decode: the KV-cache decode suite (attention_with_kvcache against its peers); "
                        "decode-prefill: its chunked-prefill rows")
    p.add_argument("--backends", nargs="+", metavar="NAME",
                   help="backends to run (default: all): flashcore flashcore-secure sdpa-default sdpa-cudnn "
                        "sdpa-flash sdpa-efficient sdpa-math flex fa4 unfused; decode suite: flashcore "
                        "flashcore-secure sdpa-default fa4 flashinfer")
    p.add_argument("--pass", dest="bench_pass", choices=("fwd", "bwd", "fwd+bwd"), default=None,
                   help="the training benchmark: the forward that saves for the backward, the backward, or both "
                        "(backward FLOPs counted as 2.5x the forward's, FlashAttention's convention); suites "
                        "train (default; also 'seed'), train-large (also 'large'), all")
    p.add_argument("--sustained", type=_seconds_or_zero, default=0.0, metavar="SECONDS",
                   help="--pass bwd/fwd+bwd: also time each backend at a steady load, interleaved in rounds "
                        "(warm-up, then SECONDS of forward+backward steps and SECONDS of backward alone; an H100 "
                        "at training load runs at its power cap; default: 0, off)")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16", help="input dtype (default: bf16)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"result directory (default: {DEFAULT_OUT})")
    p.add_argument("--plot", action="store_true", help="also write a PNG chart next to the JSON")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                   help="compare two result files (per shape x backend B/A) instead of running; a side may name "
                        "several runs of the same code, comma-separated (A1.json,A2.json): their medians are merged")
    p.add_argument("--rep-ms", type=_positive_float, default=None, metavar="MS",
                   help=f"timing budget per backend and shape, as do_bench's rep (default: {DEFAULT_REP_MS:g}; "
                        f"decode suite: {DECODE_REP_MS:g})")
    p.add_argument("--tolerance", type=_positive_float, default=2e-2,
                   help="max relative error vs the float64 reference (default: 2e-2)")
    p.add_argument("--math-max-seq", type=int, default=8192, metavar="S",
                   help="skip SDPA's math backend above this sequence length (default: 8192; 0 = never skip)")
    p.add_argument("--time-budget", type=_positive_float, default=None, metavar="SECONDS",
                   help="start no new shape after this many seconds (the table, JSON and plot cover what ran; "
                        f"default: none; decode suite: {DECODE_TIME_BUDGET_S:g})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    p.set_defaults(func=run_bench)
    tools = p.add_subparsers(dest="bench_tool", metavar="TOOL", title="tools (flashcore bench TOOL --help)",
                             description="instead of the benchmark, run one of these (options after the tool's name)")
    gpu_check.register(tools, DEFAULT_OUT)
    sweep.register(tools)
    timeline_run.register(tools)


def _register_info(sub) -> None:
    p = sub.add_parser("info", help="show the device, library versions and available benchmark backends")
    p.set_defaults(func=run_info)


def _seconds_or_zero(text: str) -> float:
    """A number of seconds, 0 allowed (off)."""
    try:
        if float(text) == 0.0:
            return 0.0
    except ValueError:
        pass  # _positive_float names the problem
    value = _positive_float(text)
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _wide_console() -> Console:
    """Tables are wide; a captured (non-terminal) run would otherwise be squeezed into 80 columns."""
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=200)


def _usage_error(message: str) -> int:
    _err_console().print(f"flashcore bench: error: {message}", markup=False)
    return EXIT_USAGE


# ---------------------------------------------------------------- bench
def run_bench(args) -> int:
    if args.sustained and args.bench_pass not in ("bwd", "fwd+bwd"):
        return _usage_error("--sustained times training steps: it goes with --pass bwd or --pass fwd+bwd")
    if args.compare:
        return run_compare(*args.compare)
    if args.bench_pass is not None:
        from .training import run_cli

        return run_cli(args, _wide_console())
    from .decode import is_decode_suite

    if is_decode_suite(args.suite):
        return run_decode_bench(args)
    from .backends import parse_backend_names
    from .suites import SuiteError, resolve_suite

    try:
        shapes = resolve_suite(args.suite)
        names = parse_backend_names(args.backends)
    except (SuiteError, ValueError) as e:
        return _usage_error(str(e))
    if args.plot:  # before the run, not after it: the chart is drawn once everything was timed
        from .plot import PlotUnavailable, require_matplotlib

        try:
            require_matplotlib()
        except PlotUnavailable as e:
            return _usage_error(str(e))
    import torch

    if not torch.cuda.is_available():
        return _no_cuda_message(torch)
    return _run_and_save(args, shapes, names)


def _no_cuda_message(torch) -> int:
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    _err_console().print(
        "flashcore bench: no CUDA device is present (torch " + torch.__version__ + ", " + build + ").\n"
        "The benchmark times GPU kernels, so it needs an NVIDIA GPU (it is tuned for H100).\n"
        "Without a GPU you can still run `flashcore info` and compare saved runs with "
        "`flashcore bench --compare A.json B.json`.", markup=False)
    return EXIT_USAGE


def _run_and_save(args, shapes, names) -> int:
    from .results import result_filename, save_document
    from .runner import DTYPE_NAMES, run_suite

    console = _wide_console()
    target = {}

    def checkpoint(doc):
        if "path" not in target:
            target["path"] = os.path.join(args.out, result_filename(doc))
        save_document(doc, target["path"])

    rep_ms = DEFAULT_REP_MS if args.rep_ms is None else args.rep_ms
    doc = run_suite(shapes, names, DTYPE_NAMES[args.dtype], progress=not args.no_progress, rep_ms=rep_ms,
                    tolerance=args.tolerance, math_max_seq=args.math_max_seq or None, suite_name=args.suite,
                    console=console, checkpoint=checkpoint, time_budget_s=args.time_budget)
    from .report import results_table, summary_table

    console.print(results_table(doc))
    console.print(summary_table(doc))
    console.print(f"results: {target['path']}", markup=False, highlight=False)
    if args.plot:
        from .plot import plot_document

        png = os.path.splitext(target["path"])[0] + ".png"
        plot_document(doc, png)
        console.print(f"plot: {png}", markup=False, highlight=False)
    return _exit_code(doc, console)


def run_decode_bench(args) -> int:
    """``flashcore bench --suite decode``: the same checks, options and files as the other suites."""
    from .decode import DECODE_SUITES
    from .decode_backends import parse_decode_backend_names

    try:
        names = parse_decode_backend_names(args.backends)
    except ValueError as e:
        return _usage_error(str(e))
    if args.plot:
        from .plot import PlotUnavailable, require_matplotlib

        try:
            require_matplotlib()
        except PlotUnavailable as e:
            return _usage_error(str(e))
    import torch

    if not torch.cuda.is_available():
        return _no_cuda_message(torch)
    from .decode_runner import run_decode_suite
    from .report import decode_results_table, decode_summary_table
    from .results import result_filename, save_document
    from .runner import DTYPE_NAMES

    console = _wide_console()
    target = {}

    def checkpoint(doc):
        if "path" not in target:
            target["path"] = os.path.join(args.out, result_filename(doc))
        save_document(doc, target["path"])

    doc = run_decode_suite(DECODE_SUITES[args.suite], names, DTYPE_NAMES[args.dtype], progress=not args.no_progress,
                           rep_ms=DECODE_REP_MS if args.rep_ms is None else args.rep_ms, tolerance=args.tolerance,
                           suite_name=args.suite, console=console, checkpoint=checkpoint,
                           time_budget_s=DECODE_TIME_BUDGET_S if args.time_budget is None else args.time_budget)
    console.print(decode_results_table(doc))
    console.print(f"results: {target['path']}", markup=False, highlight=False)
    if args.plot:
        from .plot import plot_decode

        png = os.path.splitext(target["path"])[0] + ".png"
        plot_decode(doc, png)
        console.print(f"plot: {png}", markup=False, highlight=False)
    console.print(decode_summary_table(doc))
    return _exit_code(doc, console)


def _exit_code(doc: dict, console: Console) -> int:
    if doc.get("stopped"):
        console.print(f"stopped early: {doc['stopped']}", style="yellow", markup=False)
    if doc.get("aborted"):
        if doc.get("traceback"):
            console.print(doc["traceback"], markup=False, highlight=False)
        console.print(f"run aborted: {doc['aborted']}", style="bold red", markup=False)
        return EXIT_FAILED
    bad = [(e["label"], n, r["status"]) for e in doc["results"] for n, r in e["backends"].items()
           if n.startswith("flashcore") and r["status"] in ("wrong", "error", "unavailable")]
    for label, name, status in bad:
        console.print(f"{name} is {status} on {label}", style="bold red", markup=False)
    return EXIT_FAILED if bad else EXIT_OK


def run_compare(path_a: str, path_b: str) -> int:
    from .report import compare_summary_table, compare_table
    from .results import compare_documents, load_document, merge_runs

    try:
        a, b = (merge_runs([load_document(p) for p in side.split(",") if p]) for side in (path_a, path_b))
    except ValueError as e:
        return _usage_error(str(e))
    cmp = compare_documents(a, b)
    console = _wide_console()
    for warning in cmp["warnings"]:
        console.print(f"warning: {warning}", style="yellow", markup=False)
    console.print(compare_table(cmp, path_a, path_b))
    if cmp["by_backend"]:
        console.print(compare_summary_table(cmp))
    return EXIT_OK


# ---------------------------------------------------------------- info
def run_info(args) -> int:
    from .backends import make_registry
    from .report import info_tables
    from .results import collect_environment

    env = collect_environment()
    registry = make_registry()
    availability = {name: b.available() for name, b in registry.items()}
    console = _wide_console()
    for table in info_tables(env, availability, {n: b.label for n, b in registry.items()}):
        console.print(table)
    return EXIT_OK

