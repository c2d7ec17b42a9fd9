"""Gate: hardware counters of the secure kernel are identical across secret input classes.

The parent runs a child process (``python -m flashcore.audit.counters --child ...``) under Nsight
Compute::

    ncu --profile-from-start off --clock-control none --cache-control all \
        --kernel-name regex:attn --metrics <list> -f -o <report> python -m flashcore.audit.counters --child ...

The child builds every input class (flashcore.audit._inputs) with the same public shape, runs each
call twice outside the profiled range (Triton compilation, warm-up), then launches each call
exactly once between ``torch.cuda.profiler.start()``/``stop()`` (cudaProfilerStart/Stop, which
``--profile-from-start off`` honours), ``--reps`` times, and writes a manifest naming the launches
in order. The parent exports the report with ``ncu --import ... --csv --page raw --print-units base
--print-metric-instances details``, maps the rows (in ID order) onto the manifest and compares.

Policies:
* ``exact`` (instructions, per-opcode counts, branches, launch configuration): every class and every
  repetition must give the same value.
* ``noisy`` (DRAM bytes, L2 sectors, L1 traffic, shared-memory wavefronts): "identical" when equal.
  These counters vary run to run for the SAME input (L2 retries, partition traffic, shared-memory
  arbitration), so otherwise the spread across classes is reported next to the run-to-run spread of
  the repetitions, and a one-way ANOVA F-test asks whether the class explains the values. "DIFFERS"
  (a failure) needs p < alpha (1e-3) AND a spread across classes larger than the largest spread among
  repetitions of one class; otherwise "within_noise": a difference of the reported size that is not
  attributable to the class (not a failure unless ``--strict-memory``). With one repetition per class
  there is no noise estimate and any difference is "DIFFERS".
* ``info`` (time, cycles, predicated-on thread instructions, L2 fabric traffic): reported only.

The same classes run on the fast kernel (attention_varlen over the packed true lengths) for
contrast: its loop bounds depend on the lengths, so its counters are expected to differ.
Exit code: 0 pass, 1 the secure kernel differs on a required metric, 2 could not run.
"""
from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from . import _inputs as I
from .pc_counts import compare_launches, parse_source_csv
from .stats import class_effect_pvalue

# ----------------------------------------------------------------------------------------------
# Metrics (names checked against `ncu --query-metrics --chip gh100`, Nsight Compute 2025.3).

EXACT_METRICS = [
    # instructions
    "smsp__inst_executed.sum",
    "smsp__thread_inst_executed.sum",
    "smsp__sass_inst_executed.sum",
    "smsp__sass_inst_executed_op_global_ld.sum",
    "smsp__sass_inst_executed_op_global_st.sum",
    "smsp__sass_inst_executed_op_shared_ld.sum",
    "smsp__sass_inst_executed_op_shared_st.sum",
    "smsp__sass_inst_executed_op_ldsm.sum",
    "smsp__sass_inst_executed_op_ldgsts.sum",
    "smsp__sass_inst_executed_op_local_ld.sum",
    "smsp__sass_inst_executed_op_local_st.sum",
    "smsp__sass_inst_executed_op_tma.sum",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "sass__inst_executed_per_opcode",
    "sass__inst_executed_per_opcode_with_modifier_all",
    "sass__inst_executed_register_spilling",
    # branches
    "smsp__sass_inst_executed_op_branch.sum",
    "smsp__sass_branch_targets.sum",
    "smsp__sass_branch_targets_threads_divergent.sum",
    "smsp__sass_branch_targets_threads_uniform.sum",
    # launch configuration (public; a change here means the comparison is between different kernels)
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__shared_mem_per_block_static",
    "sm__ctas_launched.sum",
    "smsp__warps_launched.sum",
]
NOISY_METRICS = [
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_sectors.sum",
    "lts__t_sectors_srcunit_tex.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "lts__t_sectors_srcunit_tex_op_write.sum",
    "lts__t_requests_srcunit_tex.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum",
]
INFO_METRICS = [
    "gpu__time_duration.sum",
    "sm__cycles_elapsed.max",
    "smsp__cycles_active.avg",
    "smsp__thread_inst_executed_pred_on.sum",
    "lts__t_sectors_srcunit_ltcfabric.sum",
    "lts__t_sector_hit_rate.pct",
    # Where the SMs' L2 requests come from (attribution, docs/security.md §5.17): cp.async copies that look up the L1
    # (4- and 8-byte ones, which cannot bypass it) hit or miss there by when the other warps' copies land, so their
    # L2 requests may follow timing; 16-byte copies bypass the L1 (`cp.async.cg`; ncu has no request counter of
    # those on gh100: `l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts_cache_bypass` went unreported)
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access_lookup_hit.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access_lookup_miss.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts_cache_access.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld_lookup_hit.sum",
]
GROUPS = {
    **{m: "instructions" for m in EXACT_METRICS if "branch" not in m and not m.startswith(("launch__", "sm__ctas", "smsp__warps_launched"))},
    **{m: "branches" for m in EXACT_METRICS if "branch" in m},
    **{m: "launch" for m in EXACT_METRICS if m.startswith(("launch__", "sm__ctas", "smsp__warps_launched"))},
    **{m: "memory" for m in NOISY_METRICS},
    **{m: "info" for m in INFO_METRICS},
}
# The brief's name for the divergent-branch counter; ncu calls it smsp__sass_branch_targets_threads_divergent.
ALIASES = {"smsp__branch_targets_threads_divergent.sum": "smsp__sass_branch_targets_threads_divergent.sum"}


