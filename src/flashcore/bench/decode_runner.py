"""Run the decode suite: per case, build the inputs once, check every backend against flashcore's float64
reference, time the correct ones (the dense suites' :func:`flashcore.bench.runner.bench_backend`), then derive
the KV bandwidth figures. The result document is the dense suites' (``flashcore-bench/1``) with the decode
fields :func:`flashcore.bench.results.validate_decode_document` checks (documented there).
"""
from __future__ import annotations

import time
import traceback
from typing import Callable, Optional

import torch

from . import check, timing
from .decode import MUST, DecodeCase, memory_estimate, rotation_sets
from .decode_backends import (FLASHCORE_NAMES, K_DESCALE, SDPA_NAME, V_DESCALE, checked_batches, make_decode_inputs,
                              make_decode_registry, parse_decode_backend_names, reference_pieces)
from .results import collect_environment, empty_backend_result, fill_derived, new_document
from .runner import (FatalDeviceError, NoCudaDevice, _first_line, _free_memory, _is_fatal, _is_oom, _progress,
                     bench_backend, dtype_name)

DECODE_REP_MS = 25.0  # per backend and case: the kernels take 10 µs to 3 ms, so 30+ calls in any case
DECODE_TIME_BUDGET_S = 240.0  # no case starts after this; the must-have cases run first
DECODE_FIELDS = ("kv_bytes", "kv_gbps", "kv_gbps_bf16_equiv", "frac_read_ceiling")

NOTES = {
    "kv_bytes": "bytes of K and V the backend reads: B x cache_len x Hkv x D x 2 x element size (FP8: 1 byte; SDPA "
                "reads the dense bf16 copy, 2 bytes, also for FP8 cases)",
    "kv_bytes_bf16": "the same count at 2 bytes per element (what a bf16 cache of the problem holds)",
    "kv_gbps": "kv_bytes / median time (GB/s, 1e9)",
    "kv_gbps_bf16_equiv": "kv_bytes_bf16 / median time: FP8 cases at the bf16-equivalent rate (= kv_gbps for bf16)",
    "frac_copy_ceiling": "kv_gbps / the copy ceiling measured in this run (ceilings.copy_gbps). Decode here, unlike "
                         "the dense suites' io_bytes-based figure: the K/V read is all the traffic that counts",
    "ceiling": "copy ceiling = 1 GiB device-to-device copy, bytes read + written / time (as the dense suites and "
               "ANCHORS.md, so fractions compare across runs and with the published decode figures); decode only "
               "reads, and a read stream can run a few percent above a copy, so a fraction slightly above 1 is "
               "possible; ceilings.read_gbps (torch.sum of a 1 GiB bf16 buffer) is recorded for context, with "
               "frac_read_ceiling",
    "check": "relative error ||out - ref|| / ||ref|| on the first and last sequence (every head and query row), "
             "ref = flashcore.reference.attention_with_kvcache (float64) on the same cache: pages, FP8 values x "
             "descales (the dequantised reference)",
    "sdpa": "scaled_dot_product_attention(q, k, v, enable_gqa=True) on the contiguous cache viewed as [B, Hkv, L, "
            "D]; dense, never paged; FP8 cases: the dequantised bf16 cache; causal with Sq > 1: causal_lower_right",
    "fa4": "flash_attn.cute.flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=, page_table=) with its default "
           "num_splits; support read from its signature at run time",
    "secure": "flashcore secure=True with cache_seqlens at the full cache: it reads every page, as fast mode does "
              "here",
    "fp8": f"float8_e4m3fn cache, descales K {K_DESCALE} / V {V_DESCALE} in every [B, Hkv] entry (one per tensor, "
           "so per-tensor-scale peers run the same problem)",
    "timing_clean_l2": "flushed cases (K/V larger than the L2): the same calls timed again with the flush followed "
                       "by an untimed read of 2x L2 (a cold, clean L2: the flush's dirty lines are not written back "
                       "inside the call; what per-call ratios between caches of different sizes need)",
    "cuda_graph_us": f"small cases (K/V <= 256 MiB): {timing.GRAPH_CALLS} calls in one CUDA graph cycling through "
                     "the input sets, replay time / calls",
}


