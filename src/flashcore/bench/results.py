"""Result documents: environment capture, the JSON schema (and its validator), files, comparison.

Layout of one run (``schema: "flashcore-bench/1"``)::

    {
      "schema", "created", "complete", "aborted",
      "environment": {"date", "git_sha", "gpu": {...} | null, "versions": {...}},
      "config": {"suite", "dtype", "backends", "rep_ms", "tolerance", "method": {...}},
      "ceilings": {"matmul_tflops", "copy_gbps", "matmul": {...}, "copy": {...}} | null,
      "backends": {name: {"label", "available", "reason"}},
      "results": [
        {"key", "label", "shape": {...}, "flops", "io_bytes", "method", "input_sets",
         "fastest_peer", "backends": {name: {"status", "reason", "rel_err", "timing", "us_per_head",
             "tflops", "frac_matmul_ceiling", "frac_copy_ceiling", "vs_sdpa_default",
             "vs_fastest_peer", "host_latency_us", "cuda_graph_us", "cuda_graph_status"}}}
      ]
    }

The decode suite (``flashcore bench --suite decode``, :mod:`flashcore.bench.decode`) writes the same document,
file ``bench-decode-<gpu>-<date>-<sha>.json``, extended (checked by :func:`validate_decode_document`, which
:func:`validate_document` runs whenever ``config.decode`` is present)::

    config.decode: {name: note}        what each figure means (bytes, ceiling, check, peers' inputs)
    ceilings: + "read_gbps", "read"    read-only bandwidth (context; fractions are of copy_gbps)
    results[i]: + "decode": {"cache_len", "page_size", "layout", "kv_dtype", "Sq", "kv_bytes", "kv_bytes_bf16",
                             "must_have", ...}
                  shape: Sk = cache_len (+ "cache_len", "page_size", "layout", "kv_dtype")
    results[i].backends[name]: + "kv_bytes", "kv_gbps", "kv_gbps_bf16_equiv", "frac_read_ceiling"
                  frac_copy_ceiling = kv_gbps / copy_gbps (K/V bytes read, not io_bytes)
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
from typing import Optional

from .stats import STAT_KEYS, geomean

SCHEMA_VERSION = "flashcore-bench/1"
STATUSES = ("ok", "wrong", "unsupported", "skipped", "unavailable", "oom", "error")
NUMBER = (int, float)


class SchemaError(ValueError):
    """A result document does not follow the schema; the message gives the path of the bad key."""


# ---------------------------------------------------------------- environment
def _git(*args: str, timeout: float = 10) -> Optional[str]:
    """stdout of ``git ARGS`` run beside this package (None: no git, or it failed)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _git_sha() -> str:
    env = os.environ.get("FLASHCORE_GIT_SHA")
    if env:
        return env.strip()
    sha = (_git("rev-parse", "HEAD") or "").strip()
    return sha if re.fullmatch(r"[0-9a-f]{7,64}", sha) else "unknown"


def _git_dirty() -> Optional[bool]:
    """Whether the tracked files differ from ``HEAD`` (None: no git). A copy of a working tree run elsewhere (the
    GPU machine's) may carry an older ``.git`` than its files: its ``git_sha`` then names a commit that did not run."""
    if os.environ.get("FLASHCORE_GIT_SHA"):
        return None
    out = _git("status", "--porcelain", "--untracked-files=no", timeout=30)
    return None if out is None else bool(out.strip())


def source_sha256(root: Optional[str] = None) -> str:
    """sha256 of the package's Python sources (each path relative to the package, then its bytes, in path order):
    names the code that ran whatever ``.git`` says."""
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    paths = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        paths += [os.path.join(d, f) for f in files if f.endswith(".py")]
    for path in sorted(paths, key=lambda p: os.path.relpath(p, root)):
        h.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


_SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
               "power.limit", "temperature.gpu", "pstate")


def _nvidia_smi(gpu_name: Optional[str]) -> Optional[dict]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) == len(_SMI_FIELDS)]
    if out.returncode != 0 or not rows:
        return None
    row = next((r for r in rows if gpu_name and r[0] == gpu_name), rows[0])
    text_fields = ("name", "driver_version", "pstate")  # "535.104" is a version, not a number
    return {field: value if field in text_fields else _maybe_number(value) for field, value in zip(_SMI_FIELDS, row)}


