"""``flashcore bench --pass fwd|bwd|fwd+bwd``: the training benchmark (forward that saves for the backward, the
backward, both), flashcore against SDPA (cuDNN and its flash backend) and FlashAttention-4 in the same run.

Conventions (FlashAttention's, as in ANCHORS.md): backward time = (forward + backward) - forward, each the median
of ``triton.testing.do_bench`` (L2 flushed before every call); FLOPs: forward ``4 B Hq D x pairs`` (pairs: the
(query, key) pairs the mask keeps, so causal counts about half), backward 2.5x the forward, forward+backward 3.5x.

Sustained mode (``--sustained SECONDS``, 0 = off): an H100 at training load runs at its power cap (700 W): over
3 s windows of forward+backward steps its SM clock averaged 1.56-1.62 GHz against a 1.98 GHz maximum, differently
per backend (perf-notes v37). do_bench's 100 ms windows catch each backend wherever its clock is, and the derived
backward inherits that: in one run (v37) FA4's 1x32x16384x128 backward read 531 TF by do_bench and 602 TF at a
steady load. So after the do_bench timings every backend that passed is also timed in rounds, backends interleaved: each
window first warms the GPU with that backend's forward+backward for a third of ``SECONDS``, then times
forward+backward steps for ``SECONDS`` and the backward alone (one forward, then ``backward(retain_graph=True)``
with the gradients cleared every step, as FlashAttention's ``benchmark_backward``) for ``SECONDS``: CUDA events
around the whole window, divided by its steps; the median over rounds is reported (``*_sustained_us``). The host
must keep ahead of the GPU for this to be GPU time: true for the large shapes (~1.3 ms of host per step), not for
the smallest training shapes.

Correctness comes first: every backend's output and gradients on one GQA group (batch 0, key head 0 and its
query heads) are compared by relative error with an fp32 PyTorch computation of the same math (float64 is too
large at 16k); a backend over the tolerance is reported ``wrong`` and not timed.
"""
from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Callable, Optional

PASSES = ("fwd", "bwd", "fwd+bwd")
BWD_FLOP_FACTOR = 2.5
GRAD_TOLERANCE = 3e-2  # bf16 gradients of long rows: ~1e-2 is typical for every backend
BACKENDS = ("flashcore", "flashcore-deterministic", "sdpa-cudnn", "sdpa-flash", "fa4")


@dataclass(frozen=True)
class TrainCase:
    B: int
    Hq: int
    Hkv: int
    S: int
    D: int
    causal: bool

    @property
    def label(self) -> str:
        heads = f"{self.Hq}" if self.Hq == self.Hkv else f"{self.Hq}/{self.Hkv}"
        return f"{self.B}x{heads}x{self.S}x{self.D}{' causal' if self.causal else ''}"

    @property
    def pairs(self) -> int:
        return self.S * (self.S + 1) // 2 if self.causal else self.S * self.S

    @property
    def fwd_flops(self) -> float:
        return 4.0 * self.B * self.Hq * self.D * self.pairs


def _large() -> list:
    return [TrainCase(4, 32, 32, 4096, 128, False), TrainCase(4, 32, 32, 4096, 128, True),
            TrainCase(1, 32, 32, 16384, 128, False), TrainCase(1, 32, 32, 16384, 128, True),
            TrainCase(8, 16, 16, 2048, 64, False), TrainCase(4, 32, 32, 4096, 64, True)]


def _typical() -> list:
    """B x S = 16k tokens at S 2k-16k, 16-64 query heads over 8 k/v heads (GQA), D 64 and 128, causal."""
    return [TrainCase(8, 16, 8, 2048, 64, True), TrainCase(8, 32, 8, 2048, 128, True),
            TrainCase(4, 32, 8, 4096, 128, True), TrainCase(4, 64, 8, 4096, 64, True),
            TrainCase(2, 64, 8, 8192, 128, True), TrainCase(2, 16, 8, 8192, 64, True),
            TrainCase(1, 32, 8, 16384, 128, True)]


