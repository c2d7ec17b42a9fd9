"""Run a suite: for every shape, check each backend against the float64 reference, then time it."""
from __future__ import annotations

import contextlib
import gc
import math
import sys
import time
import traceback
import warnings
from typing import Callable, Optional

import torch

from . import check, timing
from .backends import FLASHCORE_NAMES, SDPA_DEFAULT, Backend, make_inputs, make_registry, parse_backend_names
from .results import collect_environment, empty_backend_result, fill_derived, new_document
from .stats import summarize_ms
from .suites import Shape, SuiteError, as_shapes, resolve_suite

DTYPE_NAMES = {"bf16": torch.bfloat16, "fp16": torch.float16}
FATAL_CUDA_ERRORS = ("illegal memory access", "unspecified launch failure", "device-side assert",
                     "misaligned address", "illegal instruction", "an illegal")


class NoCudaDevice(RuntimeError):
    """The benchmark needs a CUDA device."""


def tool_shapes(tool: str, suite: str) -> Optional[list]:
    """The shapes of ``flashcore bench TOOL --suite SUITE``, or None after saying on stderr why the tool cannot
    run: a bad suite (checked first, so a typo is caught on any machine) or no CUDA device."""
    try:
        shapes = resolve_suite(suite)
    except SuiteError as e:
        print(f"flashcore bench {tool}: error: {e}", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print(f"flashcore bench {tool}: no CUDA device; nothing to do (the CPU tests are `pytest`)", file=sys.stderr)
        return None
    return shapes


class FatalDeviceError(RuntimeError):
    """The CUDA context is lost (e.g. an illegal memory access); nothing after it can be trusted."""


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPE_NAMES.items()}.get(dtype, str(dtype).replace("torch.", ""))


