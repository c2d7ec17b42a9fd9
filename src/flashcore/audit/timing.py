"""Gate: dudect-style timing tests of the secure kernel (GPU time per call, CUDA events).

Class pairs (all at one public shape; see ``class_specs``):

* ``fixed_vs_random``: a fixed input (the same values in every pool slot, at distinct addresses so the
  caches treat both classes alike) versus fresh random inputs, same true lengths (3/4 S_max).
* ``short_vs_long``: true length 1 versus S_max, random values.
* ``pad_zeros_vs_random``: true length S_max/2, padding all zeros versus random non-zero padding.
* ``values_zeros_vs_random``: all-zero versus random values at full length. This one probes data-
  dependent power/clock effects (out of scope of the threat model, measured anyway): it is reported but
  does not fail the gate unless ``--strict-power``.

Method: for each class a pool of ``--pool`` input sets is built on the GPU before timing (random pools
are refilled in place between batches, outside the timed regions), and each slot's call is captured as a
CUDA graph (falls back to eager calls when capture fails), so the host enqueues a call in ~15 µs and the
GPU, given a short head start (``torch.cuda._sleep``), runs the calls back to back: the events then time
the kernel, not the host. Measurements are taken in pairs, A then B or B then A in a pre-drawn random
order, with pre-drawn random pool slots; events are recorded for ``--batch`` pairs, then the host
synchronises once and reads every elapsed time. Statistics (flashcore.audit.stats): dudect's Welch t
(uncropped, 100 percentile crops, second order) on the two classes, and a paired t-test on the per-pair
differences (order-randomised, so drift cancels). |t| > 4.5 means a difference was detected; the report
gives the mean difference in ns with a 95% confidence interval and the smallest difference the sample
could have detected. The fast kernel (attention_varlen, whose loop bounds follow the true lengths) runs
``short_vs_long`` and ``fixed_vs_random`` for contrast: short_vs_long should show a huge |t| there.
GPU clocks, power and temperature (pynvml, else nvidia-smi) are sampled at the start, per batch and at
the end. Exit code: 0 no difference detected on the secure kernel, 1 one detected, 2 could not run.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import _inputs as I
from . import stats as S

SECURE_TESTS = ("fixed_vs_random", "short_vs_long", "pad_zeros_vs_random", "values_zeros_vs_random")
POWER_TESTS = ("values_zeros_vs_random",)
CONTRAST_TESTS = ("short_vs_long", "fixed_vs_random")


@dataclass(frozen=True)
class ClassSpec:
    name: str
    values: str          # "random" (refilled each batch) | "fixed" | "zeros"
    length: int          # true length of every sequence
    pad: str = "values"  # secure only: "values" (padding drawn like the values) | "zeros"


def class_specs(test: str, S_max: int) -> tuple:
    mid = (3 * S_max) // 4
    half = S_max // 2
    if test == "fixed_vs_random":
        return ClassSpec("fixed", "fixed", mid), ClassSpec("random", "random", mid)
    if test == "short_vs_long":
        return ClassSpec("short", "random", 1), ClassSpec("long", "random", S_max)
    if test == "pad_zeros_vs_random":
        return ClassSpec("pad_zeros", "random", half, "zeros"), ClassSpec("pad_random", "random", half, "values")
    if test == "values_zeros_vs_random":
        return ClassSpec("zeros", "zeros", S_max), ClassSpec("random", "random", S_max)
    raise ValueError(f"unknown timing test {test!r}")


class Pool:
    """``P`` input sets of one class, each with a callable that runs the kernel on it."""

    def __init__(self, kernel: str, spec: ClassSpec, *, B, H, Hkv, S_max, D, dtype, causal, P, backend, seed):
        import torch
        import flashcore

        self.kernel, self.spec, self.P = kernel, spec, P
        self.mode = "eager"
        dev = torch.device("cuda")
        L = spec.length
        self.tensors = []
        self.runs = []
        self._graphs = []
        if kernel == "secure":
            qs, ks = (B, H, S_max, D), (B, Hkv, S_max, D)
        elif kernel == "fast_varlen":
            qs, ks = (B * L, H, D), (B * L, Hkv, D)
            cu = torch.arange(0, B + 1, dtype=torch.int32, device=dev) * L
        else:
            raise ValueError(f"timing supports kernels secure and fast_varlen, not {kernel!r}")
        g = torch.Generator(device=dev)
        g.manual_seed(seed)
        fixed = None
        if spec.values == "fixed":
            fixed = [torch.randn(s, generator=g, device=dev, dtype=torch.float32).to(dtype) for s in (qs, ks, ks)]
        for _ in range(P):
            q, k, v = (torch.empty(s, device=dev, dtype=dtype) for s in (qs, ks, ks))
            if fixed is not None:
                for t, f in zip((q, k, v), fixed):
                    t.copy_(f)
            elif spec.values == "zeros":
                for t in (q, k, v):
                    t.zero_()
            else:
                for t in (q, k, v):
                    t.normal_(generator=g)
            self._apply_pad(q, k, v)
            self.tensors.append((q, k, v))
            if kernel == "secure":
                sk = torch.full((B,), L, dtype=torch.int32, device=dev)

                def fn(q=q, k=k, v=v, sk=sk):
                    return flashcore.attention(q, k, v, causal=causal, seqlens_k=sk, secure=True, backend=backend)
            else:
                def fn(q=q, k=k, v=v):
                    return flashcore.attention_varlen(q, k, v, cu, cu, L, L, causal=causal, backend=backend)
            self.runs.append(fn)
        self._eager = list(self.runs)

    def _apply_pad(self, q, k, v):
        if self.kernel == "secure" and self.spec.pad == "zeros":
            L = self.spec.length
            for t in (q, k, v):
                t[:, :, L:, :] = 0

    def refresh(self, gen) -> None:
        """New random values, in place (addresses, hence captured graphs, stay valid). Not timed."""
        if self.spec.values != "random":
            return
        for q, k, v in self.tensors:
            for t in (q, k, v):
                t.normal_(generator=gen)
            self._apply_pad(q, k, v)

    def capture(self) -> str:
        """Capture each slot's call as a CUDA graph; on any failure keep eager calls. Returns the mode."""
        import torch

        self.runs[0]()  # compile / warm up outside capture
        torch.cuda.synchronize()
        graphs = []
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for fn in self._eager[:2]:
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            for fn in self._eager:
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr):
                    out = fn()
                graphs.append((gr, out))
            torch.cuda.synchronize()
        except Exception as e:  # capture unsupported: time eager calls (host latency may show up)
            self.capture_error = f"{type(e).__name__}: {e}"
            self.runs = list(self._eager)
            self.mode = "eager"
            return self.mode
        self._graphs = graphs
        self.runs = [gr.replay for gr, _ in graphs]
        self.mode = "graph"
        return self.mode