SUITES = {"train-large": _large, "train": _typical}


def training_suite(name: str) -> list:
    """The suite a ``--pass`` run uses: ``train``/``seed`` the training-typical set, ``train-large``/``large`` the
    issue's large shapes, ``all`` both."""
    alias = {"seed": "train", "large": "train-large"}
    if name == "all":
        return _large() + _typical()
    name = alias.get(name, name)
    if name not in SUITES:
        raise ValueError(f"--pass runs the training suites ({', '.join(SUITES)}, large, seed, all), got {name!r}")
    return SUITES[name]()


# ---------------------------------------------------------------------------------------------- backends
def _call(name: str, case: TrainCase) -> Optional[Callable]:
    """``f(q, k, v) -> out`` for a backend on [B, S, H, D] tensors; None where it is not installed."""
    import torch
    import torch.nn.functional as F

    import flashcore

    if name.startswith("flashcore"):
        det = name == "flashcore-deterministic"
        return lambda q, k, v: flashcore.attention(q, k, v, causal=case.causal, layout="bshd", deterministic=det)
    if name.startswith("sdpa-"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kind = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}[name]

        def sdpa(q, k, v):
            with sdpa_kernel(kind):
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=case.causal, enable_gqa=case.Hq != case.Hkv)
            return o.transpose(1, 2)
        return sdpa
    if name == "fa4":
        try:
            from flash_attn.cute import flash_attn_func
        except Exception:
            return None

        def fa4(q, k, v):
            o = flash_attn_func(q, k, v, causal=case.causal)
            return o[0] if isinstance(o, tuple) else o
        return fa4
    raise ValueError(f"unknown training backend {name!r} (known: {', '.join(BACKENDS)})")