def _maybe_number(text: str):
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() else value


def _dist_version(*names: str) -> Optional[str]:
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _flash_attn_version() -> Optional[str]:
    version = _dist_version("fa4", "flash-attn-4", "flash_attn_4", "flash-attn-cute", "flash-attn")
    module = sys.modules.get("flash_attn.cute")  # a source checkout on PYTHONPATH has no metadata
    if version is None and module is not None:
        version = getattr(module, "__version__", None)
    return version


def gpu_info() -> Optional[dict]:
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    smi = _nvidia_smi(props.name)
    l2 = getattr(props, "L2_cache_size", None)
    try:  # needs pynvml; nvidia-smi below is the usual source
        torch_clock = torch.cuda.clock_rate(index)
    except Exception:
        torch_clock = None
    return {
        "name": props.name,
        "index": index,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 1024 ** 3, 2),
        "l2_bytes": int(l2) if l2 else None,
        "driver": smi.get("driver_version") if smi else None,
        "clocks_mhz": ({k.replace("clocks.", "").replace(".", "_"): smi[k] for k in _SMI_FIELDS if k.startswith("clocks.")}
                       if smi else None),
        "nvidia_smi": smi,
        "torch_clock_rate_mhz": torch_clock,
    }


def versions() -> dict:
    import torch

    import flashcore

    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "flashcore": flashcore.__version__,
        "flash_attn": _flash_attn_version(),
        "numpy": _dist_version("numpy"),
    }


def now_utc() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)


def collect_environment(date: Optional[_dt.datetime] = None) -> dict:
    date = date or now_utc()
    return {"date": date.isoformat(), "git_sha": _git_sha(), "git_dirty": _git_dirty(), "source_sha256": source_sha256(),
            "gpu": gpu_info(), "versions": versions(), "platform": platform.platform()}


def result_filename(doc: dict) -> str:
    """``bench-<gpu>-<date>-<sha>.json``."""
    env = doc["environment"]
    gpu = (env.get("gpu") or {}).get("name") or "nogpu"
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "gpu"
    try:
        stamp = _dt.datetime.fromisoformat(env["date"]).strftime("%Y%m%d-%H%M%S")
    except (KeyError, ValueError):
        stamp = "undated"
    sha = env.get("git_sha") or "unknown"
    kind = "bench-decode" if is_decode_document(doc) else "bench"
    dirty = "-dirty" if env.get("git_dirty") else ""  # the tracked files were not those of git_sha
    return f"{kind}-{slug}-{stamp}-{sha[:7] if sha != 'unknown' else 'unknown'}{dirty}.json"


def is_decode_document(doc: dict) -> bool:
    return isinstance((doc.get("config") or {}).get("decode"), dict)


# ---------------------------------------------------------------- document construction
def empty_backend_result(status: str, reason: str = "") -> dict:
    return {"status": status, "reason": reason, "rel_err": None, "timing": None, "us_per_head": None,
            "tflops": None, "frac_matmul_ceiling": None, "frac_copy_ceiling": None, "vs_sdpa_default": None,
            "vs_fastest_peer": None, "host_latency_us": None, "cuda_graph_us": None, "cuda_graph_status": None}


def new_document(environment: dict, config: dict, ceilings: Optional[dict], backends: dict) -> dict:
    return {"schema": SCHEMA_VERSION, "created": environment.get("date") or now_utc().isoformat(), "complete": False,
            "aborted": None, "environment": environment, "config": config, "ceilings": ceilings,
            "backends": backends, "results": []}


def fill_derived(entry: dict, ceilings: Optional[dict], flashcore_names=("flashcore", "flashcore-secure"),
                 sdpa_name: str = "sdpa-default") -> None:
    """Per-shape figures that need all backends: TFLOP/s, ceiling fractions, speed ratios."""
    results = entry["backends"]
    ok = {n: r for n, r in results.items() if r["status"] == "ok" and r.get("timing")}
    heads = entry["shape"]["B"] * entry["shape"]["Hq"]
    for r in ok.values():
        seconds = r["timing"]["median_us"] * 1e-6
        r["us_per_head"] = r["timing"]["median_us"] / heads
        r["tflops"] = entry["flops"] / seconds / 1e12
        if ceilings:
            r["frac_matmul_ceiling"] = r["tflops"] / ceilings["matmul_tflops"]
            r["frac_copy_ceiling"] = entry["io_bytes"] / seconds / 1e9 / ceilings["copy_gbps"]
    peers = {n: r for n, r in ok.items() if n not in flashcore_names}
    fastest = min(peers, key=lambda n: peers[n]["timing"]["median_us"]) if peers else None
    entry["fastest_peer"] = fastest
    for r in ok.values():
        med = r["timing"]["median_us"]
        if sdpa_name in ok:
            r["vs_sdpa_default"] = ok[sdpa_name]["timing"]["median_us"] / med
        if fastest is not None:
            r["vs_fastest_peer"] = peers[fastest]["timing"]["median_us"] / med