def _measure(pa: Pool, pb: Pool, n_pairs: int, batch: int, rng: np.random.Generator, gen, *,
             head_start_cycles: int, sample_clocks: bool = True) -> dict:
    import torch

    order = rng.integers(0, 2, n_pairs).astype(bool)  # True: A first
    ia = rng.integers(0, pa.P, n_pairs).tolist()
    ib = rng.integers(0, pb.P, n_pairs).tolist()
    first_a = order.tolist()
    ta = np.empty(n_pairs, dtype=np.float64)
    tb = np.empty(n_pairs, dtype=np.float64)
    gaps = []
    clocks = []
    nb_max = min(batch, n_pairs)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4 * nb_max)]
    ra, rb = pa.runs, pb.runs
    for s in range(0, n_pairs, nb_max):
        e = min(n_pairs, s + nb_max)
        pa.refresh(gen)
        pb.refresh(gen)
        torch.cuda._sleep(head_start_cycles)
        j = 0
        for k in range(s, e):
            e0, e1, e2, e3 = ev[j], ev[j + 1], ev[j + 2], ev[j + 3]
            if first_a[k]:
                f1, f2 = ra[ia[k]], rb[ib[k]]
            else:
                f1, f2 = rb[ib[k]], ra[ia[k]]
            e0.record()
            f1()
            e1.record()
            e2.record()
            f2()
            e3.record()
            j += 4
        torch.cuda.synchronize()
        j = 0
        for k in range(s, e):
            t1 = ev[j].elapsed_time(ev[j + 1])
            t2 = ev[j + 2].elapsed_time(ev[j + 3])
            if first_a[k]:
                ta[k], tb[k] = t1, t2
            else:
                ta[k], tb[k] = t2, t1
            if (k & 15) == 0:
                gaps.append(ev[j + 1].elapsed_time(ev[j + 2]))
                if j + 4 < 4 * (e - s):
                    gaps.append(ev[j + 3].elapsed_time(ev[j + 4]))
            j += 4
        if sample_clocks:
            st = I.nvml().sample()
            if st:
                clocks.append(st)
    return {"a_ns": ta * 1e6, "b_ns": tb * 1e6, "a_first": order, "gap_ns": np.asarray(gaps) * 1e6, "clocks": clocks}