class CaseRun:
    """The inputs and reference of one case, shared by its backends (the runner's ``ShapeRun`` for decode)."""

    def __init__(self, case: DecodeCase, dtype: torch.dtype, l2_bytes: int):
        self.shape = case
        self.dtype = dtype
        self.q_size = torch.empty((), dtype=dtype).element_size()
        self.io_bytes = case.io_bytes(self.q_size)
        self.n_sets = rotation_sets(case, l2_bytes, self.q_size)
        self.rotate = self.n_sets > 1
        self.method = "rotate" if self.rotate else "l2-flush"
        self.small = case.small
        self.memory = memory_estimate(case, l2_bytes, self.q_size)
        self.inputs = []
        self.pieces = None

    def prepare(self, device) -> Optional[str]:
        device = torch.device(device)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            if self.memory > 0.9 * free:
                return f"skipped: needs ~{self.memory / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
        self.inputs = [make_decode_inputs(self.shape, self.dtype, device, seed=i) for i in range(self.n_sets)]
        self.pieces = reference_pieces(self.inputs[0])
        return None

    def release(self) -> None:
        self.inputs = []
        self.pieces = None


def decode_result_fields(result: dict) -> dict:
    for name in DECODE_FIELDS:
        result.setdefault(name, None)
    return result


def entry_skeleton(run: CaseRun) -> dict:
    c = run.shape
    return {"key": c.key, "label": c.label, "shape": c.to_dict(), "flops": int(c.flops), "io_bytes": int(run.io_bytes),
            "method": run.method, "input_sets": run.n_sets, "fastest_peer": None, "backends": {},
            "decode": {"cache_len": c.cache_len, "page_size": c.page_size, "layout": c.layout, "kv_dtype": c.kv,
                       "Sq": c.Sq, "kv_bytes": c.kv_bytes(), "kv_bytes_bf16": c.kv_bytes_bf16,
                       "must_have": c in MUST, "memory_estimate_bytes": int(run.memory),
                       "checked_sequences": checked_batches(c)}}


def fill_decode_derived(entry: dict, ceilings: Optional[dict], kv_bytes: dict) -> None:
    """The dense suites' derived figures (TFLOP/s, speed ratios), then the KV bandwidth ones. ``kv_bytes``:
    backend name → K/V bytes it reads for this case."""
    fill_derived(entry, ceilings, FLASHCORE_NAMES, SDPA_NAME)
    bf16 = entry["decode"]["kv_bytes_bf16"]
    copy = (ceilings or {}).get("copy_gbps")
    read = (ceilings or {}).get("read_gbps")
    for name, r in entry["backends"].items():
        decode_result_fields(r)
        if r["status"] != "ok" or not r.get("timing"):
            continue
        seconds = r["timing"]["median_us"] * 1e-6
        r["kv_bytes"] = int(kv_bytes[name])
        r["kv_gbps"] = r["kv_bytes"] / seconds / 1e9
        r["kv_gbps_bf16_equiv"] = bf16 / seconds / 1e9
        r["frac_copy_ceiling"] = r["kv_gbps"] / copy if copy else None
        r["frac_read_ceiling"] = r["kv_gbps"] / read if read else None


def bench_case(case: DecodeCase, names: list, registry: dict, availability: dict, timer, *, device, dtype,
               rep_ms: float, tolerance: float, ceilings: Optional[dict], l2_bytes: int,
               on_backend: Optional[Callable] = None, extras: bool = True) -> dict:
    run = CaseRun(case, dtype, l2_bytes)
    entry = entry_skeleton(run)
    try:
        problem = run.prepare(device)
    except Exception as exc:
        if _is_fatal(exc):
            raise FatalDeviceError(_first_line(exc)) from exc
        problem = ("skipped: out of memory preparing inputs/reference" if _is_oom(exc)
                   else f"error preparing inputs/reference: {type(exc).__name__}: {_first_line(exc)}")
    _free_memory()  # the reference's float64 temporaries
    for name in names:
        if problem:
            result = empty_backend_result("skipped" if problem.startswith("skipped") else "error", problem)
        else:
            result = bench_backend(registry[name], run, timer, available=availability[name], rep_ms=rep_ms,
                                   tolerance=tolerance, extras=extras, graph_cycle=True, clean_l2=True)
        entry["backends"][name] = decode_result_fields(result)
        _free_memory()
        if on_backend:
            on_backend(case, name, result)
    run.release()
    _free_memory()
    fill_decode_derived(entry, ceilings, {n: registry[n].kv_bytes(case, run.q_size) for n in names})
    return entry