def _first_line(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _is_fatal(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in FATAL_CUDA_ERRORS)


def _failure(backend: Backend, exc: BaseException, caught_warnings=()) -> dict:
    """Classify an exception from preparing or calling a backend."""
    if _is_fatal(exc):
        raise FatalDeviceError(f"{backend.name}: {_first_line(exc)}") from exc
    if _is_oom(exc):
        return empty_backend_result("oom", f"out of memory: {_first_line(exc)}")
    reason = f"{type(exc).__name__}: {_first_line(exc)}"
    hints = [_first_line(w.message) for w in caught_warnings if str(w.message).strip()]
    if hints:  # SDPA explains why a forced kernel refused the shape only in warnings
        reason += " | " + " | ".join(dict.fromkeys(hints))[:400]
    return empty_backend_result("unsupported" if backend.refusal_is_unsupported else "error", reason)


def _free_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


class ShapeRun:
    """Everything shared by the backends of one shape: input sets, reference pieces, method."""

    def __init__(self, shape: Shape, dtype: torch.dtype, l2_bytes: int):
        self.shape = shape
        self.dtype = dtype
        element_size = torch.empty((), dtype=dtype).element_size()
        self.io_bytes = shape.io_bytes(element_size)
        self.rotate = timing.use_rotation(self.io_bytes, l2_bytes)
        self.n_sets = timing.rotation_sets(self.io_bytes, l2_bytes) if self.rotate else 1
        self.method = "rotate" if self.rotate else "l2-flush"
        self.small = shape.flops < timing.SMALL_FLOPS
        self.inputs = []
        self.pieces = None

    def prepare(self, device) -> Optional[str]:
        """Allocate inputs and compute the reference; returns a reason string if impossible."""
        free, _ = torch.cuda.mem_get_info()
        need = 3 * self.io_bytes * self.n_sets  # inputs + per-backend copies (FA4/flex layouts) + outputs
        if need > 0.9 * free:
            return f"skipped: needs ~{need / 2**30:.1f} GiB for inputs, {free / 2**30:.1f} GiB free"
        self.inputs = [make_inputs(self.shape, self.dtype, device, seed=i) for i in range(self.n_sets)]
        self.pieces = check.reference_pieces(self.inputs[0])
        return None

    def release(self) -> None:
        self.inputs = []
        self.pieces = None


def _entry_skeleton(run: ShapeRun) -> dict:
    return {"key": run.shape.key, "label": run.shape.label, "shape": run.shape.to_dict(), "flops": int(run.shape.flops),
            "io_bytes": int(run.io_bytes), "method": run.method, "input_sets": run.n_sets, "fastest_peer": None,
            "backends": {}}


def bench_backend(backend: Backend, run: ShapeRun, timer: timing.Timer, *, available: tuple, rep_ms: float,
                  tolerance: float, extras: bool = True, graph_cycle: bool = False, clean_l2: bool = False) -> dict:
    """Check one backend on one shape, then (only if correct) time it. ``graph_cycle``: the CUDA graph of a small
    shape cycles through the input sets (as the event timing does) instead of replaying set 0 (warm L2).
    ``clean_l2``: a flushed shape is timed a second time with a clean L2 (``timing_clean_l2``)."""
    ok, why = available
    if not ok:
        return empty_backend_result("unavailable", why)
    status, why = backend.check_shape(run.shape, run.dtype)
    if status != "ok":
        return empty_backend_result(status, why)
    try:
        fns = [backend.make_fn(inputs) for inputs in run.inputs]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = fns[0]()
                torch.cuda.synchronize()
            except Exception as exc:
                return _failure(backend, exc, caught)
    except FatalDeviceError:
        raise
    except Exception as exc:
        return _failure(backend, exc)
    return _verify_then_time(backend, run, timer, fns, out, rep_ms=rep_ms, tolerance=tolerance, extras=extras,
                             graph_cycle=graph_cycle, clean_l2=clean_l2)


def _verify_then_time(backend, run, timer, fns, out, *, rep_ms, tolerance, extras, graph_cycle=False,
                      clean_l2=False) -> dict:
    try:
        canonical = backend.to_canonical(out, run.inputs[0])
        mismatch = check.describe_mismatch(canonical, run.inputs[0])
        if mismatch:
            return empty_backend_result("wrong", mismatch)
        correct, err = check.check_output(canonical, run.pieces, tolerance)
    except Exception as exc:  # a malformed output (wrong dtype/strides) is the backend's fault
        if _is_fatal(exc):
            raise FatalDeviceError(_first_line(exc)) from exc
        return empty_backend_result("error", f"checking the output failed: {type(exc).__name__}: {_first_line(exc)}")
    del out, canonical
    if not correct:
        result = empty_backend_result("wrong", f"relative error {err:.3g} > tolerance {tolerance:g}"
                                      if math.isfinite(err) else "output has NaN/Inf")
        result["rel_err"] = err if math.isfinite(err) else None
        return result
    result = empty_backend_result("ok")
    result["rel_err"] = err
    try:
        result["timing"] = summarize_ms(timer.measure(fns, flush=not run.rotate, rep_ms=rep_ms))
        result["timing"]["do_bench_median_us"] = timing.do_bench_median_us(fns[0], rep_ms)
    except Exception as exc:
        failed = _failure(backend, exc)
        failed["status"] = "oom" if failed["status"] == "oom" else "error"
        failed["rel_err"] = err
        return failed
    if clean_l2 and not run.rotate:  # a second time; its failure (an OOM for the 2x L2 buffer) keeps the first
        try:
            result["timing_clean_l2"] = summarize_ms(timer.measure(fns, flush=True, clean=True, rep_ms=rep_ms))
        except Exception as exc:
            if _is_fatal(exc):
                raise FatalDeviceError(_first_line(exc)) from exc
            result["timing_clean_l2_error"] = f"{type(exc).__name__}: {_first_line(exc, 200)}"
    if extras and run.small:
        _small_shape_extras(result, fns, graph_cycle)
    return result


def _small_shape_extras(result: dict, fns, graph_cycle: bool = False) -> None:
    """Host latency and CUDA-graph time: what matters when the kernel itself takes microseconds."""
    try:
        result["host_latency_us"] = timing.host_latency_us(fns)
    except Exception as exc:
        if _is_fatal(exc):
            raise FatalDeviceError(_first_line(exc)) from exc
    try:
        result["cuda_graph_us"] = timing.cuda_graph_us(list(fns) if graph_cycle else fns[0])
        result["cuda_graph_status"] = "ok"
    except Exception as exc:
        if _is_fatal(exc):
            raise FatalDeviceError(_first_line(exc)) from exc
        result["cuda_graph_status"] = f"not capturable: {type(exc).__name__}: {_first_line(exc, 200)}"
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()


def bench_shape(shape: Shape, names: list, registry: dict, availability: dict, timer: timing.Timer, *,
                dtype: torch.dtype, rep_ms: float, tolerance: float, ceilings: Optional[dict], l2_bytes: int,
                on_backend: Optional[Callable] = None, extras: bool = True) -> dict:
    run = ShapeRun(shape, dtype, l2_bytes)
    entry = _entry_skeleton(run)
    try:
        problem = run.prepare(timer.device)
    except Exception as exc:
        if _is_fatal(exc):
            raise FatalDeviceError(_first_line(exc)) from exc
        problem = ("skipped: out of memory preparing inputs/reference" if _is_oom(exc)
                   else f"error preparing inputs/reference: {type(exc).__name__}: {_first_line(exc)}")
    for name in names:
        if problem:
            result = empty_backend_result("skipped" if problem.startswith("skipped") else "error", problem)
        else:
            result = bench_backend(registry[name], run, timer, available=availability[name], rep_ms=rep_ms,
                                   tolerance=tolerance, extras=extras)
        entry["backends"][name] = result
        _free_memory()
        if on_backend:
            on_backend(shape, name, result)
    run.release()
    _free_memory()
    fill_derived(entry, ceilings, FLASHCORE_NAMES, SDPA_DEFAULT)
    return entry


def _config(suite_name: str, dtype, names, rep_ms, tolerance, math_max_seq) -> dict:
    return {"suite": suite_name, "dtype": dtype_name(dtype), "backends": list(names), "rep_ms": float(rep_ms),
            "tolerance": float(tolerance), "math_max_seq": math_max_seq, "reference": "flashcore.reference (float64)",
            "check": f"first/last batch, first/last q head, first/last {check.DEFAULT_WINDOW} query rows",
            "method": dict(timing.METHOD_NOTES)}


def run_suite(shapes, backends=None, dtype=torch.bfloat16, progress=True, *, rep_ms: float = 100.0,
              tolerance: float = check.DEFAULT_TOLERANCE, math_max_seq: Optional[int] = 8192,
              suite_name: str = "custom", console=None, checkpoint: Optional[Callable[[dict], None]] = None,
              measure_ceilings: bool = True, extras: bool = True, time_budget_s: Optional[float] = None) -> dict:
    """Benchmark ``shapes`` (a suite name, Shape objects or suite dicts) and return the result document.

    ``backends``: names (default: all registered). ``checkpoint(doc)`` is called after every shape
    (the CLI saves the file there, so an interrupted run keeps what it measured).
    ``time_budget_s``: no new shape is started after this many seconds (the document then says
    which shapes were left out, in ``stopped``).
    """
    started = time.monotonic()
    if not torch.cuda.is_available():
        raise NoCudaDevice("no CUDA device is present; the benchmark times GPU kernels")
    if isinstance(shapes, str):
        suite_name = shapes
    shape_list = as_shapes(shapes)
    names = parse_backend_names(backends if not isinstance(backends, str) else [backends])
    if isinstance(dtype, str):
        dtype = DTYPE_NAMES[dtype]
    registry = make_registry(math_max_seq)
    availability = {n: registry[n].available() for n in names}
    env = collect_environment()
    l2_bytes = (env["gpu"] or {}).get("l2_bytes") or timing.DEFAULT_L2_BYTES
    timer = timing.Timer()
    config = _config(suite_name, dtype, names, rep_ms, tolerance, math_max_seq)
    ceilings = None
    if measure_ceilings:
        try:
            ceilings = timing.measure_ceilings(timer, dtype, rep_ms)
        except Exception as exc:  # the run is still useful without the roofs
            config["ceilings_error"] = f"{type(exc).__name__}: {_first_line(exc)}"
            _free_memory()
    backends_info = {n: {"label": registry[n].label, "available": availability[n][0], "reason": availability[n][1]}
                     for n in names}
    doc = new_document(env, config, ceilings, backends_info)
    with _progress(progress, console, len(shape_list) * len(names)) as report:
        for index, shape in enumerate(shape_list):
            if time_budget_s is not None and time.monotonic() - started > time_budget_s:
                left = ", ".join(s.label for s in shape_list[index:])
                doc["stopped"] = f"time budget of {time_budget_s:g} s reached; not run: {left}"
                break
            try:
                entry = bench_shape(shape, names, registry, availability, timer, dtype=dtype, rep_ms=rep_ms,
                                    tolerance=tolerance, ceilings=ceilings, l2_bytes=l2_bytes, on_backend=report,
                                    extras=extras)
            except FatalDeviceError as exc:
                doc["aborted"] = f"CUDA context lost on {shape.label}: {exc}"
                break
            except Exception as exc:  # a harness bug: keep what was measured, say where it stopped
                doc["aborted"] = f"internal error on {shape.label}: {type(exc).__name__}: {_first_line(exc)}"
                doc["traceback"] = traceback.format_exc()[-4000:]
                break
            doc["results"].append(entry)
            if checkpoint:
                checkpoint(doc)
    doc["complete"] = doc["aborted"] is None and "stopped" not in doc
    if checkpoint:
        checkpoint(doc)
    return doc


@contextlib.contextmanager
def _progress(enabled: bool, console, total: int):
    """A rich progress bar plus one log line per (shape, backend). Without the bar, the log lines
    still go to ``console`` if one is given (the CLI), and nothing is printed otherwise."""
    from .report import one_line

    if not enabled:
        if console is None:
            yield lambda shape, name, result: None
        else:
            yield lambda shape, name, result: console.print(one_line(shape, name, result), highlight=False)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, transient=False) as bar:
        task = bar.add_task("", total=total)

        def report(shape, name, result):
            bar.console.print(one_line(shape, name, result), highlight=False)
            bar.update(task, advance=1, description=f"{shape.label} {name}")

        yield report