def _clock_summary(samples: list) -> dict:
    if not samples:
        return {}
    out = {}
    for key in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c"):
        xs = [s[key] for s in samples if key in s]
        if xs:
            out[key] = {"min": min(xs), "max": max(xs), "mean": float(np.mean(xs))}
    reasons = sorted({s.get("clock_event_reasons") for s in samples if "clock_event_reasons" in s})
    if reasons:
        out["clock_event_reasons_seen"] = reasons
    return out


def _power_probe(pa: Pool, pb: Pool, block_s: float) -> dict:
    """Run each class alone for ``block_s`` (order A B B A) and read NVML's energy counter and clocks:
    average power and throughput per class. Informational (power/clock effects are out of scope)."""
    import torch

    nv = I.nvml()
    if nv.h is None:
        return {"error": "pynvml not available"}
    res = {pa.spec.name: [], pb.spec.name: []}
    for pool in (pa, pb, pb, pa):
        torch.cuda.synchronize()
        s0, t0, n = nv.sample(), time.perf_counter(), 0
        while time.perf_counter() - t0 < block_s:
            for fn in pool.runs:
                fn()
            n += len(pool.runs)
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        s1 = nv.sample()
        entry = {"calls": n, "seconds": t1 - t0, "calls_per_s": n / (t1 - t0), "sm_clock_mhz_end": s1.get("sm_clock_mhz")}
        if "energy_mj" in s0 and "energy_mj" in s1:
            entry["avg_power_w"] = (s1["energy_mj"] - s0["energy_mj"]) / 1000.0 / (t1 - t0)
        res[pool.spec.name].append(entry)
    summ = {}
    for name, blocks in res.items():
        pw = [b["avg_power_w"] for b in blocks if "avg_power_w" in b]
        summ[name] = {"avg_power_w": float(np.mean(pw)) if pw else None,
                      "calls_per_s": float(np.mean([b["calls_per_s"] for b in blocks])),
                      "sm_clock_mhz_end": [b["sm_clock_mhz_end"] for b in blocks]}
    return {"blocks": res, "summary": summ, "block_s": block_s}