# ---------------------------------------------------------------- validation
def _expect(cond: bool, path: str, message: str) -> None:
    if not cond:
        raise SchemaError(f"{path}: {message}")


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


def _check_type(value, types, path: str, *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in _as_tuple(types))
    if ok and isinstance(value, float):
        ok = math.isfinite(value)
    names = "/".join(t.__name__ for t in _as_tuple(types)) + (" or null" if nullable else "")
    _expect(ok, path, f"expected {names}, got {_type_name(value)} {value!r}"[:200])


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def _check_keys(obj, required: dict, path: str) -> None:
    _check_type(obj, dict, path)
    for key, (types, nullable) in required.items():
        _expect(key in obj, path, f"missing key '{key}'")
        _check_type(obj[key], types, f"{path}.{key}", nullable=nullable)


_TOP = {"schema": (str, False), "created": (str, False), "complete": (bool, False), "aborted": (str, True),
        "environment": (dict, False), "config": (dict, False), "ceilings": (dict, True), "backends": (dict, False),
        "results": (list, False)}
_ENV = {"date": (str, False), "git_sha": (str, False), "gpu": (dict, True), "versions": (dict, False)}
_CONFIG = {"suite": (str, False), "dtype": (str, False), "backends": (list, False), "rep_ms": (NUMBER, False),
           "tolerance": (NUMBER, False), "method": (dict, False)}
_CEILINGS = {"matmul_tflops": (NUMBER, False), "copy_gbps": (NUMBER, False)}
_ENTRY = {"key": (str, False), "label": (str, False), "shape": (dict, False), "flops": (int, False),
          "io_bytes": (int, False), "method": (str, False), "fastest_peer": (str, True), "backends": (dict, False)}
_SHAPE = {"B": (int, False), "Hq": (int, False), "Hkv": (int, False), "Sq": (int, False), "Sk": (int, False),
          "D": (int, False), "causal": (bool, False), "varlen": (list, True)}
_RESULT = {"status": (str, False), "reason": (str, False), "rel_err": (NUMBER, True), "timing": (dict, True),
           "us_per_head": (NUMBER, True), "tflops": (NUMBER, True), "frac_matmul_ceiling": (NUMBER, True),
           "frac_copy_ceiling": (NUMBER, True), "vs_sdpa_default": (NUMBER, True), "vs_fastest_peer": (NUMBER, True),
           "host_latency_us": (NUMBER, True), "cuda_graph_us": (NUMBER, True), "cuda_graph_status": (str, True)}
_TIMING = dict({"n": (int, False), "do_bench_median_us": (NUMBER, True)}, **{k: (NUMBER, False) for k in STAT_KEYS})


def validate_document(doc) -> None:
    """Raise SchemaError (naming the offending key path) unless ``doc`` is a valid result document."""
    _check_keys(doc, _TOP, "$")
    _expect(doc["schema"] == SCHEMA_VERSION, "$.schema", f"expected {SCHEMA_VERSION!r}, got {doc['schema']!r}")
    _check_keys(doc["environment"], _ENV, "$.environment")
    _check_keys(doc["config"], _CONFIG, "$.config")
    if doc["ceilings"] is not None:
        _check_keys(doc["ceilings"], _CEILINGS, "$.ceilings")
    for name, info in doc["backends"].items():
        _check_keys(info, {"label": (str, False), "available": (bool, False), "reason": (str, False)},
                    f"$.backends.{name}")
    for i, entry in enumerate(doc["results"]):
        _validate_entry(entry, f"$.results[{i}]")
    if "decode" in doc["config"]:
        validate_decode_document(doc)


