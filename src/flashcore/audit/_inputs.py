"""Input classes and shared helpers for the GPU audit gates (counters, repro, timing).

Every input class has the same PUBLIC shape (B, H, Hkv, S_max, D), dtype and causal flag; the
classes differ only in what is secret: the values of q/k/v and the true lengths. The builders
are deterministic (CPU ``torch.Generator`` seeded from ``seed``, then moved to ``device``), so a
child process or a second run rebuilds bit-identical inputs.

The helpers at the end (``cuda_or_message``, ``gpu_state``, ``write_json``, ``child_env``) are
shared by the gate modules; they import nothing heavier than torch.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

Tensor = torch.Tensor

# Order matters only for reports; "random" first so it is the reference class in tables.
CLASSES = (
    "random",       # N(0,1) values, per-batch random true lengths in [1, S]
    "zeros",        # all zeros (padding too), full length
    "huge",         # +-big finite values (fp16 +-6e4, bf16/fp32 +-1e30), full length
    "subnormal",    # every value a subnormal of the dtype (or zero), full length
    "nan_pad",      # valid region = len_half's, length S/2, NaN in all padding of q, k, v
    "inf_pad",      # valid region = len_half's, length S/2, +-Inf in all padding of q, k, v
    "len1",         # true length 1, N(0,1) everywhere
    "len_half",     # true length S/2, N(0,1) everywhere
    "len_full",     # true length S, N(0,1) everywhere (own seed)
    "masked_rows",  # seqlens_q[0] = 0 (every query row of batch 0 masked), others S/2; keys S/2
    "empty_keys",   # seqlens_k[0] = 0 (rows of batch 0 see no key), queries S/2
)
# Classes whose query lengths differ from their key lengths: they need an explicit seqlens_q.
CROSS_ONLY = ("masked_rows", "empty_keys")
# Classes that share the valid region of len_half (so their outputs must be bit-identical).
PADDING_FAMILY = ("len_half", "nan_pad", "inf_pad")

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


def huge_value(dtype: torch.dtype) -> float:
    """A large value that is finite in ``dtype`` (scores built from it may overflow fp32: a stress)."""
    return 6.0e4 if dtype == torch.float16 else 1.0e30


def subnormal_quantum(dtype: torch.dtype) -> tuple[float, int]:
    """(smallest positive subnormal, how many multiples of it stay subnormal) for ``dtype``."""
    if dtype == torch.float16:
        return 2.0 ** -24, 2 ** 10 - 1
    if dtype == torch.bfloat16:
        return 2.0 ** -133, 2 ** 7 - 1
    return 2.0 ** -149, 2 ** 23 - 1


@dataclass
class Case:
    """One input class, padded to the public S_max, plus its host-side description.

    ``lens_q``/``lens_k`` are host copies for the HARNESS only (to pack the varlen contrast and to
    check properties); the kernels under audit only ever see ``seqlens_q``/``seqlens_k``.
    """

    name: str
    q: Tensor
    k: Tensor
    v: Tensor
    seqlens_q: Tensor
    seqlens_k: Tensor
    lens_q: list
    lens_k: list
    desc: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def same_lengths(self) -> bool:
        return self.lens_q == self.lens_k


def _randn(g: torch.Generator, shape) -> Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float32)


def _class_seed(seed: int, name: str) -> int:
    # Stable across processes (no Python hash randomisation).
    tag = "len_half" if name in PADDING_FAMILY else name
    return (int(seed) * 1_000_003 + int(hashlib.sha256(tag.encode()).hexdigest()[:8], 16)) % (2 ** 63)


def _fill_padding(t: Tensor, lens: list, value: float) -> None:
    """t: [B, H, S, D] float32 (CPU); overwrite rows >= lens[b] of every head with ``value``."""
    for b, n in enumerate(lens):
        t[b, :, n:, :] = value


def _fill_padding_alternating(t: Tensor, lens: list, value: float) -> None:
    """Padding rows get +value / -value alternating along the row (e.g. +-Inf)."""
    D = t.shape[-1]
    sign = torch.where(torch.arange(D) % 2 == 0, torch.tensor(1.0), torch.tensor(-1.0))
    for b, n in enumerate(lens):
        t[b, :, n:, :] = sign * value


def build_case(name: str, *, B: int, H: int, Hkv: Optional[int] = None, S: int, D: int,
               dtype: torch.dtype = torch.bfloat16, device="cpu", seed: int = 0) -> Case:
    """Build input class ``name`` (see CLASSES) deterministically from ``seed``."""
    if name not in CLASSES:
        raise ValueError(f"unknown input class {name!r}; known: {', '.join(CLASSES)}")
    Hkv = H if Hkv is None else Hkv
    if S < 2:
        raise ValueError("S_max must be >= 2 so that S/2 >= 1")
    g = torch.Generator().manual_seed(_class_seed(seed, name))
    qs, ks = (B, H, S, D), (B, Hkv, S, D)
    half = S // 2
    q, k, v = _randn(g, qs), _randn(g, ks), _randn(g, ks)
    lens_q = lens_k = [S] * B
    desc = ""
    if name == "random":
        lens_q = lens_k = [int(x) for x in torch.randint(1, S + 1, (B,), generator=g)]
        desc = "N(0,1) values, random true lengths in [1, S_max]"
    elif name == "zeros":
        q.zero_(); k.zero_(); v.zero_()
        desc = "all zeros, full length"
    elif name == "huge":
        big = huge_value(dtype)
        for t in (q, k, v):
            mag = torch.rand(t.shape, generator=g) * 0.5 + 0.5
            sgn = torch.where(torch.rand(t.shape, generator=g) < 0.5, -1.0, 1.0)
            t.copy_(sgn * mag * big)
        desc = f"+-[0.5,1]*{big:g} (finite in {dtype}), full length"
    elif name == "subnormal":
        quantum, kmax = subnormal_quantum(dtype)
        tq = []
        for t in (q, k, v):
            ints = torch.randint(-kmax, kmax + 1, t.shape, generator=g, dtype=torch.int64)
            tq.append((ints.to(torch.float64) * quantum))
        q64, k64, v64 = tq
        desc = f"subnormal multiples of {quantum:g}, full length"
        lens_q = lens_k = [S] * B
        return _finish(name, q64, k64, v64, lens_q, lens_k, dtype, device, desc)
    elif name in ("nan_pad", "inf_pad", "len_half"):
        lens_q = lens_k = [half] * B
        if name == "nan_pad":
            for t in (q, k, v):
                _fill_padding(t, lens_k, float("nan"))
            desc = "len_half's valid region, NaN in the padding of q, k, v"
        elif name == "inf_pad":
            for t in (q, k, v):
                _fill_padding_alternating(t, lens_k, float("inf"))
            desc = "len_half's valid region, +-Inf in the padding of q, k, v"
        else:
            desc = "N(0,1), true length S_max/2, N(0,1) padding"
    elif name == "len1":
        lens_q = lens_k = [1] * B
        desc = "N(0,1), true length 1"
    elif name == "len_full":
        lens_q = lens_k = [S] * B
        desc = "N(0,1), true length S_max"
    elif name == "masked_rows":
        lens_q = [0] + [half] * (B - 1)
        lens_k = [half] * B
        desc = "seqlens_q[0] = 0 (all query rows of batch 0 masked), others S_max/2; keys S_max/2"
    elif name == "empty_keys":
        lens_q = [half] * B
        lens_k = [0] + [half] * (B - 1)
        desc = "seqlens_k[0] = 0 (batch 0's rows see no key), queries S_max/2"
    return _finish(name, q, k, v, list(lens_q), list(lens_k), dtype, device, desc)


def _finish(name, q, k, v, lens_q, lens_k, dtype, device, desc) -> Case:
    dev = torch.device(device)
    q, k, v = (t.to(dtype).to(dev).contiguous() for t in (q, k, v))
    sq = torch.tensor(lens_q, dtype=torch.int32, device=dev)
    sk = torch.tensor(lens_k, dtype=torch.int32, device=dev)
    return Case(name, q, k, v, sq, sk, list(lens_q), list(lens_k), desc)


def build_cases(names, **kw) -> list:
    return [build_case(n, **kw) for n in names]


def pack_varlen(case: Case):
    """Pack a padded case into attention_varlen's layout (the fast kernel's view of the same data).

    Returns (q [tq, H, D], k [tk, Hkv, D], v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k).
    max_seqlen_* are the largest true lengths (at least 1): what a normal caller of the fast path passes.
    """
    def pack(t: Tensor, lens: list) -> Tensor:
        parts = [t[b, :, :n, :].transpose(0, 1) for b, n in enumerate(lens)]
        return torch.cat(parts, 0).contiguous()

    def cu(lens: list) -> Tensor:
        c = [0]
        for n in lens:
            c.append(c[-1] + int(n))
        return torch.tensor(c, dtype=torch.int32, device=case.q.device)

    qp, kp, vp = pack(case.q, case.lens_q), pack(case.k, case.lens_k), pack(case.v, case.lens_k)
    return qp, kp, vp, cu(case.lens_q), cu(case.lens_k), max(1, max(case.lens_q)), max(1, max(case.lens_k))


# ----------------------------------------------------------------------------------------------
# Kernel calls (the thing under audit), shared by the gates.

KERNELS = ("secure", "secure_decode", "secure_prefill", "fast_varlen", "fast_dense")
# The secure kernels among them: dense attention, the KV-cache decode step, and KV-cache chunked prefill
SECURE_KINDS = ("secure", "secure_decode", "secure_prefill")
# the KV-cache calls among them: their padding is the cache past the lengths, and they take a page size
KV_KINDS = ("secure_decode", "secure_prefill")
# secure_prefill's queries per sequence: enough for the Gluon kernel's route at D 64 and 128 (plan.prefill), one
# 128-row work item per query head
PREFILL_QUERIES = 128


def paged_cache(t: Tensor, page_size: int, seed: int = 12345) -> tuple:
    """A contiguous cache ``[B, S, Hkv, D]`` as pages ``[B * S / page_size, page_size, Hkv, D]`` in a public
    pseudo-random order, and its page table ``[B, S / page_size]`` (int32, on t's device)."""
    B, S = t.shape[:2]
    if S % page_size:
        raise ValueError(f"S_max={S} must be a multiple of the page size {page_size}")
    n = S // page_size
    perm = torch.randperm(B * n, generator=torch.Generator().manual_seed(seed)).to(t.device)
    src = t.view(torch.uint8) if t.element_size() == 1 else t  # (index_put has no float8 kernel)
    pages = torch.empty((B * n, page_size, *t.shape[2:]), dtype=src.dtype, device=t.device)
    pages[perm] = src.reshape(B * n, page_size, *t.shape[2:])
    return pages.view(t.dtype), perm.view(B, n).to(torch.int32)


# KV-cache caches' element types the gates can audit: "same" as q, or "fp8" (float8_e4m3fn with per-(sequence, K/V
# head) descales, the FP8 cache's own kernels: uint16 pairs widened in the loop, issue 22)
KV_DTYPES = ("same", "fp8")
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def check_kv_dtype(kind: str, kv_dtype: str) -> None:
    """``kv_dtype`` is one of KV_DTYPES, and other than "same" only for the KV-cache kernels (KV_KINDS)."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
    if kv_dtype != "same" and kind not in KV_KINDS:
        raise ValueError(f"kv_dtype {kv_dtype!r} is for the KV-cache kernels {KV_KINDS}, not {kind!r}")


def fp8_cache(t: Tensor, lens: list) -> tuple:
    """A cache ``[B, S, Hkv, D]`` as float8_e4m3fn and its fp32 descales ``[B, Hkv]``: each (sequence, K/V head)
    scaled by the largest magnitude of its first ``lens[b]`` rows (its true length), so the padding, whatever it
    holds (NaN, Inf), changes no descale, and the padding family's classes get the same descales and valid bytes.
    A sequence with no valid row gets descale 1."""
    B, _, Hkv, _ = t.shape
    x = t.float()
    descale = torch.ones(B, Hkv, dtype=torch.float32, device=t.device)
    for b, n in enumerate(lens):
        if n > 0:
            m = x[b, :n].abs().amax(dim=(0, 2))
            descale[b] = torch.where(m > 0, m / FP8_MAX, torch.ones_like(m))
    return (x / descale[:, None, :, None]).to(torch.float8_e4m3fn), descale.contiguous()


def prefill_queries(q: Tensor, n: int = PREFILL_QUERIES) -> Tensor:
    """``[B, H, n, D]`` chunked-prefill queries from a case's ``q``: its row 0 (valid in every class), the D values
    rotated by each row's index. Every query is a real one (the secret in a KV-cache call is the cache's length, not
    the queries'), and the padding family's classes, which share their valid rows, get the same chunk."""
    D = q.shape[-1]
    idx = (torch.arange(D, device=q.device)[None, :] + torch.arange(n, device=q.device)[:, None]) % D
    return q[:, :, 0, :][:, :, idx]


def make_call(kind: str, case: Case, *, causal: bool, lens_mode: str = "cross", backend: str = "auto",
              page_size: int = 0, kv_dtype: str = "same"):
    """Return a zero-argument callable running kernel ``kind`` on ``case`` (inputs bound now).

    secure: ``attention(..., secure=True)``; lens_mode "self" passes seqlens_q=None (query lengths
    = key lengths, the self-attention form), "cross" passes an explicit seqlens_q tensor.
    fast_varlen: ``attention_varlen`` on the packed true lengths (loop bounds depend on them).
    fast_dense: ``attention(..., secure=False)`` over the padded tensors (no lengths at all).
    secure_decode: ``attention_with_kvcache(..., secure=True)``: one query token per sequence (q's row 0, valid in
    every class) against contiguous caches ``[B, S_max, Hkv, D]`` holding k and v, ``cache_seqlens`` = the key
    lengths (secret); the class's padding is the cache past them. ``page_size`` > 0: the caches as pages in a
    public shuffled order with their page table (:func:`paged_cache`). ``kv_dtype`` "fp8": the caches as float8_e4m3fn
    with descales from their valid rows (:func:`fp8_cache`).
    secure_prefill: the same call with ``PREFILL_QUERIES`` query tokens per sequence (:func:`prefill_queries`:
    chunked prefill, the Gluon kernel's secure form on Hopper; causal bottom-right against each secret key length).
    """
    import flashcore

    check_kv_dtype(kind, kv_dtype)
    if kind == "secure":
        if lens_mode == "self":
            if not case.same_lengths:
                raise ValueError(f"class {case.name} has different query/key lengths: needs lens_mode='cross'")
            sq = None
        else:
            sq = case.seqlens_q.clone()  # a distinct tensor even when the values are equal
        q, k, v, sk = case.q, case.k, case.v, case.seqlens_k

        def call():
            return flashcore.attention(q, k, v, causal=causal, seqlens_q=sq, seqlens_k=sk, secure=True, backend=backend)
        return call
    if kind in KV_KINDS:
        qd = (case.q[:, :, :1, :] if kind == "secure_decode" else prefill_queries(case.q)).transpose(1, 2).contiguous()
        kc, vc = (t.transpose(1, 2).contiguous() for t in (case.k, case.v))
        sk, table, kd, vd = case.seqlens_k, None, None, None
        if kv_dtype == "fp8":
            (kc, kd), (vc, vd) = fp8_cache(kc, case.lens_k), fp8_cache(vc, case.lens_k)
        if page_size:
            (kc, table), (vc, _) = paged_cache(kc, page_size), paged_cache(vc, page_size)

        def call():
            return flashcore.attention_with_kvcache(qd, kc, vc, cache_seqlens=sk, page_table=table, causal=causal,
                                                    k_descale=kd, v_descale=vd, secure=True, backend=backend)
        return call
    if kind == "fast_varlen":
        qp, kp, vp, cq, ck, mq, mk = pack_varlen(case)

        def call():
            return flashcore.attention_varlen(qp, kp, vp, cq, ck, mq, mk, causal=causal, backend=backend)
        return call
    if kind == "fast_dense":
        q, k, v = case.q, case.k, case.v

        def call():
            return flashcore.attention(q, k, v, causal=causal, secure=False, backend=backend)
        return call
    raise ValueError(f"unknown kernel kind {kind!r}; known: {KERNELS}")


def tensor_bytes_hash(t: Tensor) -> str:
    """sha256 of a tensor's raw bytes (any dtype, bf16 included: hashed through a uint8 view)."""
    t = t.detach().contiguous()
    if t.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    raw = t.reshape(-1).view(torch.uint8)
    return hashlib.sha256(raw.cpu().numpy().tobytes()).hexdigest()


# ----------------------------------------------------------------------------------------------
# Shared helpers.

def cuda_or_message(gate: str) -> bool:
    """True when a CUDA device is usable; otherwise print why the gate cannot run (caller exits 2)."""
    ok = False
    try:
        ok = bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # pragma: no cover - broken driver installs
        ok = False
    if not ok:
        print(f"flashcore audit {gate}: needs a CUDA GPU, and torch.cuda.is_available() is False on this machine "
              f"(torch {torch.__version__}); nothing was run. Run it on an H100 machine.", file=sys.stderr)
    return ok


def publish(a, gate: str, report: dict, print_table) -> Path:
    """Every GPU gate's ending: write ``<out>/<gate>.json``, print the JSON (``--json``) or the
    table, then one status line naming the report."""
    path = write_json(Path(a.out) / f"{gate}.json", report)
    if getattr(a, "json", False):
        print(json.dumps(report, default=str))
    else:
        print_table(report)
    print(f"[{gate}] {report['status']}: report {path}")
    return path


def write_json(path, obj) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=_json_default, allow_nan=True)
        f.write("\n")
    os.replace(tmp, path)
    return path


def _json_default(o):
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, torch.dtype):
        return str(o)
    try:
        import numpy as np
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    return repr(o)