def analyse(a_ns: np.ndarray, b_ns: np.ndarray, a_first: np.ndarray, *, threshold: float = S.T_THRESHOLD) -> dict:
    """All statistics of one class pair (pure numpy; unit-tested)."""
    dd = S.dudect(a_ns, b_ns, threshold=threshold)
    pr = S.paired_t(a_ns, b_ns)
    first = np.where(a_first, a_ns, b_ns)
    second = np.where(a_first, b_ns, a_ns)
    order = S.paired_t(first, second)
    sa, sb = S.summarize(a_ns), S.summarize(b_ns)
    max_t = max(dd["max_abs_t"], abs(pr["t"]))
    uniq = np.unique(np.concatenate([a_ns, b_ns]))
    quantum = float(np.min(np.diff(uniq))) if uniq.size > 1 else None
    crops = [{"i": c["i"], "threshold_ns": c["threshold"], "t": c["t"]} for c in dd["crops"]]
    return {
        "a": sa, "b": sb,
        "mean_diff_ns": dd["uncropped"]["diff"], "mean_diff_ci95_ns": dd["uncropped"]["ci"],
        "welch_uncropped_t": dd["uncropped"]["t"],
        "welch_max_abs_t_cropped": dd["max_abs_t_cropped"],
        "second_order_t": dd["second_order"]["t"],
        "dudect_max_abs_t": dd["max_abs_t"], "dudect_max_test": dd["max_test"],
        "paired_t": pr["t"], "paired_mean_diff_ns": pr["mean_diff"], "paired_ci95_ns": pr["ci"],
        "paired_median_diff_ns": pr["median_diff"],
        "order_effect_ns": order["mean_diff"], "order_effect_t": order["t"],
        "detectable_diff_ns": S.detectable_difference(sa.get("std", 0.0), sb.get("std", 0.0), sa["n"], sb["n"], threshold),
        "timer_quantum_ns": quantum,
        "max_abs_t": max_t, "threshold": threshold, "leak": bool(max_t > threshold),
        "crops": crops,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", "-B", type=int, default=1)
    p.add_argument("--heads", "-H", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--seqlen", "-S", type=int, default=2048)
    p.add_argument("--head-dim", "-D", type=int, default=64)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--causal", default="0", help="comma list of causal flags (default: 0)")
    p.add_argument("--pairs", type=int, default=100_000, help="measurement pairs per test (2 x this many calls)")
    p.add_argument("--min-pairs", type=int, default=50_000,
                   help="the budget never cuts a test below this (10^5 measurements per class pair)")
    p.add_argument("--contrast-pairs", type=int, default=20_000, help="pairs per fast-kernel contrast test")
    p.add_argument("--tests", default=",".join(SECURE_TESTS))
    p.add_argument("--contrast", default="fast_varlen", help="'fast_varlen' or 'none'")
    p.add_argument("--pool", type=int, default=32, help="input sets per class")
    p.add_argument("--batch-pairs", type=int, default=1000, help="pairs recorded between host syncs")
    p.add_argument("--budget-s", type=float, default=180.0, help="wall-time budget for all tests")
    p.add_argument("--power-block-s", type=float, default=1.0, help="power probe: seconds per block (0: off)")
    p.add_argument("--no-graphs", action="store_true", help="time eager calls instead of CUDA-graph replays")
    p.add_argument("--strict-power", action="store_true", help="fail on values_zeros_vs_random too")
    p.add_argument("--save-samples", action="store_true", default=True)
    p.add_argument("--no-save-samples", dest="save_samples", action="store_false")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="auto")
    p.add_argument("--threshold", type=float, default=S.T_THRESHOLD)


def run(a) -> int:
    if not I.cuda_or_message("timing"):
        return 2
    import torch

    t_start = time.time()
    dtype = I.parse_dtype(a.dtype)
    Hkv = a.kv_heads or a.heads
    causals = [x.strip() in ("1", "true", "causal") for x in a.causal.split(",") if x.strip()]
    plan = [("secure", t, c) for c in causals for t in a.tests.split(",") if t.strip()]
    if a.contrast and a.contrast != "none":
        plan += [(a.contrast, t, c) for c in causals[:1] for t in CONTRAST_TESTS]
    report = {"gate": "timing", "env": I.environment(), "gpu_state_start": I.gpu_state(),
              "shape": {"B": a.batch, "H": a.heads, "Hkv": Hkv, "S_max": a.seqlen, "D": a.head_dim, "dtype": a.dtype},
              "threshold": a.threshold, "pool": a.pool, "batch_pairs": a.batch_pairs, "budget_s": a.budget_s,
              "tests": []}
    rng = np.random.default_rng(a.seed)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(a.seed + 1)
    head_start = int(4e6)  # ~2 ms of GPU sleep before each batch so the host gets ahead
    samples = {}
    print(f"[timing] {len(plan)} tests at B={a.batch} H={a.heads} S={a.seqlen} D={a.head_dim} {a.dtype}; "
          f"budget {a.budget_s:.0f} s", flush=True)
    for idx, (kernel, test, causal) in enumerate(plan):
        name = f"{kernel}/{'causal' if causal else 'noncausal'}/{test}"
        entry = {"name": name, "kernel": kernel, "test": test, "causal": causal,
                 "scope": "contrast" if kernel != "secure" else ("power" if test in POWER_TESTS else "in_scope")}
        t0 = time.time()
        try:
            sa, sb = class_specs(test, a.seqlen)
            kw = dict(B=a.batch, H=a.heads, Hkv=Hkv, S_max=a.seqlen, D=a.head_dim, dtype=dtype, causal=causal,
                      P=a.pool, backend=a.backend)
            pa = Pool(kernel, sa, seed=a.seed * 7919 + 11, **kw)
            pb = Pool(kernel, sb, seed=a.seed * 7919 + 23, **kw)
            if a.no_graphs:
                pa.runs[0](); pb.runs[0]()
                mode = "eager"
            else:
                ma, mb = pa.capture(), pb.capture()
                if ma != mb:  # both classes must be timed the same way
                    pa.runs, pb.runs, pa.mode, pb.mode = list(pa._eager), list(pb._eager), "eager", "eager"
                mode = pa.mode
                entry["capture_error"] = getattr(pa, "capture_error", None) or getattr(pb, "capture_error", None)
            entry.update(class_a=sa.__dict__, class_b=sb.__dict__, mode=mode)
            cal = _measure(pa, pb, 200, 200, np.random.default_rng(0), gen, head_start_cycles=head_start,
                           sample_clocks=False)  # warm-up + calibration (discarded)
            torch.cuda.synchronize()
            tc = time.time()
            cal = _measure(pa, pb, 400, 400, np.random.default_rng(1), gen, head_start_cycles=head_start,
                           sample_clocks=False)
            per_pair_s = (time.time() - tc) / 400
            want = a.pairs if kernel == "secure" else a.contrast_pairs
            remaining = a.budget_s - (time.time() - t_start)
            share = remaining / max(1, len(plan) - idx)
            affordable = int(max(0.0, share - 3.0) / per_pair_s) if per_pair_s > 0 else want
            n = min(want, max(affordable, min(a.min_pairs, want) if kernel == "secure" else 2000))
            entry.update(calibration={"per_pair_s": per_pair_s, "gpu_a_median_ns": float(np.median(cal["a_ns"])),
                                      "gpu_b_median_ns": float(np.median(cal["b_ns"]))},
                         n_pairs=n, below_requested=n < want, estimated_s=round(n * per_pair_s, 1))
            print(f"[timing] {name}: {mode}, ~{per_pair_s * 1e6:.0f} us/pair (A {np.median(cal['a_ns']) / 1e3:.1f} us, "
                  f"B {np.median(cal['b_ns']) / 1e3:.1f} us) -> {n} pairs, est {n * per_pair_s:.0f} s", flush=True)
            clk0 = I.gpu_state()
            m = _measure(pa, pb, n, a.batch_pairs, rng, gen, head_start_cycles=head_start)
            clk1 = I.gpu_state()
            res = analyse(m["a_ns"], m["b_ns"], m["a_first"], threshold=a.threshold)
            gaps = m["gap_ns"]
            entry.update(res)
            entry.update(gap_ns_median=float(np.median(gaps)) if gaps.size else None,
                         host_bound_fraction=float(np.mean(gaps > 2000.0)) if gaps.size else None,
                         clocks=_clock_summary(m["clocks"]), gpu_state_before=clk0, gpu_state_after=clk1)
            if test in POWER_TESTS and a.power_block_s > 0:
                entry["power_probe"] = _power_probe(pa, pb, a.power_block_s)
            if a.save_samples:
                key = name.replace("/", "__")
                samples[key + "__a_ns"] = m["a_ns"].astype(np.float32)
                samples[key + "__b_ns"] = m["b_ns"].astype(np.float32)
                samples[key + "__a_first"] = m["a_first"]
            print(f"[timing] {name}: |t| max {res['max_abs_t']:.2f} (dudect {res['dudect_max_abs_t']:.2f} "
                  f"[{res['dudect_max_test']}], paired {res['paired_t']:.2f}); mean diff {res['mean_diff_ns']:.1f} ns "
                  f"CI [{res['mean_diff_ci95_ns'][0]:.1f}, {res['mean_diff_ci95_ns'][1]:.1f}] -> "
                  f"{'DIFFERENCE DETECTED' if res['leak'] else 'no difference detected'}", flush=True)
            del pa, pb
            torch.cuda.empty_cache()
        except Exception as e:
            import traceback
            entry["error"] = f"{type(e).__name__}: {e}"
            entry["traceback"] = traceback.format_exc()[-3000:]
            print(f"[timing] {name}: ERROR {entry['error']}", file=sys.stderr, flush=True)
        entry["elapsed_s"] = round(time.time() - t0, 1)
        report["tests"].append(entry)
    report["gpu_state_end"] = I.gpu_state()
    report["elapsed_s"] = round(time.time() - t_start, 1)
    sec = [t for t in report["tests"] if t["kernel"] == "secure"]
    gating = [t for t in sec if t["scope"] == "in_scope" or (a.strict_power and t["scope"] == "power")]
    leaks = [t["name"] for t in gating if t.get("leak")]
    errors = [t["name"] for t in sec if t.get("error")]
    report["leaks"] = leaks
    report["power_differences"] = [t["name"] for t in sec if t["scope"] == "power" and t.get("leak")]
    report["contrast_detected"] = {t["name"]: bool(t.get("leak")) for t in report["tests"] if t["scope"] == "contrast"}
    if leaks:
        status, code = "FAIL", 1
    elif not sec or len(errors) == len(sec):
        status, code = "error", 2
    elif errors:
        status, code = "FAIL", 1
    else:
        status, code = "pass", 0
    report.update(status=status, exit_code=code, errors=errors)
    out = Path(a.out)
    path = I.write_json(out / "timing.json", report)
    if samples:
        np.savez_compressed(out / "timing_samples.npz", **samples)
    if getattr(a, "json", False):
        print(json.dumps(report, default=str))
    else:
        print_report(report)
    print(f"[timing] {status}: report {path}")
    return code


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"timing ({report['shape']}): {report.get('status')}")
    for c in ("test", "scope", "mode", "pairs", "A med ns", "B med ns", "mean diff ns [95% CI]", "dudect |t|",
              "paired t", "verdict"):
        t.add_column(c)
    for e in report["tests"]:
        if e.get("error"):
            t.add_row(e["name"], e["scope"], "", "", "", "", "", "", "", f"[red]error: {e['error'][:60]}[/]")
            continue
        ci = e["mean_diff_ci95_ns"]
        verdict = "[bold red]difference[/]" if e["leak"] else "[green]none detected[/]"
        if e["scope"] == "contrast":
            verdict = ("[cyan]difference (expected)[/]" if e["leak"] else "[yellow]none detected[/]")
        t.add_row(e["name"], e["scope"], e.get("mode", ""), f"{e['n_pairs']:,}", f"{e['a']['median']:.0f}",
                  f"{e['b']['median']:.0f}", f"{e['mean_diff_ns']:+.1f} [{ci[0]:+.1f}, {ci[1]:+.1f}]",
                  f"{e['dudect_max_abs_t']:.2f}", f"{e['paired_t']:+.2f}", verdict)
    Console().print(t)


if __name__ == "__main__":
    _p = argparse.ArgumentParser(prog="python -m flashcore.audit.timing")
    _p.add_argument("--out", default="audit/results")
    _p.add_argument("--json", action="store_true")
    add_arguments(_p)
    sys.exit(run(_p.parse_args()))