def _inputs(case: TrainCase, dtype, seed: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h: torch.randn(case.B, case.S, h, case.D, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    q, k, v = mk(case.Hq), mk(case.Hkv), mk(case.Hkv)
    do = torch.randn(case.B, case.S, case.Hq, case.D, device="cuda", dtype=dtype, generator=g)
    return [t.requires_grad_(True) for t in (q, k, v)], do


def _reference_group(case: TrainCase, q, k, v, do):
    """fp32 output and gradients of batch 0, key head 0 and its query heads ([S, G, D] and [S, D])."""
    import torch

    G = case.Hq // case.Hkv
    qs, ks, vs = (t[0, :, :G if t is q else 1].detach().float().requires_grad_(True) for t in (q, k, v))
    dos = do[0, :, :G].float()
    scale = case.D ** -0.5
    outs = []
    for h in range(G):
        s = (qs[:, h] @ ks[:, 0].T) * scale
        if case.causal:
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(torch.softmax(s, -1) @ vs[:, 0])
    out = torch.stack(outs, 1)
    out.backward(dos)
    return out.detach(), qs.grad, ks.grad[:, 0], vs.grad[:, 0]


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _errors(case, fn, q, k, v, do, ref) -> dict:
    G = case.Hq // case.Hkv
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v)
    out.backward(do)
    got = (out[0, :, :G], q.grad[0, :, :G], k.grad[0, :, 0], v.grad[0, :, 0])
    errs = {n: _rel(a, b) for n, a, b in zip(("out", "dq", "dk", "dv"), got, ref)}
    for t in (q, k, v):
        t.grad = None
    return errs


def _median_us(fn, rep_ms: float) -> float:
    import triton.testing

    return 1000.0 * float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def time_backend(case, fn, q, k, v, do, passes, rep_ms: float) -> dict:
    """Median µs of the forward (inputs wanting gradients: the forward that saves) and of forward + backward."""
    import torch

    res = {}
    with torch.enable_grad():
        res["fwd_us"] = _median_us(lambda: fn(q, k, v), rep_ms)
        if passes != ("fwd",):
            def step():
                for t in (q, k, v):
                    t.grad = None
                fn(q, k, v).backward(do)
            res["fwdbwd_us"] = _median_us(step, rep_ms)
            res["bwd_us"] = res["fwdbwd_us"] - res["fwd_us"]
    f = case.fwd_flops
    res["fwd_tflops"] = f / res["fwd_us"] / 1e6
    if "bwd_us" in res:
        res["bwd_tflops"] = BWD_FLOP_FACTOR * f / res["bwd_us"] / 1e6
        res["fwdbwd_tflops"] = (1 + BWD_FLOP_FACTOR) * f / res["fwdbwd_us"] / 1e6
    return res


def _window_us(fn, seconds: float, est_us: float) -> tuple[float, int]:
    """(µs per call, calls) of ``fn`` called back to back for about ``seconds``, CUDA events around the window."""
    import torch

    n = max(5, int(seconds * 1e6 / max(est_us, 1.0)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return 1000.0 * start.elapsed_time(end) / n, n


def sustained_backend(fn, q, k, v, do, seconds: float, est_fwdbwd_us: float) -> dict:
    """One sustained window of a backend (module docstring): warm-up, forward+backward steps, then the backward
    alone; µs per step and the steps timed."""
    import torch

    def step():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(do)

    with torch.enable_grad():
        _window_us(step, seconds / 3, est_fwdbwd_us)  # warm-up: the GPU settles at this backend's load
        fwdbwd_us, n_fb = _window_us(step, seconds, est_fwdbwd_us)
        out = fn(q, k, v)

        def bwd():
            for t in (q, k, v):
                t.grad = None
            out.backward(do, retain_graph=True)

        bwd_us, n_b = _window_us(bwd, seconds, est_fwdbwd_us)
    for t in (q, k, v):
        t.grad = None
    return {"fwdbwd_sustained_us": fwdbwd_us, "bwd_sustained_us": bwd_us, "steps": [n_fb, n_b]}


def sustained_rounds(case, fns: dict, q, k, v, do, seconds: float, rounds: int, estimates: dict) -> dict:
    """Median over ``rounds`` interleaved windows per backend (``fns``: name -> call; ``estimates``: name ->
    forward+backward µs from do_bench, to size the windows)."""
    import statistics

    runs = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            runs[name].append(sustained_backend(fn, q, k, v, do, seconds, estimates[name]))
    out = {}
    f = case.fwd_flops
    for name, rs in runs.items():
        fb = statistics.median(r["fwdbwd_sustained_us"] for r in rs)
        b = statistics.median(r["bwd_sustained_us"] for r in rs)
        out[name] = {"fwdbwd_sustained_us": fb, "bwd_sustained_us": b,
                     "fwdbwd_sustained_tflops": (1 + BWD_FLOP_FACTOR) * f / fb / 1e6,
                     "bwd_sustained_tflops": BWD_FLOP_FACTOR * f / b / 1e6,
                     "sustained_rounds": [{key: (round(val, 1) if isinstance(val, float) else val)
                                           for key, val in r.items()} for r in rs]}
    return out


def _warm_gpu(seconds: float = 1.0) -> None:
    """Bring the clocks up before the first case (an idle GPU ran the first case at half speed, v19)."""
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def run_training(cases, names=BACKENDS, *, passes=("fwd", "bwd"), dtype_name="bf16", rep_ms=100.0,
                 tolerance=GRAD_TOLERANCE, console=None, seed: int = 0, sustained_s: float = 0.0,
                 sustained_rounds_n: int = 2) -> dict:
    """Check then time every backend on every case; returns the result document."""
    import torch

    from .results import collect_environment

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    doc = {"schema": "flashcore-bench-train/1", "environment": collect_environment(),
           "config": {"passes": list(passes), "dtype": dtype_name, "rep_ms": rep_ms, "tolerance": tolerance,
                      "backends": list(names), "bwd_flop_factor": BWD_FLOP_FACTOR,
                      "timing": "triton.testing.do_bench median, L2 flushed per call; bwd = (fwd+bwd) - fwd",
                      "check": "rel. error vs fp32 PyTorch math on batch 0, key head 0 and its query heads",
                      "sustained_s": sustained_s, "sustained_rounds": sustained_rounds_n if sustained_s else 0},
           "results": []}
    _warm_gpu()
    for i, case in enumerate(cases):
        (q, k, v), do = _inputs(case, dtype, seed + i)
        ref = _reference_group(case, q, k, v, do)
        entry = {"case": asdict(case), "label": case.label, "backends": {}}
        for name in names:
            fn = _call(name, case)
            if fn is None:
                entry["backends"][name] = {"status": "unavailable"}
                continue
            try:
                errs = _errors(case, fn, q, k, v, do, ref)
                if not all(e <= tolerance for e in errs.values()):
                    entry["backends"][name] = {"status": "wrong", "rel_err": errs}
                    continue
                r = time_backend(case, fn, q, k, v, do, tuple(passes), rep_ms)
                entry["backends"][name] = {"status": "ok", "rel_err": errs, **r}
            except Exception as e:  # an unsupported shape on a peer is a result, not a crash
                entry["backends"][name] = {"status": "error", "reason": f"{type(e).__name__}: {str(e)[:300]}",
                                           "traceback": traceback.format_exc()[-2000:] if name.startswith(
                                               "flashcore") else None}
            torch.cuda.empty_cache()
        if sustained_s and passes != ("fwd",):
            ok = {n: _call(n, case) for n, r in entry["backends"].items() if r.get("status") == "ok"}
            est = {n: entry["backends"][n]["fwdbwd_us"] for n in ok}
            for n, r in sustained_rounds(case, ok, q, k, v, do, sustained_s, sustained_rounds_n, est).items():
                entry["backends"][n].update(r)
        doc["results"].append(entry)
        if console is not None:
            console.print(_line(entry), markup=False, highlight=False)
        del q, k, v, do, ref
        torch.cuda.empty_cache()
    return doc


def _line(entry) -> str:
    parts = []
    for n, r in entry["backends"].items():
        if r.get("status") == "ok":
            bwd = f" bwd {r['bwd_tflops']:.0f}TF" if "bwd_tflops" in r else ""
            parts.append(f"{n}: fwd {r['fwd_tflops']:.0f}TF{bwd}")
        else:
            parts.append(f"{n}: {r.get('status')}")
    return f"{entry['label']}: " + "; ".join(parts)


def best_peer(entry, field: str):
    peers = [(r[field], n) for n, r in entry["backends"].items()
             if not n.startswith("flashcore") and r.get("status") == "ok" and field in r]
    return max(peers) if peers else None


def results_table(doc):
    """A rich table: per case and pass, TFLOP/s of each backend and flashcore / fastest peer."""
    from rich.table import Table

    passes = doc["config"]["passes"]
    fields = [("fwd_tflops", "fwd")] + ([("bwd_tflops", "bwd"), ("fwdbwd_tflops", "fwd+bwd")]
                                        if passes != ["fwd"] else [])
    if doc["config"].get("sustained_s"):
        fields += [("bwd_sustained_tflops", "bwd, sustained"), ("fwdbwd_sustained_tflops", "fwd+bwd, sustained")]
    names = doc["config"]["backends"]
    t = Table(title=f"training passes, TFLOP/s (bwd = {BWD_FLOP_FACTOR}x fwd FLOPs)")
    t.add_column("shape")
    t.add_column("pass")
    for n in names:
        t.add_column(n, justify="right")
    t.add_column("flashcore / best peer", justify="right")
    for e in doc["results"]:
        for field, label in fields:
            cells = []
            for n in names:
                r = e["backends"].get(n, {})
                cells.append(f"{r[field]:.0f}" if r.get("status") == "ok" and field in r else r.get("status", "-"))
            fc = e["backends"].get("flashcore", {})
            peer = best_peer(e, field)
            ratio = f"{fc[field] / peer[0]:.2f}x {peer[1]}" if peer and fc.get("status") == "ok" else "-"
            t.add_row(e["label"], label, *cells, ratio)
    return t


def result_path(doc, out_dir: str) -> str:
    from .results import result_filename

    name = result_filename(doc).replace("bench-", "bench-train-", 1)
    return os.path.join(out_dir, name)


def save(doc, out_dir: str) -> str:
    path = result_path(doc, out_dir)
    os.makedirs(out_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    return path


def run_cli(args, console) -> int:
    """``flashcore bench --pass ...`` (the CLI parsed ``--suite``, ``--backends``, ``--dtype``, ``--rep-ms``)."""
    import torch

    passes = ("fwd",) if args.bench_pass == "fwd" else ("fwd", "bwd")
    try:
        cases = training_suite(args.suite)
        names = tuple(args.backends or BACKENDS)
        for n in names:
            if n not in BACKENDS:
                raise ValueError(f"unknown backend {n!r} for --pass (known: {', '.join(BACKENDS)})")
    except ValueError as e:
        console.print(f"flashcore bench: error: {e}", markup=False)
        return 2
    if not torch.cuda.is_available():
        console.print("flashcore bench --pass needs a CUDA GPU", markup=False)
        return 2
    t0 = time.time()
    doc = run_training(cases, names, passes=passes, dtype_name=args.dtype,
                       rep_ms=100.0 if args.rep_ms is None else args.rep_ms, console=console,
                       sustained_s=getattr(args, "sustained", 0.0) or 0.0)
    doc["elapsed_s"] = round(time.time() - t0, 1)
    doc["config"]["pass"] = args.bench_pass
    path = save(doc, args.out)
    console.print(results_table(doc))
    console.print(f"results: {path}", markup=False, highlight=False)
    bad = [(e["label"], n, r["status"]) for e in doc["results"] for n, r in e["backends"].items()
           if n.startswith("flashcore") and r["status"] != "ok"]
    for label, n, status in bad:
        console.print(f"{n} is {status} on {label}", markup=False)
    return 1 if bad else 0


def deterministic_table(doc, field: str = "bwd_sustained_tflops") -> str:
    """The README's table of ``deterministic=True`` beside the default from a committed run with both: TFLOP/s each
    and the deterministic backward's speed as a fraction of the default's (issue 23's bar: >= 0.85)."""
    head = "| shape (B x Hq[/Hkv] x S x D) | flashcore | flashcore-deterministic | deterministic / default |"
    rows = [head, "|---|---|---|---|"]
    for e in doc["results"]:
        fc, det = (e["backends"].get(n, {}) for n in ("flashcore", "flashcore-deterministic"))
        ok = fc.get("status") == det.get("status") == "ok" and field in fc and field in det
        cells = [f"{fc[field]:.0f}", f"{det[field]:.0f}", f"{det[field] / fc[field]:.2f}x"] if ok else ["-"] * 3
        rows.append(f"| {e['label']} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def markdown_table(doc, field: str = "bwd_tflops") -> str:
    """The README's backward table from a committed run: TFLOP/s per backend and flashcore / fastest peer."""
    names = [n for n in doc["config"]["backends"]]
    head = "| shape (B x Hq[/Hkv] x S x D) | " + " | ".join(names) + " | flashcore / fastest peer |"
    rows = [head, "|" + "---|" * (len(names) + 2)]
    for e in doc["results"]:
        cells = []
        for n in names:
            r = e["backends"].get(n, {})
            cells.append(f"{r[field]:.0f}" if r.get("status") == "ok" and field in r else r.get("status", "-"))
        fc, peer = e["backends"].get("flashcore", {}), best_peer(e, field)
        ratio = f"{fc[field] / peer[0]:.2f}x ({peer[1]})" if peer and fc.get("status") == "ok" else "-"
        rows.append(f"| {e['label']} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(rows)