def child_env() -> dict:
    """Environment for child processes: makes this flashcore importable (src layout, no install)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if src not in parts:
        parts.insert(0, src)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class _Nvml:
    def __init__(self):
        self.h = None
        try:
            import pynvml  # nvidia-ml-py
            pynvml.nvmlInit()
            idx = torch.cuda.current_device() if torch.cuda.is_available() else 0
            self.h = pynvml.nvmlDeviceGetHandleByIndex(idx)
            self.nv = pynvml
        except Exception:
            self.h = None

    def sample(self) -> dict:
        if self.h is None:
            return {}
        nv, h = self.nv, self.h
        out = {}
        for key, fn in (
            ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            ("mem_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("temp_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            ("energy_mj", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
            ("clock_event_reasons", lambda: int(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons",
                                                        getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None))(h))),
        ):
            try:
                out[key] = fn()
            except Exception:
                pass
        return out


_NVML = None


def nvml() -> _Nvml:
    global _NVML
    if _NVML is None:
        _NVML = _Nvml()
    return _NVML


def gpu_state() -> dict:
    """Clocks, power, temperature now (pynvml; falls back to nvidia-smi), plus a timestamp."""
    s = nvml().sample()
    if not s:
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
            vals = [x.strip() for x in r.stdout.strip().splitlines()[0].split(",")]
            s = {"sm_clock_mhz": float(vals[0]), "mem_clock_mhz": float(vals[1]),
                 "power_w": float(vals[2]), "temp_c": float(vals[3]), "source": "nvidia-smi"}
        except Exception as e:  # no GPU tools at all
            s = {"error": f"no pynvml / nvidia-smi: {e}"}
    else:
        s["source"] = "pynvml"
    s["time"] = time.time()
    return s


def environment() -> dict:
    """Versions and device facts recorded in every report."""
    info = {"python": sys.version.split()[0], "torch": torch.__version__}
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    try:
        import flashcore
        info["flashcore"] = getattr(flashcore, "__version__", None)
        from flashcore.plan import knobs
        info["secure_v_zeroing"] = os.environ.get(knobs.SECURE_V_ZEROING_ENV, "auto")
    except Exception:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(device=p.name, sm_count=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                    cuda=torch.version.cuda)
    return info


def add_shape_arguments(p: argparse.ArgumentParser, *, batch: int, heads: int, seqlen: int, head_dim: int) -> None:
    """The public shape a GPU gate runs at; each gate passes its own defaults."""
    p.add_argument("--batch", "-B", type=int, default=batch)
    p.add_argument("--heads", "-H", type=int, default=heads)
    p.add_argument("--kv-heads", type=int, default=0, help="k/v heads (GQA); 0: same as --heads")
    p.add_argument("--seqlen", "-S", type=int, default=seqlen, help="public padded length S_max")
    p.add_argument("--head-dim", "-D", type=int, default=head_dim)
    p.add_argument("--dtype", default="bf16")


def module_main(prog: str, add_arguments, run, child_main=None) -> int:
    """``python -m flashcore.audit.<gate>``: the gate on its own, or its ``--child`` worker."""
    if child_main is not None and "--child" in sys.argv[1:]:
        return child_main(sys.argv[1:])
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--out", default="flashcore-audit")
    p.add_argument("--json", action="store_true")
    add_arguments(p)
    return run(p.parse_args())