def _validate_entry(entry, path: str) -> None:
    _check_keys(entry, _ENTRY, path)
    _check_keys(entry["shape"], _SHAPE, f"{path}.shape")
    for name, result in entry["backends"].items():
        rpath = f"{path}.backends.{name}"
        _check_keys(result, _RESULT, rpath)
        _expect(result["status"] in STATUSES, f"{rpath}.status", f"expected one of {STATUSES}, got {result['status']!r}")
        if result["status"] == "ok":
            _expect(result["timing"] is not None, f"{rpath}.timing", "required when status is 'ok'")
            _expect(result["rel_err"] is not None, f"{rpath}.rel_err", "required when status is 'ok'")
            _check_type(result["tflops"], NUMBER, f"{rpath}.tflops")
        if result["timing"] is not None:
            _check_keys(result["timing"], _TIMING, f"{rpath}.timing")
            t = result["timing"]
            _expect(t["min_us"] <= t["median_us"] <= t["max_us"], f"{rpath}.timing",
                    "expected min_us <= median_us <= max_us")


_DECODE_INFO = {"cache_len": (int, False), "page_size": (int, False), "layout": (str, False), "kv_dtype": (str, False),
                "Sq": (int, False), "kv_bytes": (int, False), "kv_bytes_bf16": (int, False), "must_have": (bool, False)}
_DECODE_RESULT = {"kv_bytes": (int, True), "kv_gbps": (NUMBER, True), "kv_gbps_bf16_equiv": (NUMBER, True),
                  "frac_read_ceiling": (NUMBER, True)}
_KV_ELEMENT_SIZE = {"bf16": 2, "fp8": 1}


def validate_decode_document(doc) -> None:
    """The decode suite's extension of the schema (see the module docstring): SchemaError naming the key path.
    Also checks each case's byte count against its shape (B x cache_len x Hkv x D x 2 x element size)."""
    _check_type(doc.get("config", {}).get("decode"), dict, "$.config.decode")
    for i, entry in enumerate(doc["results"]):
        path = f"$.results[{i}]"
        _expect("decode" in entry, path, "missing key 'decode'")
        info = entry["decode"]
        _check_keys(info, _DECODE_INFO, f"{path}.decode")
        _expect(info["kv_dtype"] in _KV_ELEMENT_SIZE, f"{path}.decode.kv_dtype",
                f"expected one of {tuple(_KV_ELEMENT_SIZE)}, got {info['kv_dtype']!r}")
        s = entry["shape"]
        per_element = s["B"] * info["cache_len"] * s["Hkv"] * s["D"] * 2
        _expect(info["kv_bytes"] == per_element * _KV_ELEMENT_SIZE[info["kv_dtype"]], f"{path}.decode.kv_bytes",
                f"expected B x cache_len x Hkv x D x 2 x element size = "
                f"{per_element * _KV_ELEMENT_SIZE[info['kv_dtype']]}, got {info['kv_bytes']}")
        _expect(info["kv_bytes_bf16"] == per_element * 2, f"{path}.decode.kv_bytes_bf16",
                f"expected {per_element * 2}, got {info['kv_bytes_bf16']}")
        for name, result in entry["backends"].items():
            rpath = f"{path}.backends.{name}"
            _check_keys(result, _DECODE_RESULT, rpath)
            if result["status"] == "ok":
                for key in ("kv_bytes", "kv_gbps", "kv_gbps_bf16_equiv"):
                    _expect(result[key] is not None, f"{rpath}.{key}", "required when status is 'ok'")