def decode_config(suite_name: str, dtype, names, rep_ms, tolerance, time_budget_s) -> dict:
    method = dict(timing.METHOD_NOTES)
    method["cuda_graph_us"] = NOTES["cuda_graph_us"]
    return {"suite": suite_name, "dtype": dtype_name(dtype), "backends": list(names), "rep_ms": float(rep_ms),
            "tolerance": float(tolerance), "math_max_seq": None, "time_budget_s": time_budget_s,
            "reference": "flashcore.reference.attention_with_kvcache (float64)", "check": NOTES["check"],
            "method": method, "decode": dict(NOTES)}


def measure_decode_ceilings(timer, dtype, rep_ms: float) -> dict:
    ceilings = timing.measure_ceilings(timer, dtype, rep_ms)
    ceilings.update(timing.measure_read_ceiling(timer, rep_ms))
    ceilings["fractions_of"] = "copy_gbps (frac_copy_ceiling); read_gbps for frac_read_ceiling"
    return ceilings


def run_decode_suite(cases, backends=None, dtype=torch.bfloat16, progress=True, *, rep_ms: float = DECODE_REP_MS,
                     tolerance: float = check.DEFAULT_TOLERANCE, suite_name: str = "decode", console=None,
                     checkpoint: Optional[Callable[[dict], None]] = None, measure_ceilings: bool = True,
                     extras: bool = True, time_budget_s: Optional[float] = DECODE_TIME_BUDGET_S) -> dict:
    """Benchmark the decode ``cases`` (:class:`~flashcore.bench.decode.DecodeCase`) and return the document;
    ``checkpoint(doc)`` after every case, ``time_budget_s``: no case starts after it (``doc["stopped"]`` lists
    the cases left out)."""
    started = time.monotonic()
    if not torch.cuda.is_available():
        raise NoCudaDevice("no CUDA device is present; the benchmark times GPU kernels")
    cases = list(cases)
    names = parse_decode_backend_names(backends if not isinstance(backends, str) else [backends])
    registry = make_decode_registry()
    availability = {n: registry[n].available() for n in names}
    env = collect_environment()
    l2_bytes = (env["gpu"] or {}).get("l2_bytes") or timing.DEFAULT_L2_BYTES
    timer = timing.Timer()
    config = decode_config(suite_name, dtype, names, rep_ms, tolerance, time_budget_s)
    ceilings = None
    if measure_ceilings:
        try:
            ceilings = measure_decode_ceilings(timer, dtype, rep_ms)
        except Exception as exc:  # the run is still useful without the roofs
            config["ceilings_error"] = f"{type(exc).__name__}: {_first_line(exc)}"
            _free_memory()
    backends_info = {n: {"label": registry[n].label, "available": availability[n][0], "reason": availability[n][1]}
                     for n in names}
    doc = new_document(env, config, ceilings, backends_info)
    with _progress(progress, console, len(cases) * len(names)) as report:
        for index, c in enumerate(cases):
            if time_budget_s is not None and time.monotonic() - started > time_budget_s:
                left = ", ".join(x.label for x in cases[index:])
                doc["stopped"] = f"time budget of {time_budget_s:g} s reached; not run: {left}"
                break
            try:
                entry = bench_case(c, names, registry, availability, timer, device=timer.device, dtype=dtype,
                                   rep_ms=rep_ms, tolerance=tolerance, ceilings=ceilings, l2_bytes=l2_bytes,
                                   on_backend=report, extras=extras)
            except FatalDeviceError as exc:
                doc["aborted"] = f"CUDA context lost on {c.label}: {exc}"
                break
            except Exception as exc:  # a harness bug: keep what was measured, say where it stopped
                doc["aborted"] = f"internal error on {c.label}: {type(exc).__name__}: {_first_line(exc)}"
                doc["traceback"] = traceback.format_exc()[-4000:]
                break
            entry["elapsed_s"] = round(time.monotonic() - started, 2)
            doc["results"].append(entry)
            if checkpoint:
                checkpoint(doc)
    doc["complete"] = doc["aborted"] is None and "stopped" not in doc
    doc["elapsed_s"] = round(time.monotonic() - started, 2)
    if checkpoint:
        checkpoint(doc)
    return doc
