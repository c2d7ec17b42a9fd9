"""Device-side A/B and investigation tools: not part of the library's API and not run routinely (the routine
GPU runs are ``flashcore bench``, ``flashcore bench gpu-check|sweep|timeline`` and ``flashcore audit``). Each is
a module run on a GPU machine as ``python -m flashcore.bench.experiments.<name> [--help]``; each writes its JSON
to ``--out`` (default ``$OUT`` or ``.``). docs/perf-notes.md says which version used which tool, and what it found.

* ``gluon_ab``: A/B of the Gluon kernel's switches (``plan.knobs.GluonSwitches``) and of configs, with
  correctness checks against float64, timed in the bench harness's way and with ``do_bench``;
* ``cost_fit``: fixed and per-unit costs beside SDPA's, fitted over shape series (key tiles, items per program);
* ``host_latency``: host cost of one eager call per kernel (with and without the Gluon launch's descriptor
  cache) beside SDPA; ``--dispatch`` for the small-shape kernel threshold;
* ``ncu_compare``: Nsight Compute, one flashcore config beside SDPA's kernel on one shape;
* ``kernel_trace``: kernel time versus launch gap from the profiler's kernel timestamps;
* ``launch_overhead``: what ``do_bench``'s per-call window holds besides the kernel (primers, tiny problems);
* ``audit_gpu``: the GPU audit gates (counters, repro, timing; sass if time is left) in one device call,
  with a time budget, a ``--quick`` smoke mode and a summary table (docs/security.md §4);
* ``robustness``: compute-sanitizer (memcheck, racecheck, synccheck) over every kernel family, and 8 threads
  calling at once against single-threaded results (issue 24's reports, audit/results/robustness-*);
  ``--racecheck-controls``: racecheck on control kernels, one form at a time (docs/reliability.md);
* ``wg_count``: two consumer warpgroups against three at D=64, fast and secure, on the installed Triton's toolchain
  (plan.tables.SECURE_D64_TWO_WG);
* ``secure_ab``: secure mode with forced configurations (the one-warpgroup Gluon layout, two warpgroups, the
  Triton kernel) against the fast path, checked against float64 and timed as the bench times (issue 25 §3);
* ``prepass_tiles``: the secure pre-passes' tile configurations (rows per program, warps) beside a plain copy of the
  same bytes, each checked bit for bit against the first configuration's output (docs/perf-notes.md v45);
* ``prefill_v``: secure chunked prefill with V cleaned by the V pre-pass against cleared by the loader warpgroup,
  beside the fast path, each checked against float64 and the two secure forms bit for bit (docs/perf-notes.md v46);
* ``secure_v_seen``: secure KV-cache decode with V's stale rows zeroed by a select from loaded tensors against the
  select on a range and scalars, beside the fast path, at the planner's and extra configurations, each checked against
  float64 and the two selects bit for bit (docs/perf-notes.md v47);
* ``kv_configs``: the KV-cache split kernel's configurations and loop forms (``DecodeConfig``, incl. ``full_tiles``
  and ``reg_pages``) timed as CUDA-graph replays per shape, a correctness check against float64, and the host time of
  a KV-cache call and its pieces (docs/perf-notes.md v22);
* ``bwd_configs``: backward configurations (``plan.backward.BwdConfig``) timed per shape on saved forward tensors,
  beside SDPA's backward, with each gradient's error against an fp32 reference (docs/perf-notes.md v26);
* ``train_power``: SM clock, power draw and active clock limit while flashcore's and cuDNN's forward+backward run
  at a steady load (docs/perf-notes.md v37: an H100 at training load runs at its power cap);
* ``hf_generate``: transformers generation (a random 8-layer Llama of 8B width, bf16) with flashcore as the
  attention implementation beside ``sdpa``: prefill and decode tokens/s, batch 1 and 32, prompt 2048, 256 new tokens.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics


def parser(module: str, doc: str, out_default: str = ".") -> argparse.ArgumentParser:
    """The command line of ``python -m <module>``: its docstring as the description, and ``--out`` (default
    ``$OUT``, else ``out_default``)."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or out_default, help=f"where the files go (default: $OUT, else {out_default})")
    return ap


def write_json(out_dir: str, name: str, doc) -> str:
    """``doc`` as ``out_dir/name`` (indented JSON; the directory made if needed); returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def interleaved_rounds(fns: dict, rounds: int, time_one) -> tuple[dict, dict]:
    """Each callable of ``fns`` (name -> callable) timed once per round in turn, ``rounds`` rounds, by ``time_one(fn)``
    (a number): ``({name: [one value per round]}, {name: median of its rounds})``. Interleaving keeps clock drift and
    other tenants out of the comparison between names."""
    per_round = {n: [] for n in fns}
    for _ in range(rounds):
        for n, fn in fns.items():
            per_round[n].append(time_one(fn))
    return per_round, {n: statistics.median(v) for n, v in per_round.items()}


def add_ab_arguments(ap: argparse.ArgumentParser, *, rep_ms: float, seed: int, listed: str) -> None:
    """The A/B tools' common options: ``--rounds``, ``--rep-ms`` (per timed measurement), ``--seed`` and ``--only``
    (a comma list of indices into the tool's ``listed`` table)."""
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-ms", type=float, default=rep_ms)
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--only", default="", help=f"comma list of {listed} indices (default: all)")


def picked(only: str, count: int) -> list:
    """The indices ``--only`` names (all ``count`` when it names none)."""
    return [int(i) for i in only.split(",") if i] or list(range(count))


@functools.lru_cache(maxsize=None)
def _timer():
    from ..timing import Timer

    return Timer()  # one per process: it holds the flush buffer


def cold_l2_rounds(fns: dict, rounds: int, rep_ms: float) -> tuple[dict, dict]:
    """:func:`interleaved_rounds` timing each callable as the decode bench does: the median µs of the bench timer's
    calls with the L2 flushed before each (``bench.timing.Timer``)."""
    timer = _timer()
    return interleaved_rounds(fns, rounds,
                              lambda fn: 1e3 * statistics.median(timer.measure([fn], flush=True, rep_ms=rep_ms)))


def write_rows(out_dir: str, name: str, method: str, rows: list) -> str:
    """``{"env": the machine and versions (bench.results.collect_environment) with ``method``, "rows": rows}`` as
    ``out_dir/name``; returns the path."""
    from ..results import collect_environment

    return write_json(out_dir, name, {"env": dict(collect_environment(), method=method), "rows": rows})


def print_us_table(title: str, rows: list, names: list, label, ratio_key: str, width: int, heading=str) -> None:
    """``title``, a heading line, then per row ``label(row)`` and per name "µs (ratio)" from ``row["us"]`` and
    ``row[ratio_key]`` (µs alone without a ratio, "-" where the name was not timed)."""
    print(title)
    print(f"{'shape':>16} " + " ".join(f"{heading(n):>{width}}" for n in names))
    for r in rows:
        cells = []
        for n in names:
            ratio = r[ratio_key].get(n)
            cell = "-" if n not in r["us"] else f"{r['us'][n]:.1f} ({ratio:.2f})" if ratio else f"{r['us'][n]:.1f}"
            cells.append(f"{cell:>{width}}")
        print(f"{label(r):>16} " + " ".join(cells))