# ---------------------------------------------------------------- files
def _sanitize(value):
    """NaN/Inf → None so the file is strict JSON (json.dump(allow_nan=False))."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_sanitize(v) for v in value]
    return value


def save_document(doc: dict, path: str) -> str:
    """Write atomically (a killed run leaves the previous complete checkpoint, never half a file)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_sanitize(doc), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read_json_file(path: str, what: str, error: type = ValueError):
    """The parsed contents of a JSON file; ``error`` naming the path when it is missing or invalid."""
    if not os.path.isfile(path):
        raise error(f"{what} not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def load_document(path: str) -> dict:
    """Read and validate a result file; ValueError (with the path) when unusable."""
    doc = read_json_file(path, "result file")
    try:
        validate_document(doc)
    except SchemaError as e:
        raise ValueError(f"{path}: not a flashcore bench result ({e})") from None
    return doc


# ---------------------------------------------------------------- comparison
def _median(result: Optional[dict]) -> Optional[float]:
    if result and result.get("status") == "ok" and result.get("timing"):
        return result["timing"]["median_us"]
    return None


def merge_runs(docs: list) -> dict:
    """Several runs of the same code as one document: each shape x backend's median time is the median of the
    runs' medians (``timing["run_medians_us"]`` keeps them), over the runs where it was timed. Single runs of
    this machine differ by a few percent even for unchanged peers (perf-notes v17), so comparing two versions
    is better done on several interleaved runs per side."""
    import copy
    import statistics

    if len(docs) == 1:
        return docs[0]
    merged = copy.deepcopy(docs[0])
    shas = {d["environment"].get("git_sha") for d in docs}
    merged["environment"]["git_sha"] = shas.pop() if len(shas) == 1 else "mixed"
    merged["complete"] = all(d.get("complete", True) for d in docs)
    by_key = [{e["key"]: e for e in d["results"]} for d in docs]
    for entry in merged["results"]:
        for name, res in entry["backends"].items():
            times = [m for m in (_median(runs.get(entry["key"], {}).get("backends", {}).get(name)) for runs in by_key)
                     if m is not None]
            if times:
                res["status"] = "ok"
                res["timing"] = dict(res.get("timing") or {}, median_us=statistics.median(times),
                                     run_medians_us=times, runs=len(times))
    return merged


def compare_documents(a: dict, b: dict) -> dict:
    """Per shape × backend change from run A to run B. ``ratio`` is B's median time / A's
    (< 1: B is faster). Shapes or backends present in only one run get a note instead."""
    a_entries = {e["key"]: e for e in a["results"]}
    b_entries = {e["key"]: e for e in b["results"]}
    keys = list(a_entries) + [k for k in b_entries if k not in a_entries]
    rows = []
    for key in keys:
        ea, eb = a_entries.get(key), b_entries.get(key)
        names = list((ea or {}).get("backends", {})) + [n for n in (eb or {}).get("backends", {})
                                                         if n not in (ea or {}).get("backends", {})]
        for name in names:
            rows.append(_compare_row(key, ea, eb, name))
    return {"a": _run_summary(a), "b": _run_summary(b), "rows": rows, "by_backend": _by_backend(rows),
            "warnings": _comparison_warnings(a, b)}


def _compare_row(key: str, ea: Optional[dict], eb: Optional[dict], name: str) -> dict:
    ra = (ea or {}).get("backends", {}).get(name)
    rb = (eb or {}).get("backends", {}).get(name)
    ma, mb = _median(ra), _median(rb)
    label = (ea or eb)["label"]
    if ea is None or eb is None:
        note = "shape only in B" if ea is None else "shape only in A"
    elif ra is None or rb is None:
        note = "backend only in B" if ra is None else "backend only in A"
    elif ma is None or mb is None:
        note = f"A {ra['status']}, B {rb['status']}"
    else:
        note = ""
    return {"key": key, "label": label, "backend": name, "a_us": ma, "b_us": mb,
            "ratio": (mb / ma) if (ma and mb) else None, "note": note,
            "a_status": ra["status"] if ra else None, "b_status": rb["status"] if rb else None}


def _by_backend(rows: list) -> dict:
    out = {}
    for row in rows:
        if row["ratio"] is not None:
            out.setdefault(row["backend"], []).append(row["ratio"])
    return {name: {"geomean_ratio": geomean(r), "shapes": len(r)} for name, r in out.items()}


def _run_summary(doc: dict) -> dict:
    env = doc["environment"]
    return {"gpu": (env.get("gpu") or {}).get("name"), "date": env.get("date"), "git_sha": env.get("git_sha"),
            "dtype": doc["config"].get("dtype"), "torch": env.get("versions", {}).get("torch")}


def _comparison_warnings(a: dict, b: dict) -> list:
    sa, sb = _run_summary(a), _run_summary(b)
    warnings = []
    for field in ("gpu", "dtype", "torch"):
        if sa[field] != sb[field]:
            warnings.append(f"{field} differs: A {sa[field]}, B {sb[field]}")
    for name, doc in (("A", a), ("B", b)):
        if not doc.get("complete", True):
            warnings.append(f"run {name} is incomplete (it was interrupted)")
    return warnings