def policy_of(metric: str) -> str:
    base = metric.split(":", 1)[-1]  # "k1:metric" when a call launches several kernels
    if base in NOISY_METRICS:
        return "noisy"
    if base in INFO_METRICS:
        return "info"
    return "exact"


def all_metrics() -> list:
    return list(EXACT_METRICS) + list(NOISY_METRICS) + list(INFO_METRICS)


# ----------------------------------------------------------------------------------------------
# Nsight Compute discovery and CSV parsing (pure functions: unit-tested on CPU).

def find_ncu(explicit: Optional[str] = None) -> Optional[str]:
    for cand in (explicit, os.environ.get("FLASHCORE_NCU")):
        if cand and Path(cand).exists():
            return str(cand)
    w = shutil.which("ncu")
    if w:
        return w
    for pat in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda-*/bin/ncu",
                "/opt/nvidia/nsight-compute/*/target/linux-desktop-glibc_2_11_3-x64/ncu"):
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    return None


_NUM = re.compile(r"^[+-]?(\d[\d,]*\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def parse_number(s: str) -> Optional[float]:
    """'83,968' -> 83968.0; '6,668.80' -> 6668.8; 'n/a' / '' -> None."""
    s = s.strip().strip('"')
    if not s:
        return None
    if _NUM.match(s):
        return float(s.replace(",", ""))
    try:
        return float(s)
    except ValueError:
        return None


def parse_cell(raw: str) -> dict:
    """Parse one raw-page cell. Instanced metrics printed with --print-metric-instances details
    look like '83,968 (ISETP: 12,288; BRA: 12,288)' or '512 (0: 512)'; with 'values' like
    '83,968 (12,288; 12,288)'. Returns {"raw", "value": float|None, "instances": dict|list|None}."""
    raw = raw.strip()
    out = {"raw": raw, "value": None, "instances": None}
    m = re.match(r"^(.*?)\s*\((.*)\)\s*$", raw, flags=re.S)
    head, inner = (m.group(1), m.group(2)) if m else (raw, None)
    out["value"] = parse_number(head)
    if inner is not None:
        parts = [p.strip() for p in inner.split(";") if p.strip()]
        if parts and all(": " in p for p in parts):
            inst = {}
            for p in parts:
                key, val = p.rsplit(": ", 1)
                inst[key.strip()] = parse_number(val)
            out["instances"] = inst
        else:
            out["instances"] = [parse_number(p) for p in parts]
    return out


def parse_ncu_csv(text: str) -> list:
    """Parse ``ncu --import R --csv --page raw`` output: a header row of quoted column names, a row
    of units, then one row per profiled kernel. Lines before the header (``==PROF==``/``==WARNING==``)
    are skipped. Returns rows sorted by ID: {"id", "kernel", "metrics": {name: cell+unit}}."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with '\"ID\"') in the output")
    # Some raw metrics are long lists: ncu's CSV for a warp-specialised kernel has cells over the csv
    # module's default 128 KiB field limit (measured on the H100, 2026-11-21).
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, 1 << 30))
    try:
        rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    finally:
        csv.field_size_limit(limit)
    header = rows[0]
    if len(rows) < 2:
        return []
    units = rows[1]
    data_rows = rows[2:]
    if units and units[0].strip():  # no units row (older ncu / --print-units none): first row is data
        data_rows, units = rows[1:], [""] * len(header)
    out = []
    for r in data_rows:
        if len(r) != len(header):
            continue
        cells = dict(zip(header, r))
        metrics = {}
        for name, unit, val in zip(header, units, r):
            if "__" not in name:  # ID, Kernel Name, Grid Size, ... (device__attribute_* keep '__' but are harmless)
                continue
            if name.startswith("device__attribute"):
                continue
            c = parse_cell(val)
            c["unit"] = unit
            metrics[name] = c
        try:
            rid = int(cells.get("ID", "0").replace(",", ""))
        except ValueError:
            rid = len(out)
        out.append({"id": rid, "kernel": cells.get("Kernel Name", ""), "grid": cells.get("Grid Size", ""),
                    "block": cells.get("Block Size", ""), "metrics": metrics})
    out.sort(key=lambda x: x["id"])
    return out


# The kernels that end a call (the attention kernels proper); the secure pre-passes run before them.
MAIN_KERNELS = ("attn_fwd_kernel", "attn_fwd_hopper_kernel")


def _is_main(name: str) -> bool:
    return any(name == k or name.startswith(k + "(") or name.startswith(k + "<") for k in MAIN_KERNELS)


def call_spans(rows: list, n_calls: int) -> list:
    """[(first, end)] row indices of each call: the rows up to its main kernel (:data:`MAIN_KERNELS`), so calls
    of one run may launch different numbers of kernels (a secure call with a pre-pass beside one without); where
    the rows do not split that way (other kernel names), every call gets the same number. Raises ValueError when
    neither split fits."""
    n = len(rows)
    if n_calls == 0:
        raise ValueError("the child profiled no launch")
    spans, first = [], 0
    for i, row in enumerate(rows):
        if _is_main(row["kernel"]):
            spans.append((first, i + 1))
            first = i + 1
    if first == n and len(spans) == n_calls:
        return spans
    if n == 0 or n % n_calls:
        raise ValueError(f"ncu profiled {n} kernel(s) for {n_calls} profiled call(s): not a multiple, and not one "
                         f"main kernel ({', '.join(MAIN_KERNELS)}) per call (kernel-name regex too wide/narrow, or a "
                         f"call launched no kernel?)")
    per = n // n_calls
    return [(i * per, (i + 1) * per) for i in range(n_calls)]


def assign_rows(rows: list, launches: list) -> dict:
    """Map profiled rows (ID order) onto the manifest's launches, a call's rows as :func:`call_spans` splits them.
    Returns {launch_index: {metric_key: cell}}; metric_key is the metric name, or "k<j>:<metric>" when a call
    launched k > 1 kernels. Raises ValueError when the rows do not split into the launches."""
    out = {}
    for i, (first, end) in enumerate(call_spans(rows, len(launches))):
        merged, one = {}, end - first == 1
        for j, row in enumerate(rows[first:end]):
            for name, cell in row["metrics"].items():
                merged[name if one else f"k{j}:{name}"] = cell
            merged["__kernel__" if one else f"k{j}:__kernel__"] = {"raw": row["kernel"], "value": None, "instances": None}
        out[i] = merged
    return out


# ----------------------------------------------------------------------------------------------
# Comparison logic (pure: unit-tested on CPU).

def _comparable(cell: Optional[dict]):
    if cell is None:
        return None
    if cell.get("instances") is not None and isinstance(cell["instances"], dict) and not all(
            k.isdigit() for k in cell["instances"]):
        return ("dict", tuple(sorted(cell["instances"].items())), cell.get("value"))
    if cell.get("value") is not None:
        return cell["value"]
    return cell.get("raw")


def compare_metric(values: dict, policy: str, *, strict_memory: bool = False, alpha: float = 1e-3) -> dict:
    """Compare one metric across classes.

    values: {class_name: [cell_rep0, cell_rep1, ...]} (cells as parsed; None when missing).
    Returns {"status": identical|within_noise|DIFFERS|info|unavailable, "fail": bool, ...}: for
    numeric metrics min/max/spread, the run-to-run noise (largest spread among repetitions of one
    class) and the classes whose value differs from the reference (first) class; for per-opcode
    metrics the opcodes whose counts differ. A "noisy" metric that is not identical is "DIFFERS"
    when an F-test finds a class effect (p < alpha; the repetitions of each class measure the noise)
    and the spread across classes exceeds the run-to-run spread, else "within_noise".
    """
    comps = {c: [_comparable(x) for x in cells] for c, cells in values.items()}
    present = [v for vs in comps.values() for v in vs if v is not None]
    res = {"policy": policy, "status": "unavailable", "fail": False}
    if not present:
        return res
    classes = list(comps)
    ref_cls = classes[0]
    ref = next((v for v in comps[ref_cls] if v is not None), present[0])
    missing = sorted(c for c, vs in comps.items() if any(v is None for v in vs))
    if missing:
        res["missing_in"] = missing
    numeric = all(isinstance(v, (int, float)) for v in present)
    if numeric:
        lo, hi = min(present), max(present)
        noise = max((max(v for v in vs if v is not None) - min(v for v in vs if v is not None))
                    for vs in comps.values() if any(v is not None for v in vs))
        res.update(min=lo, max=hi, spread=hi - lo, rel_spread=(hi - lo) / abs(lo) if lo else (0.0 if hi == lo else None),
                   noise=noise,
                   values={c: [v for v in vs] for c, vs in comps.items()})
    else:
        res["values"] = {c: [_short(v) for v in vs] for c, vs in comps.items()}
    all_same = all(v == ref for v in present) and not missing
    differing = sorted({c for c, vs in comps.items() for v in vs if v is not None and v != ref})
    if differing:
        res["differs_from_" + ref_cls] = differing
    if any(isinstance(v, tuple) and v[0] == "dict" for v in present) and not all_same:
        res["opcode_diff"] = _opcode_diff(comps)
    if policy == "info":
        res["status"] = "info" if not all_same else "identical"
        return res
    if all_same:
        res["status"] = "identical"
        return res
    if policy == "noisy" and numeric:
        groups = [[v for v in vs if v is not None] for vs in comps.values()]
        p = class_effect_pvalue(groups)
        res["p_class_effect"] = p
        res["alpha"] = alpha
        # A difference needs both: the class explains the values (F-test p < alpha) AND the spread
        # across classes exceeds the largest spread among repetitions of one class (a guard against
        # the F-test's normality assumption on these skewed, discrete counters).
        if p is not None and (p >= alpha or res["spread"] <= res["noise"]):
            res["status"] = "within_noise"
            res["fail"] = bool(strict_memory)
        else:
            res["status"] = "DIFFERS"
            res["fail"] = True
        return res
    res["status"] = "DIFFERS"
    res["fail"] = True
    return res


def _short(v):
    if isinstance(v, tuple) and v and v[0] == "dict":
        return {"total": v[2], "n_opcodes": len(v[1])}
    return v


def _opcode_diff(comps: dict) -> dict:
    """{opcode: {class: [counts per rep]}} for every opcode whose count is not the same everywhere."""
    per_op = {}
    for c, vs in comps.items():
        for rep, v in enumerate(vs):
            if not (isinstance(v, tuple) and v[0] == "dict"):
                continue
            for op, cnt in v[1]:
                per_op.setdefault(op, {}).setdefault(c, []).append(cnt)
    diff = {}
    n_cells = sum(1 for vs in comps.values() for v in vs if isinstance(v, tuple) and v[0] == "dict")
    for op, by_c in per_op.items():
        flat = [x for xs in by_c.values() for x in xs]
        if len(flat) != n_cells or len(set(flat)) > 1:
            diff[op] = by_c
    return diff


def compare_config(per_class: dict, *, strict_memory: bool = False, metrics: Optional[list] = None,
                   alpha: float = 1e-3) -> dict:
    """per_class: {class: [ {metric: cell} per rep ]}. Compares every metric present (or ``metrics``)."""
    names = set()
    for reps in per_class.values():
        for cells in reps:
            names.update(k for k in cells if not k.endswith("__kernel__"))
    wanted = set(all_metrics())
    keys = sorted(n for n in names if n.split(":", 1)[-1] in wanted) if metrics is None else list(metrics)
    out = {}
    for key in keys:
        vals = {c: [cells.get(key) for cells in reps] for c, reps in per_class.items()}
        out[key] = compare_metric(vals, policy_of(key), strict_memory=strict_memory, alpha=alpha)
        out[key]["group"] = GROUPS.get(key.split(":", 1)[-1], "other")
    failed = sorted(k for k, r in out.items() if r["fail"])
    noisy = sorted(k for k, r in out.items() if r["status"] == "within_noise")
    return {"metrics": out, "failed": failed, "within_noise": noisy, "pass": not failed}


# ----------------------------------------------------------------------------------------------
# Child: build classes, warm up, launch each call once inside a profiler range.

def _parse_bools(s: str) -> list:
    return [x.strip().lower() in ("1", "true", "yes", "causal") for x in s.split(",") if x.strip()]


def _child_configs(kernel: str, causals: list, lens_modes: list) -> list:
    cfgs = []
    for c in causals:
        if kernel == "secure":
            for m in lens_modes:
                cfgs.append({"kernel": kernel, "causal": c, "lens_mode": m})
        else:
            cfgs.append({"kernel": kernel, "causal": c, "lens_mode": "n/a"})
    return cfgs


def config_key(cfg: dict) -> str:
    return f"{cfg['kernel']}/{'causal' if cfg['causal'] else 'noncausal'}/{cfg['lens_mode']}"


def child_main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(prog="python -m flashcore.audit.counters --child")
    p.add_argument("--child", action="store_true")
    _add_shape_args(p)
    p.add_argument("--kernel", default="secure", choices=I.KERNELS)
    p.add_argument("--manifest", required=True)
    a = p.parse_args(argv)
    dev = torch.device("cuda")
    dtype = I.parse_dtype(a.dtype)
    classes = [c.strip() for c in a.classes.split(",") if c.strip()]
    cases = {c: I.build_case(c, B=a.batch, H=a.heads, Hkv=a.kv_heads or a.heads, S=a.seqlen, D=a.head_dim,
                             dtype=dtype, device=dev, seed=a.seed) for c in classes}
    cfgs = _child_configs(a.kernel, _parse_bools(a.causal), [m.strip() for m in a.lens_modes.split(",") if m.strip()])
    calls, errors, checks = [], {}, {}
    for cfg in cfgs:
        key = config_key(cfg)
        outs = {}
        for cname in classes:
            if cfg["lens_mode"] == "self" and not cases[cname].same_lengths:
                continue
            try:
                fn = I.make_call(cfg["kernel"], cases[cname], causal=cfg["causal"],
                                 lens_mode=cfg["lens_mode"] if cfg["kernel"] == "secure" else "cross", backend=a.backend,
                                 page_size=a.page_size if cfg["kernel"] in I.KV_KINDS else 0,
                                 kv_dtype=a.kv_dtype if cfg["kernel"] in I.KV_KINDS else "same")
                out = fn()
                for _ in range(max(0, a.warmup - 1)):
                    out = fn()
                torch.cuda.synchronize()
            except Exception as e:  # report, keep going with the other classes
                errors[f"{key}/{cname}"] = f"{type(e).__name__}: {e}"
                continue
            calls.append((cfg, cname, fn))
            outs[cname] = out
        if cfg["kernel"] == "secure":
            checks[key] = _output_checks(cases, outs)
        elif cfg["kernel"] in I.KV_KINDS:
            checks[key] = _decode_output_checks(cases, outs)
    launches = []
    for rep in range(a.reps):
        for cfg, cname, fn in calls:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            fn()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            launches.append({**cfg, "config": config_key(cfg), "class": cname, "rep": rep})
    I.write_json(a.manifest, {"launches": launches, "errors": errors, "output_checks": checks,
                              "classes": {c: {"desc": cases[c].desc, "lens_q": cases[c].lens_q, "lens_k": cases[c].lens_k}
                                          for c in classes},
                              "env": I.environment()})
    print(f"[counters child] kernel={a.kernel} profiled {len(launches)} launches, {len(errors)} errors", flush=True)
    return 0


def _checks(outs: dict, zero_rows_ok) -> dict:
    """Output properties of a secure kernel: ``zero_rows_ok(class, out)`` (the rows it must zero are exact zeros);
    padding contents never change the output (len_half / nan_pad / inf_pad share the valid region, so their
    outputs must be equal bit for bit); which outputs contain NaN (informational: 'huge' may overflow scores)."""
    import torch

    res = {"zero_rows": {c: zero_rows_ok(c, out) for c, out in outs.items()},
           "has_nan": {c: bool(torch.isnan(out).any()) for c, out in outs.items()}, "padding_invariance": None}
    fam = [c for c in I.PADDING_FAMILY if c in outs]
    if len(fam) >= 2:
        hashes = {c: I.tensor_bytes_hash(outs[c]) for c in fam}
        res["padding_invariance"] = {"classes": fam, "identical": len(set(hashes.values())) == 1, "sha256": hashes}
    res["pass"] = all(res["zero_rows"].values()) and (res["padding_invariance"] is None or res["padding_invariance"]["identical"])
    return res


def _output_checks(cases: dict, outs: dict) -> dict:
    """The dense secure kernel's (:func:`_checks`): query rows past their length are exact zeros."""
    def zero_rows_ok(c, out):
        return all(bool((out[b, :, n:, :] == 0).all()) for b, n in enumerate(cases[c].lens_q))
    return _checks(outs, zero_rows_ok)


def _decode_output_checks(cases: dict, outs: dict) -> dict:
    """The secure KV-cache calls' (:func:`_checks`): a sequence whose cache is empty outputs exact zeros (every query
    row: decode's one, and chunked prefill's, whose causal diagonal puts every key before them)."""
    def zero_rows_ok(c, out):
        return all(bool((out[b] == 0).all()) for b, n in enumerate(cases[c].lens_k) if n == 0)
    return _checks(outs, zero_rows_ok)


# ----------------------------------------------------------------------------------------------
# Parent: run ncu, parse, compare, report.

def _add_shape_args(p: argparse.ArgumentParser) -> None:
    I.add_shape_arguments(p, batch=2, heads=4, seqlen=512, head_dim=64)
    p.add_argument("--causal", default="0,1", help="comma list of causal flags to audit (default: both)")
    p.add_argument("--lens-modes", default="self,cross",
                   help="secure kernel: 'self' passes seqlens_q=None (query lengths = key lengths), "
                        "'cross' an explicit seqlens_q; each is its own public configuration")
    p.add_argument("--classes", default=",".join(I.CLASSES))
    p.add_argument("--reps", type=int, default=3, help="profiled launches per class (run-to-run noise)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="auto")
    p.add_argument("--page-size", type=int, default=0,
                   help="--secure-kernel decode or prefill: the caches as pages of this many positions (0: contiguous)")
    p.add_argument("--kv-dtype", choices=I.KV_DTYPES, default="same",
                   help="--secure-kernel decode or prefill: the caches' element type (same as q, or fp8: float8_e4m3fn "
                        "with per-(sequence, K/V head) descales)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_shape_args(p)
    p.add_argument("--kernel-regex", default=None,
                   help="ncu --kernel-name regex selecting flashcore's kernels (default: attn, and with --secure-kernel "
                        "decode attn|decode_)")
    p.add_argument("--secure-kernel", choices=("dense", "decode", "prefill"), default="dense",
                   help="the secure kernel audited: dense attention, the KV-cache decode step (one query token per "
                        "sequence against a contiguous cache; secure_decode), or KV-cache chunked prefill (128 query "
                        "tokens per sequence: the Gluon kernel's secure form on Hopper; secure_prefill)")
    p.add_argument("--contrast", default="fast_varlen",
                   help="comma list of contrast kernels (fast_varlen, fast_dense) or 'none'")
    p.add_argument("--contrast-reps", type=int, default=2)
    p.add_argument("--strict-memory", action="store_true",
                   help="fail on any DRAM/L2 difference, even one within run-to-run noise")
    p.add_argument("--noise-alpha", type=float, default=1e-3,
                   help="memory counters: a class effect with F-test p < alpha (and a spread beyond run-to-run noise) is a difference (default 1e-3)")
    p.add_argument("--ncu", default=None, help="path to ncu (default: PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute)")
    p.add_argument("--ncu-timeout", type=int, default=420)
    p.add_argument("--keep-reports", default=None, help="directory to keep the .ncu-rep files in")
    p.add_argument("--per-pc", action="store_true",
                   help="also collect per-instruction counts (ncu SourceCounters) and judge instructions and "
                        "branches per SASS address, setting aside the retry loops of waits, whose trip "
                        "counts follow timing (flashcore.audit.pc_counts); needed for warp-specialised kernels")


def _ncu_version(ncu: str) -> str:
    try:
        r = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
        return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip()
    except Exception as e:
        return f"unknown ({e})"


def _child_cmd(a, kernel: str, manifest: Path) -> list:
    cmd = [sys.executable, "-m", "flashcore.audit.counters", "--child", "--kernel", kernel, "--manifest", str(manifest),
           "--batch", str(a.batch), "--heads", str(a.heads), "--kv-heads", str(a.kv_heads), "--seqlen", str(a.seqlen),
           "--head-dim", str(a.head_dim), "--dtype", a.dtype, "--causal", a.causal, "--lens-modes", a.lens_modes,
           "--classes", a.classes, "--reps", str(a.reps if kernel in I.SECURE_KINDS else a.contrast_reps),
           "--warmup", str(a.warmup), "--seed", str(a.seed), "--backend", a.backend, "--page-size", str(a.page_size),
           "--kv-dtype", a.kv_dtype]
    return cmd


NCU_FLAGS = ["--target-processes", "all", "--profile-from-start", "off", "--clock-control", "none",
             "--cache-control", "all", "--replay-mode", "kernel"]


def profile_kernel(a, ncu: str, kernel: str, workdir: Path) -> dict:
    """Run the child for ``kernel`` under ncu; return {"ok", "rows", "manifest", "log", ...}."""
    manifest = workdir / f"manifest_{kernel}.json"
    rep = workdir / f"ncu_{kernel}"
    metrics = all_metrics()
    dropped = []
    info = {"kernel": kernel, "ok": False}
    t0 = time.time()
    sections = ["--section", "SourceCounters"] if getattr(a, "per_pc", False) else []
    for attempt in range(4):
        cmd = [ncu, *NCU_FLAGS, "--kernel-name", f"regex:{a.kernel_regex}", "--metrics", ",".join(metrics),
               *sections, "-f", "-o", str(rep)] + _child_cmd(a, kernel, manifest)
        info["cmd"] = " ".join(cmd)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.ncu_timeout, env=I.child_env())
        except subprocess.TimeoutExpired as e:
            info["error"] = f"ncu timed out after {a.ncu_timeout} s"
            info["log_tail"] = _tail((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))
            return info
        log = (r.stdout or "") + (r.stderr or "")
        info["returncode"] = r.returncode
        info["log_tail"] = _tail(log)
        if "ERR_NVGPUCTRPERM" in log:
            info["error"] = ("ncu has no permission to read the GPU performance counters (ERR_NVGPUCTRPERM): run as "
                             "root, or load the driver with NVreg_RestrictProfilingToAdminUsers=0")
            return info
        rep_file = rep.with_suffix(".ncu-rep")
        if r.returncode == 0 and rep_file.exists():
            break
        bad = sorted({m for m in metrics if m in log and re.search(r"(ERROR|error|invalid|Invalid|not found|Failed).*"
                                                                      + re.escape(m), log)})
        if bad and attempt < 3:
            dropped += bad
            metrics = [m for m in metrics if m not in bad]
            continue
        info["error"] = f"ncu exited with {r.returncode}" + ("" if rep_file.exists() else " and wrote no report")
        return info
    info["dropped_metrics"] = dropped
    info["profile_s"] = round(time.time() - t0, 1)
    text, err = None, None
    for extra in (["--print-units", "base", "--print-metric-instances", "details"], ["--print-units", "base"], []):
        r = subprocess.run([ncu, "--import", str(rep.with_suffix(".ncu-rep")), "--csv", "--page", "raw", *extra],
                           capture_output=True, text=True, timeout=300)
        if r.returncode == 0 and '"ID"' in r.stdout:
            text = r.stdout
            info["import_flags"] = extra
            break
        err = _tail(r.stdout + r.stderr)
    if text is None:
        info["error"] = f"ncu --import failed: {err}"
        return info
    rows = parse_ncu_csv(text)
    if getattr(a, "per_pc", False):
        r = subprocess.run([ncu, "--import", str(rep.with_suffix(".ncu-rep")), "--csv", "--page", "source",
                            "--print-source", "sass"], capture_output=True, text=True, timeout=600)
        try:
            info["pc_blocks"] = parse_source_csv(r.stdout)
        except ValueError as e:
            info["error"] = f"ncu --page source: {e}: {_tail(r.stdout + r.stderr, 1000)}"
            return info
        if len(info["pc_blocks"]) != len(rows):
            info["error"] = f"ncu's source page has {len(info['pc_blocks'])} kernels for {len(rows)} profiled rows"
            return info
    try:
        man = json.loads(manifest.read_text())
    except Exception as e:
        info["error"] = f"child wrote no manifest ({e}); see log_tail"
        return info
    present = set()
    for row in rows:
        present.update(row["metrics"])
    info["unavailable_metrics"] = sorted(m for m in metrics if m not in present)
    info.update(ok=True, rows=rows, manifest=man, n_rows=len(rows), n_launches=len(man["launches"]))
    if a.keep_reports:
        Path(a.keep_reports).mkdir(parents=True, exist_ok=True)
        shutil.copy(rep.with_suffix(".ncu-rep"), Path(a.keep_reports) / rep.with_suffix(".ncu-rep").name)
    return info


def _tail(s: str, n: int = 4000) -> str:
    return s[-n:] if s else ""


def analyse(info: dict, *, strict_memory: bool, alpha: float = 1e-3) -> dict:
    """Group the profiled rows by configuration and class and compare each configuration."""
    man = info["manifest"]
    launches = man["launches"]
    mapped = assign_rows(info["rows"], launches)
    by_cfg = {}
    for i, l in enumerate(launches):
        by_cfg.setdefault(l["config"], {}).setdefault(l["class"], []).append(mapped[i])
    out = {}
    for key, per_class in by_cfg.items():
        res = compare_config(per_class, strict_memory=strict_memory, alpha=alpha)
        kernels = sorted({cell.get("raw", "?") for reps in per_class.values() for cells in reps
                          for name, cell in cells.items() if name.endswith("__kernel__")})  # "k<j>:__kernel__" too
        res.update(config=key, classes=list(per_class), kernels=kernels, reps=max(len(v) for v in per_class.values()))
        if info.get("pc_blocks") is not None:
            spans = call_spans(info["rows"], len(launches))
            apply_per_pc(res, _pc_by_class(info["pc_blocks"], launches, key, spans), alpha=alpha)
        out[key] = res
    return out


def _pc_by_class(blocks: list, launches: list, config: str, spans: list | None = None) -> list:
    """[{class: [source block per rep]} per kernel of the call] for one configuration (blocks in ID order, like
    the raw rows: call i's kernels are blocks spans[i]; default: every call the same number)."""
    if spans is None:
        per = len(blocks) // len(launches)
        spans = [(i * per, (i + 1) * per) for i in range(len(launches))]
    mine = [(l, spans[i]) for i, l in enumerate(launches) if l["config"] == config]
    out = [{} for _ in range(max((e - f for _, (f, e) in mine), default=0))]
    for l, (first, end) in mine:
        for j in range(end - first):
            out[j].setdefault(l["class"], []).append(blocks[first + j])
    return out


# Aggregate counters that a retry loop's trip count moves: with per-instruction counts, these are
# judged per address instead (pc_counts), and kept here as information.
PER_PC_SUPERSEDES = ("instructions", "branches")


def apply_per_pc(res: dict, per_kernel: list, *, alpha: float = 1e-3) -> dict:
    """Judge a configuration's instructions and branches per SASS address (``per_kernel``: one
    {class: [source block per rep]} per kernel of the call). The aggregate instruction and branch
    counters become information ("per_pc"): they must still agree outside retry loops, which the
    per-address comparison checks address by address, across every class and repetition."""
    res["per_pc"] = [compare_launches(pk, alpha=alpha) for pk in per_kernel]
    for name, r in res["metrics"].items():
        if r.get("group") in PER_PC_SUPERSEDES and r["status"] == "DIFFERS":
            r.update(status="per_pc", fail=False)
    res["failed"] = sorted(k for k, r in res["metrics"].items() if r["fail"])
    if not all(p["pass"] for p in res["per_pc"]):
        res["failed"].append("per_pc")
    res["pass"] = not res["failed"]
    return res


def _is_secure_config(key: str) -> bool:
    """A configuration key (:func:`config_key`) of a secure kernel (the gate's subject, not a contrast)."""
    return key.split("/")[0] in I.SECURE_KINDS


def run(a) -> int:
    if not I.cuda_or_message("counters"):
        return 2
    ncu = find_ncu(a.ncu)
    if ncu is None:
        print("flashcore audit counters: Nsight Compute (ncu) not found on PATH, in /usr/local/cuda/bin or "
              "/opt/nvidia/nsight-compute/*/; pass --ncu PATH. Nothing was run.", file=sys.stderr)
        return 2
    secure_kind = {"decode": "secure_decode", "prefill": "secure_prefill"}.get(a.secure_kernel, "secure")
    if a.kv_dtype != "same" and secure_kind not in I.KV_KINDS:
        print(f"flashcore audit counters: --kv-dtype {a.kv_dtype} is for --secure-kernel decode or prefill (the "
              "KV-cache kernels). Nothing was run.", file=sys.stderr)
        return 2
    if a.kernel_regex is None:
        a.kernel_regex = "attn|decode_" if secure_kind == "secure_decode" else "attn"
    report = {"gate": "counters", "ncu": {"path": ncu, "version": _ncu_version(ncu), "flags": NCU_FLAGS,
                                          "kernel_regex": a.kernel_regex},
              "shape": {"B": a.batch, "H": a.heads, "Hkv": a.kv_heads or a.heads, "S_max": a.seqlen, "D": a.head_dim,
                        "dtype": a.dtype, "causal": a.causal, "lens_modes": a.lens_modes, "page_size": a.page_size,
                        "kv_dtype": a.kv_dtype},
              "reps": a.reps, "strict_memory": bool(a.strict_memory), "env": I.environment(),
              "gpu_state_start": I.gpu_state()}
    kernels = [secure_kind] + [k.strip() for k in a.contrast.split(",") if k.strip() and k.strip() != "none"]
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="flashcore_ncu_") as td:
        runs = {}
        for k in kernels:
            print(f"[counters] profiling {k} under ncu ...", flush=True)
            runs[k] = profile_kernel(a, ncu, k, Path(td))
            if runs[k].get("error"):
                print(f"[counters] {k}: {runs[k]['error']}", file=sys.stderr)
    report["elapsed_s"] = round(time.time() - t0, 1)
    report["runs"] = {k: {kk: vv for kk, vv in v.items() if kk not in ("rows", "manifest", "pc_blocks")}
                      for k, v in runs.items()}
    report["per_pc"] = bool(getattr(a, "per_pc", False))
    configs = {}
    for k, info in runs.items():
        if not info.get("ok"):
            continue
        man = info["manifest"]
        report["runs"][k]["child_errors"] = man.get("errors", {})
        if k == secure_kind:
            report["classes"] = man.get("classes")
            report["output_checks"] = man.get("output_checks")
        try:
            configs.update(analyse(info, strict_memory=a.strict_memory, alpha=a.noise_alpha))
        except ValueError as e:
            report["runs"][k]["error"] = str(e)
            print(f"[counters] {k}: {e}", file=sys.stderr)
    report["configs"] = configs
    report["gpu_state_end"] = I.gpu_state()
    sec = {k: v for k, v in configs.items() if _is_secure_config(k)}
    secure_err = report["runs"][secure_kind].get("error") or (report["runs"][secure_kind].get("child_errors") or None)
    if not sec or report["runs"][secure_kind].get("error"):
        status, code = "error", 2
    elif not all(v["pass"] for v in sec.values()):
        status, code = "FAIL", 1
    elif secure_err:
        status, code = "FAIL", 1  # the secure kernel raised on a valid input class: incomplete, not passed
    else:
        status, code = "pass", 0
    checks = report.get("output_checks") or {}
    if code == 0 and any(not c.get("pass", True) for c in checks.values()):
        status, code = "FAIL", 1
    contrast = {k: v for k, v in configs.items() if not _is_secure_config(k)}
    report["contrast_detected"] = {k: bool(v["failed"]) for k, v in contrast.items()}
    report.update(status=status, exit_code=code)
    I.publish(a, "counters", report, print_report)
    return code


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=170)
    for key, res in (report.get("configs") or {}).items():
        secure = _is_secure_config(key)
        t = Table(title=f"{key}: {'PASS' if res['pass'] else ('differences (contrast)' if not secure else 'FAIL')} "
                        f"- {len(res['classes'])} classes x {res['reps']} reps", show_lines=False)
        for col in ("metric", "group", "status", "min", "max", "spread", "run-to-run", "p(class)"):
            t.add_column(col, justify="right" if col in ("min", "max", "spread", "run-to-run", "p(class)") else "left")
        for m, r in sorted(res["metrics"].items(), key=lambda kv: (kv[1].get("group", ""), kv[0])):
            if not secure and r["status"] in ("identical", "unavailable"):
                continue
            st = r["status"]
            style = {"identical": "green", "within_noise": "yellow", "DIFFERS": "bold red", "info": "dim"}.get(st, "")
            fmt = lambda x: "" if x is None else (f"{x:,.0f}" if isinstance(x, float) and abs(x) >= 100 else f"{x:,.4g}")
            t.add_row(m, r.get("group", ""), f"[{style}]{st}[/{style}]" if style else st,
                      fmt(r.get("min")), fmt(r.get("max")), fmt(r.get("spread")), fmt(r.get("noise")),
                      "" if r.get("p_class_effect") is None else f"{r['p_class_effect']:.3g}")
        con.print(t)
        for pc in res.get("per_pc") or []:
            moved = {off: r for off, r in pc["retry_loops"].items() if r["spread"]}
            con.print(f"  per instruction ({pc['kernel']}): {pc['n_instructions']} instructions x {pc['n_launches']} "
                      f"launches; {len(pc['differing'])} differing outside retry loops; {len(pc['retry_loops'])} retry "
                      f"loops, {len(moved)} of which ran a different number of times; "
                      f"{len(pc['predicated_on_differs'])} predicated selects (info)"
                      + (f" (class explains: {[o for o, r in moved.items() if r['class_explains']]})" if moved else ""))
            for d in pc["differing"][:10]:
                con.print(f"    [bold red]{d['offset']}[/] {d['sass']}: {d['column']} {d['values']}")
            if pc.get("listing_mismatch"):
                con.print(f"    [bold red]different machine code in classes {pc['listing_mismatch']}[/]")
        if res["failed"]:
            con.print(f"  [bold red]differing required metrics:[/] {', '.join(res['failed'])}")
    for k, r in (report.get("runs") or {}).items():
        if r.get("unavailable_metrics"):
            con.print(f"[yellow]{k}: metrics ncu did not report:[/] {', '.join(r['unavailable_metrics'])}")
        if r.get("child_errors"):
            con.print(f"[red]{k}: calls that failed in the child:[/] {r['child_errors']}")
        if r.get("error"):
            con.print(f"[red]{k}: {r['error']}[/]")
    for k, c in (report.get("output_checks") or {}).items():
        con.print(f"output checks {k}: zero_rows={c.get('zero_rows')} padding_invariance="
                  f"{(c.get('padding_invariance') or {}).get('identical')} has_nan={ {x: y for x, y in c.get('has_nan', {}).items() if y} }")


if __name__ == "__main__":
    sys.exit(I.module_main("python -m flashcore.audit.counters", add_arguments, run, child_main))
