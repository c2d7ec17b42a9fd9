"""Gate: dudect-style timing tests of the secure kernel (GPU time per call, CUDA events).

Class pairs (all at one public shape; see ``class_specs``):

* ``fixed_vs_random``: a fixed input (the same values copied into every slot dealt to class A) versus
  fresh random inputs, same true lengths (3/4 S_max).
* ``short_vs_long``: true length 1 versus S_max, random values.
* ``pad_zeros_vs_random``: true length S_max/2, padding all zeros versus random non-zero padding.
* ``values_zeros_vs_random``: all-zero versus random values at full length. This one probes data-
  dependent power/clock effects (out of scope of the threat model, measured anyway): it is reported but
  does not fail the gate unless ``--strict-power``.

``--kernel decode`` times the KV-cache decode step instead (``attention_with_kvcache(..., secure=True)``, one
query token per sequence, a contiguous cache of S_max positions): the classes' length is the cache length
(``cache_seqlens``, secret) and their padding the cache positions past it.

Method: the inputs live in slots built on the GPU before timing. For the secure kernel all classes
have one shape, so ``2 x --pool`` slots are shared: before each batch they are dealt at random, half to
each class, and every slot is rewritten with its class's content (values, padding and the GPU lengths
tensor; random: new values, fixed: the same values copied again, zeros: zeroed), outside the timed
regions. Every address thus serves both classes (address effects become noise, not bias) and both
classes cause the same memory writes. (The fast varlen contrast keeps one pool per class: its shapes
follow the lengths.) Each slot's call is captured as a CUDA graph (eager calls if capture fails).
Before each batch the GPU sleeps (``torch.cuda._sleep``) long enough for the host to enqueue the whole
batch (the lead is calibrated from the measured host cost per pair), so the calls run back to back and
the events time the kernel, not the host; the idle gaps between pairs are sampled to show it
(``host_bound_fraction``: gaps over 5 µs). Measurements are taken in pairs, A then B or B then A in a
pre-drawn random order, as e0, call, e1, call, e2 (e1 ends one call and starts the other), with random
slots; ``--batch-pairs`` pairs are enqueued between host synchronisations.
Statistics (flashcore.audit.stats): dudect's Welch t
(uncropped, 100 percentile crops, second order) on the two classes, and a paired t-test on the per-pair
differences (order-randomised, so drift cancels). |t| > 4.5 means a difference was detected; the report
gives the mean difference in ns with a 95% confidence interval and the smallest difference the sample
could have detected. The fast kernel (attention_varlen, whose loop bounds follow the true lengths) runs
``short_vs_long`` and ``fixed_vs_random`` for contrast: short_vs_long should show a huge |t| there.
GPU clocks, power and temperature (pynvml, else nvidia-smi) are sampled at the start, per batch and at
the end. A hardware control (``--control gemm``, not gating) times a plain cuBLAS bf16 GEMM
(``torch.matmul``, 2048^3, no flashcore code) under the same classes: zeros vs random operands, and
operands zero past a "length" of 1 vs none (the shape of the secure kernel's masked P and zeroed V).
A difference there shows the GPU's tensor-core datapath itself takes value-dependent time, so the same
difference in the secure kernel (whose instruction stream and addresses are proven identical by the
SASS and counter gates) is that effect, not a secret-dependent code path. For each secure test a power probe runs each class alone for ``--power-block-s`` seconds
(A B B A) and reports average power (NVML energy counter) and throughput per class. Exit code: 0 no difference detected on the secure kernel, 1 one detected, 2 could not run.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from . import _inputs as I
from . import stats as S

SECURE_TESTS = ("fixed_vs_random", "short_vs_long", "pad_zeros_vs_random", "values_zeros_vs_random")
# The secure kernels the gate times: dense attention (``attention(..., secure=True)``), the KV-cache decode step
# (``attention_with_kvcache(..., secure=True)``: one query token per sequence, the cache's length secret) and KV-cache
# chunked prefill (the same call with ``_inputs.PREFILL_QUERIES`` query tokens per sequence)
SECURE_KERNELS = ("secure", "secure_decode", "secure_prefill")
POWER_TESTS = ("values_zeros_vs_random",)
CONTRAST_TESTS = ("short_vs_long", "fixed_vs_random")
CONTROL_TESTS = ("values_zeros_vs_random", "short_vs_long")
GEMM_N = 2048  # the control GEMM is [N, N] x [N, N]; "length" zeroes A's columns and B's rows past it


@dataclass(frozen=True)
class ClassSpec:
    name: str
    values: str          # "random" (refilled each batch) | "fixed" | "zeros"
    length: int          # true length of every sequence
    pad: str = "values"  # secure only: "values" (padding drawn like the values) | "zeros"


def control_specs(test: str) -> tuple:
    """Classes of the GEMM control (see the module doc)."""
    if test == "values_zeros_vs_random":
        return ClassSpec("zeros", "zeros", GEMM_N), ClassSpec("random", "random", GEMM_N)
    if test == "short_vs_long":
        return ClassSpec("short", "random", 1, "zeros"), ClassSpec("long", "random", GEMM_N, "zeros")
    raise ValueError(f"unknown control test {test!r}")


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


class Slots:
    """Input slots for the timing tests, each with a callable (a CUDA-graph replay once captured).

    secure kernel: ONE set of ``2P`` slots shared by both classes. Before each batch the slots are
    dealt at random, P to class A and P to class B, and every slot is rewritten with its class's
    content (values, padding, and the lengths tensor, which the kernel reads on the GPU). So every
    memory address serves both classes equally often: address effects (DRAM channels, L2 slices,
    TLB) become noise instead of a bias, and both classes cause the same memory writes between batches.
    fast_varlen: the lengths fix the tensor shapes (and ``max_seqlen`` the grid), so each class has its
    own P slots, allocated and captured alternately.
    """

    def __init__(self, kernel: str, sa: ClassSpec, sb: ClassSpec, *, P: int, B, H, Hkv, S_max, D, dtype, causal,
                 backend, seed, secure=True, device="cuda", page_size=0, lens_mode="self", kv_dtype="same"):
        import torch

        self.secure_mode = secure  # the secure kernel's ``secure=`` value: True, or "strict"
        # dense secure kernel: "self" passes the key lengths only (self-attention: the causal diagonal is public),
        # "cross" the query lengths too, equal in value (causal: the secret-diagonal form)
        self.lens_mode = lens_mode
        self.page_size = page_size  # KV-cache kernels: pages of this many positions, in order (0: a contiguous cache)
        I.check_kv_dtype(kernel, kv_dtype)
        # KV-cache kernels: the caches as float8_e4m3fn ("fp8"), with descales that are the same constant for both
        # classes (so the classes differ in the cache's bytes and lengths only)
        self.kv_fp8 = kv_dtype == "fp8"

        if kernel not in (*SECURE_KERNELS, "fast_varlen", "gemm_control"):
            raise ValueError(f"timing supports kernels {', '.join(SECURE_KERNELS)}, fast_varlen and gemm_control, "
                             f"not {kernel!r}")
        self.kernel, self.specs, self.P = kernel, (sa, sb), P
        self.B, self.H, self.Hkv, self.S_max, self.D, self.dtype = B, H, Hkv, S_max, D, dtype
        self.causal, self.backend = causal, backend
        self.dev = torch.device(device)
        self.shared = kernel != "fast_varlen"
        g = torch.Generator(device=self.dev)
        g.manual_seed(seed * 7919 + 11)
        self.fixed = {}
        for spec in (sa, sb):
            if spec.values == "fixed":
                self.fixed[spec.name] = [torch.randn(sh, generator=g, device=self.dev, dtype=torch.float32).to(dtype)
                                         for sh in self._shapes(spec)]
        self.slots = []       # dicts: q, k, v, sk/cu, spec (current content), owner (fixed class or None)
        self.eager = []
        self.runs = []
        self.mode = "eager"
        if self.shared:
            for _ in range(2 * P):
                self._add_slot(sa, owner=None)
        else:
            for _ in range(P):
                self._add_slot(sa, owner=0)
                self._add_slot(sb, owner=1)
        for i, slot in enumerate(self.slots):  # initial contents
            self._fill(slot, slot["spec"], g)
        self.assign_a = list(range(0, len(self.slots), 2))
        self.assign_b = list(range(1, len(self.slots), 2))

    def _shapes(self, spec: ClassSpec):
        if self.kernel == "gemm_control":
            return ((GEMM_N, GEMM_N), (GEMM_N, GEMM_N), (1,))
        if self.kernel == "secure":
            return ((self.B, self.H, self.S_max, self.D), (self.B, self.Hkv, self.S_max, self.D),
                    (self.B, self.Hkv, self.S_max, self.D))
        if self.kernel in I.KV_KINDS:  # q [B, 1 or PREFILL_QUERIES, H, D]; contiguous caches [B, S_max, Hkv, D]
            sq = 1 if self.kernel == "secure_decode" else I.PREFILL_QUERIES
            return ((self.B, sq, self.H, self.D), (self.B, self.S_max, self.Hkv, self.D),
                    (self.B, self.S_max, self.Hkv, self.D))
        L = spec.length
        return ((self.B * L, self.H, self.D), (self.B * L, self.Hkv, self.D), (self.B * L, self.Hkv, self.D))

    def _add_slot(self, spec: ClassSpec, owner) -> None:
        import torch
        import flashcore

        q, k, v = (torch.empty(sh, device=self.dev, dtype=self.dtype) for sh in self._shapes(spec))
        causal, backend = self.causal, self.backend
        slot = {"q": q, "k": k, "v": v, "spec": spec, "owner": owner}
        if self.kernel == "gemm_control":
            c = torch.empty((GEMM_N, GEMM_N), device=self.dev, dtype=self.dtype)

            def fn(a=q, b=k, c=c):
                return torch.matmul(a, b, out=c)
        elif self.kernel == "secure":
            sk = torch.full((self.B,), spec.length, dtype=torch.int32, device=self.dev)
            slot["sk"] = sk
            sq = None
            if self.lens_mode == "cross":  # a tensor of its own, rewritten with the class like sk
                sq = slot["sq"] = sk.clone()

            def fn(q=q, k=k, v=v, sk=sk, sq=sq):
                return flashcore.attention(q, k, v, causal=causal, seqlens_q=sq, seqlens_k=sk,
                                           secure=self.secure_mode, backend=backend)
        elif self.kernel in I.KV_KINDS:
            sk = torch.full((self.B,), spec.length, dtype=torch.int32, device=self.dev)
            slot["sk"] = sk
            kd = vd = None
            if self.kv_fp8:
                k, v = (torch.empty(t.shape, device=self.dev, dtype=torch.float8_e4m3fn) for t in (k, v))
                slot["k"], slot["v"] = k, v
                kd, vd = (torch.full((self.B, self.Hkv), 0.25, device=self.dev) for _ in range(2))

            table = None
            if self.page_size:  # the same memory as pages, in order: the table is public either way
                n = self.S_max // self.page_size
                table = torch.arange(self.B * n, dtype=torch.int32, device=self.dev).view(self.B, n)
                k, v = (t.view(self.B * n, self.page_size, self.Hkv, self.D) for t in (k, v))

            def fn(q=q, k=k, v=v, sk=sk, table=table, kd=kd, vd=vd):
                return flashcore.attention_with_kvcache(q, k, v, cache_seqlens=sk, page_table=table, causal=causal,
                                                        k_descale=kd, v_descale=vd, secure=True, backend=backend)
        else:
            L = spec.length
            cu = torch.arange(0, self.B + 1, dtype=torch.int32, device=self.dev) * L

            def fn(q=q, k=k, v=v, cu=cu, L=L):
                return flashcore.attention_varlen(q, k, v, cu, cu, L, L, causal=causal, backend=backend)
        self.slots.append(slot)
        self.eager.append(fn)
        self.runs.append(fn)

    def _fill(self, slot: dict, spec: ClassSpec, gen) -> None:
        """Write a class's content into a slot: every byte of q, k, v is rewritten whatever the class."""
        import torch

        src = self.fixed.get(spec.name)
        for i, t in enumerate((slot["q"], slot["k"], slot["v"])):
            if src is not None:
                t.copy_(src[i])  # (into an FP8 cache: converted)
            elif spec.values == "zeros":
                t.view(torch.uint8).zero_() if t.element_size() == 1 else t.zero_()  # (e4m3's 0x00 is +0)
            elif t.element_size() == 1:  # N(0, 1) into an FP8 cache, converted
                t.copy_(torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32))
            else:
                t.normal_(generator=gen)
        if self.kernel == "gemm_control" and spec.pad == "zeros":
            slot["q"][:, spec.length:] = 0
            slot["k"][spec.length:, :] = 0
        if self.kernel == "secure":
            if spec.pad == "zeros":
                L = spec.length
                for t in (slot["q"], slot["k"], slot["v"]):
                    t[:, :, L:, :] = 0
            slot["sk"].fill_(spec.length)
            if "sq" in slot:
                slot["sq"].fill_(spec.length)
        if self.kernel in I.KV_KINDS:  # the cache's positions past its length are the padding
            if spec.pad == "zeros":
                for t in (slot["k"], slot["v"]):
                    (t.view(torch.uint8) if t.element_size() == 1 else t)[:, spec.length:] = 0
            slot["sk"].fill_(spec.length)
        slot["spec"] = spec

    def capture(self) -> Optional[str]:
        """Capture every slot's call as a CUDA graph (slot order alternates the classes). On failure the
        eager calls stay and the error is returned."""
        import torch

        for fn in self.eager[:2]:
            fn()  # compile / warm up outside any capture
        torch.cuda.synchronize()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for fn in self.eager[:2]:
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graphs = []
            for fn in self.eager:
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr):
                    out = fn()
                graphs.append((gr, out))
            torch.cuda.synchronize()
        except Exception as e:  # capture unsupported: time eager calls (host latency may show up)
            self.runs = list(self.eager)
            self.mode = "eager"
            return f"{type(e).__name__}: {e}"
        self._graphs = graphs
        self.runs = [gr.replay for gr, _ in graphs]
        self.mode = "graph"
        return None

    def prepare_batch(self, gen, rng: np.random.Generator):
        """Deal the slots (shared design) and rewrite them; returns (slot indices of A, of B). Not timed."""
        sa, sb = self.specs
        if self.shared:
            perm = rng.permutation(len(self.slots)).tolist()
            self.assign_a, self.assign_b = perm[:self.P], perm[self.P:]
        for i in self.assign_a:
            self._fill(self.slots[i], sa, gen)
        for i in self.assign_b:
            self._fill(self.slots[i], sb, gen)
        return self.assign_a, self.assign_b


def _measure(slots: Slots, n_pairs: int, batch: int, rng: np.random.Generator, gen, *,
             lead_s: float, clock_hz: float, sample_clocks: bool = True) -> dict:
    """Time ``n_pairs`` order-randomised pairs. Per batch: deal and rewrite the slots (untimed), put the
    GPU to sleep for ``lead_s`` so the host can enqueue the batch ahead of it, then for each pair record
    e0, call, e1, call, e2 (e1 ends the first call and starts the second), synchronise once, read the
    elapsed times. Every 8th pair, the idle time from the previous pair's e2 to this pair's e0 is read:
    more than a few µs means the host fell behind the GPU (``gap_ns``)."""
    import torch

    first_a = rng.integers(0, 2, n_pairs).astype(bool)  # True: A first
    ua = rng.random(n_pairs).tolist()  # slot choice within the batch's A / B slots
    ub = rng.random(n_pairs).tolist()
    fa = first_a.tolist()
    ta = np.empty(n_pairs, dtype=np.float64)
    tb = np.empty(n_pairs, dtype=np.float64)
    gaps, clocks, slot_a, slot_b = [], [], np.empty(n_pairs, dtype=np.int32), np.empty(n_pairs, dtype=np.int32)
    nb_max = min(batch, n_pairs)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3 * nb_max)]
    runs = slots.runs
    cycles = max(1000, int(lead_s * clock_hz))
    enqueue_s = 0.0
    for s in range(0, n_pairs, nb_max):
        e = min(n_pairs, s + nb_max)
        ia_list, ib_list = slots.prepare_batch(gen, rng)
        na, nbb = len(ia_list), len(ib_list)
        torch.cuda._sleep(cycles)
        t0 = time.perf_counter()
        j = 0
        for k in range(s, e):
            ia = ia_list[int(ua[k] * na)]
            ib = ib_list[int(ub[k] * nbb)]
            slot_a[k], slot_b[k] = ia, ib
            if fa[k]:
                f1, f2 = runs[ia], runs[ib]
            else:
                f1, f2 = runs[ib], runs[ia]
            ev[j].record()
            f1()
            ev[j + 1].record()
            f2()
            ev[j + 2].record()
            j += 3
        enqueue_s += time.perf_counter() - t0
        torch.cuda.synchronize()
        j = 0
        for k in range(s, e):
            t1 = ev[j].elapsed_time(ev[j + 1])
            t2 = ev[j + 1].elapsed_time(ev[j + 2])
            if fa[k]:
                ta[k], tb[k] = t1, t2
            else:
                ta[k], tb[k] = t2, t1
            if (k & 7) == 0 and j >= 3:
                gaps.append(ev[j - 1].elapsed_time(ev[j]))
            j += 3
        if sample_clocks:
            st = I.nvml().sample()
            if st:
                clocks.append(st)
    return {"a_ns": ta * 1e6, "b_ns": tb * 1e6, "a_first": first_a, "gap_ns": np.asarray(gaps) * 1e6,
            "clocks": clocks, "enqueue_s_per_pair": enqueue_s / max(1, n_pairs), "slot_a": slot_a, "slot_b": slot_b}


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


def _power_probe(slots: Slots, gen, block_s: float) -> dict:
    """Run each class alone for ``block_s`` (order A B B A) and read NVML's energy counter and clocks:
    average power and throughput per class. Informational (power/clock effects are out of scope)."""
    import torch

    nv = I.nvml()
    if nv.h is None:
        return {"error": "pynvml not available"}
    sa, sb = slots.specs
    res = {sa.name: [], sb.name: []}
    rng = np.random.default_rng(123)
    for which in (0, 1, 1, 0):
        ia, ib = slots.prepare_batch(gen, rng)
        idx = ia if which == 0 else ib
        runs = [slots.runs[i] for i in idx]
        torch.cuda.synchronize()
        s0, t0, n = nv.sample(), time.perf_counter(), 0
        while time.perf_counter() - t0 < block_s:
            for fn in runs:
                fn()
            n += len(runs)
            if n % (8 * len(runs)) == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        s1 = nv.sample()
        entry = {"calls": n, "seconds": t1 - t0, "calls_per_s": n / (t1 - t0), "sm_clock_mhz_end": s1.get("sm_clock_mhz")}
        if "energy_mj" in s0 and "energy_mj" in s1:
            entry["avg_power_w"] = (s1["energy_mj"] - s0["energy_mj"]) / 1000.0 / (t1 - t0)
        res[(sa, sb)[which].name].append(entry)
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
    I.add_shape_arguments(p, batch=1, heads=16, seqlen=2048, head_dim=64)
    p.add_argument("--causal", default="0", help="comma list of causal flags (default: 0)")
    p.add_argument("--pairs", type=int, default=100_000, help="measurement pairs per test (2 x this many calls)")
    p.add_argument("--control", default="gemm", help="'gemm' (the cuBLAS hardware control) or 'none'")
    p.add_argument("--min-pairs", type=int, default=100_000,
                   help="the budget never cuts a test below this (10^5 measurements per class pair)")
    p.add_argument("--contrast-pairs", type=int, default=20_000, help="pairs per fast-kernel contrast test")
    p.add_argument("--tests", default=",".join(SECURE_TESTS))
    p.add_argument("--contrast", default="fast_varlen", help="'fast_varlen' or 'none'")
    p.add_argument("--pool", type=int, default=32,
                   help="input slots per class (secure: 2x this many shared slots, dealt to the classes per batch)")
    p.add_argument("--batch-pairs", type=int, default=128,
                   help="pairs enqueued ahead of the GPU between host syncs (keep the launch queue short)")
    p.add_argument("--budget-s", type=float, default=180.0, help="wall-time budget for all tests")
    p.add_argument("--power-block-s", type=float, default=1.0, help="power probe: seconds per block (0: off)")
    p.add_argument("--no-graphs", action="store_true", help="time eager calls instead of CUDA-graph replays")
    p.add_argument("--strict-power", action="store_true", help="fail on values_zeros_vs_random too")
    p.add_argument("--save-samples", action="store_true", default=True)
    p.add_argument("--no-save-samples", dest="save_samples", action="store_false")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="auto")
    p.add_argument("--kernel", choices=("dense", "decode", "prefill"), default="dense",
                   help="the secure kernel timed: dense attention, the KV-cache decode step (one query token per "
                   "sequence against a contiguous cache of S_max positions whose length cache_seqlens is secret), or "
                   "KV-cache chunked prefill (the same with 128 query tokens per sequence)")
    p.add_argument("--page-size", type=int, default=0,
                   help="--kernel decode or prefill: the cache as pages of this many positions, in order (0: "
                   "contiguous)")
    p.add_argument("--kv-dtype", choices=I.KV_DTYPES, default="same",
                   help="--kernel decode or prefill: the cache's element type (same as q, or fp8: float8_e4m3fn with "
                   "constant descales)")
    p.add_argument("--strict", action="store_true", help="time secure=\"strict\" (q's and k's padding replaced "
                   "before the kernels) instead of secure=True")
    p.add_argument("--lens-mode", choices=("self", "cross"), default="self",
                   help="--kernel dense: 'self' passes the key lengths only (the self-attention form: a causal "
                   "diagonal that is public), 'cross' the query lengths too (causal: the secret-diagonal form)")
    p.add_argument("--threshold", type=float, default=S.T_THRESHOLD)


def run(a) -> int:
    if not I.cuda_or_message("timing"):
        return 2
    import torch

    t_start = time.time()
    dtype = I.parse_dtype(a.dtype)
    Hkv = a.kv_heads or a.heads
    causals = [x.strip() in ("1", "true", "causal") for x in a.causal.split(",") if x.strip()]
    if a.kernel != "dense" and a.strict:
        print("[timing] --strict is for the dense kernel: the KV-cache path has no strict form", file=sys.stderr)
        return 2
    if a.kernel == "dense" and a.kv_dtype != "same":
        print(f"[timing] --kv-dtype {a.kv_dtype} is for --kernel decode or prefill (the KV-cache kernels)",
              file=sys.stderr)
        return 2
    secure_kernel = {"decode": "secure_decode", "prefill": "secure_prefill"}.get(a.kernel, "secure")
    plan = [(secure_kernel, t, c) for c in causals for t in a.tests.split(",") if t.strip()]
    if a.contrast and a.contrast != "none":
        plan += [(a.contrast, t, c) for c in causals[:1] for t in CONTRAST_TESTS]
    if a.control and a.control != "none":
        plan += [("gemm_control", t, False) for t in CONTROL_TESTS]
    report = {"gate": "timing", "env": I.environment(), "gpu_state_start": I.gpu_state(),
              "shape": {"B": a.batch, "H": a.heads, "Hkv": Hkv, "S_max": a.seqlen, "D": a.head_dim, "dtype": a.dtype},
              "secure": "strict" if a.strict else True, "kernel": a.kernel, "page_size": a.page_size,
              "kv_dtype": a.kv_dtype,
              "lens_mode": a.lens_mode,
              "threshold": a.threshold, "pool": a.pool, "batch_pairs": a.batch_pairs, "budget_s": a.budget_s,
              "tests": []}
    rng = np.random.default_rng(a.seed)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(a.seed + 1)
    st0 = I.nvml().sample()
    clock_hz = float(st0.get("sm_clock_mhz") or 1980) * 1e6  # for torch.cuda._sleep's cycle count
    samples = {}
    print(f"[timing] {len(plan)} tests at B={a.batch} H={a.heads} S={a.seqlen} D={a.head_dim} {a.dtype}; "
          f"budget {a.budget_s:.0f} s", flush=True)
    for idx, (kernel, test, causal) in enumerate(plan):
        name = f"{kernel}/{'causal' if causal else 'noncausal'}/{test}"
        entry = {"name": name, "kernel": kernel, "test": test, "causal": causal,
                 "scope": ("control" if kernel == "gemm_control" else "contrast") if kernel not in SECURE_KERNELS
                 else ("power" if test in POWER_TESTS else "in_scope")}
        t0 = time.time()
        try:
            sa, sb = control_specs(test) if kernel == "gemm_control" else class_specs(test, a.seqlen)
            kw = dict(B=a.batch, H=a.heads, Hkv=Hkv, S_max=a.seqlen, D=a.head_dim, dtype=dtype, causal=causal,
                      backend=a.backend, secure="strict" if a.strict else True, page_size=a.page_size,
                      lens_mode=a.lens_mode if kernel == "secure" else "self",
                      kv_dtype=a.kv_dtype if kernel in I.KV_KINDS else "same")
            slots = Slots(kernel, sa, sb, P=a.pool, seed=a.seed, **kw)
            cap_err = None if a.no_graphs else slots.capture()
            if a.no_graphs:
                for fn in slots.eager[:2]:
                    fn()
            mode = slots.mode
            entry.update(class_a=sa.__dict__, class_b=sb.__dict__, mode=mode, capture_error=cap_err,
                         design="shared slots, dealt per batch" if slots.shared else "one pool per class")
            nb = a.batch_pairs
            # Calibration (discarded): host enqueue cost and GPU time per pair, with a lead long enough
            # that the host never waits; then the lead each batch needs so the GPU never starves.
            _measure(slots, 32, 32, np.random.default_rng(0), gen, lead_s=0.02, clock_hz=clock_hz, sample_clocks=False)
            cal = _measure(slots, nb, nb, np.random.default_rng(1), gen, lead_s=0.1, clock_hz=clock_hz,
                           sample_clocks=False)
            cpu_pair = cal["enqueue_s_per_pair"]
            gpu_pair = (float(np.median(cal["a_ns"])) + float(np.median(cal["b_ns"]))) * 1e-9
            lead_s = min(0.05, 0.001 + max(0.0, 1.3 * cpu_pair - gpu_pair) * nb)
            for attempt in range(3):  # lengthen the lead while the host still falls behind the GPU
                tc = time.time()
                m2 = _measure(slots, 2 * nb, nb, np.random.default_rng(2 + attempt), gen, lead_s=lead_s,
                              clock_hz=clock_hz, sample_clocks=False)
                per_pair_s = (time.time() - tc) / (2 * nb)
                hb = float(np.mean(m2["gap_ns"] > 5000.0)) if m2["gap_ns"].size else 0.0
                if hb <= 0.05 or lead_s >= 0.05:
                    break
                lead_s = min(0.05, 2.0 * lead_s + 0.002)
            want = a.pairs if kernel in (*SECURE_KERNELS, "gemm_control") else a.contrast_pairs
            remaining = a.budget_s - (time.time() - t_start)
            share = remaining / max(1, len(plan) - idx)
            affordable = int(max(0.0, share - 3.0) / per_pair_s) if per_pair_s > 0 else want
            n = min(want, max(affordable, min(a.min_pairs, want) if kernel in (*SECURE_KERNELS, "gemm_control") else 2000))
            entry.update(calibration={"host_enqueue_us_per_pair": cpu_pair * 1e6, "gpu_us_per_pair": gpu_pair * 1e6,
                                      "lead_ms_per_batch": lead_s * 1e3, "wall_us_per_pair": per_pair_s * 1e6,
                                      "gpu_a_median_ns": float(np.median(cal["a_ns"])),
                                      "gpu_b_median_ns": float(np.median(cal["b_ns"]))},
                         n_pairs=n, below_requested=n < want, estimated_s=round(n * per_pair_s, 1))
            print(f"[timing] {name}: {mode}; host {cpu_pair * 1e6:.0f} us/pair, GPU {gpu_pair * 1e6:.0f} us/pair "
                  f"(A {np.median(cal['a_ns']) / 1e3:.1f} us, B {np.median(cal['b_ns']) / 1e3:.1f} us), lead "
                  f"{lead_s * 1e3:.1f} ms/batch -> {n} pairs, est {n * per_pair_s:.0f} s", flush=True)
            clk0 = I.gpu_state()
            m = _measure(slots, n, nb, rng, gen, lead_s=lead_s, clock_hz=clock_hz)
            clk1 = I.gpu_state()
            res = analyse(m["a_ns"], m["b_ns"], m["a_first"], threshold=a.threshold)
            gaps = m["gap_ns"]
            entry.update(res)
            entry.update(gap_ns_median=float(np.median(gaps)) if gaps.size else None,
                         host_bound_fraction=float(np.mean(gaps > 5000.0)) if gaps.size else None,
                         enqueue_us_per_pair=m["enqueue_s_per_pair"] * 1e6,
                         clocks=_clock_summary(m["clocks"]), gpu_state_before=clk0, gpu_state_after=clk1)
            if kernel in SECURE_KERNELS and a.power_block_s > 0:
                entry["power_probe"] = _power_probe(slots, gen, a.power_block_s)
            if a.save_samples:
                key = name.replace("/", "__")
                samples[key + "__a_ns"] = m["a_ns"].astype(np.float32)
                samples[key + "__b_ns"] = m["b_ns"].astype(np.float32)
                samples[key + "__a_first"] = m["a_first"]
                samples[key + "__slot_a"] = m["slot_a"].astype(np.int16)
                samples[key + "__slot_b"] = m["slot_b"].astype(np.int16)
            print(f"[timing] {name}: |t| max {res['max_abs_t']:.2f} (dudect {res['dudect_max_abs_t']:.2f} "
                  f"[{res['dudect_max_test']}], paired {res['paired_t']:.2f}); mean diff {res['mean_diff_ns']:.1f} ns "
                  f"CI [{res['mean_diff_ci95_ns'][0]:.1f}, {res['mean_diff_ci95_ns'][1]:.1f}] -> "
                  f"{'DIFFERENCE DETECTED' if res['leak'] else 'no difference detected'}", flush=True)
            del slots
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
    sec = [t for t in report["tests"] if t["kernel"] in SECURE_KERNELS]
    gating = [t for t in sec if t["scope"] == "in_scope" or (a.strict_power and t["scope"] == "power")]
    leaks = [t["name"] for t in gating if t.get("leak")]
    errors = [t["name"] for t in sec if t.get("error")]
    report["leaks"] = leaks
    report["power_differences"] = [t["name"] for t in sec if t["scope"] == "power" and t.get("leak")]
    report["contrast_detected"] = {t["name"]: bool(t.get("leak")) for t in report["tests"] if t["scope"] == "contrast"}
    report["hardware_control"] = {t["name"]: {"difference_detected": bool(t.get("leak")),
                                              "mean_diff_ns": t.get("mean_diff_ns"), "max_abs_t": t.get("max_abs_t"),
                                              "a_median_ns": (t.get("a") or {}).get("median"),
                                              "b_median_ns": (t.get("b") or {}).get("median")}
                                  for t in report["tests"] if t["scope"] == "control"}
    if leaks:
        status, code = "FAIL", 1
    elif not sec or len(errors) == len(sec):
        status, code = "error", 2
    elif errors:
        status, code = "FAIL", 1
    else:
        status, code = "pass", 0
    report.update(status=status, exit_code=code, errors=errors)
    I.publish(a, "timing", report, print_report)
    if samples:
        np.savez_compressed(Path(a.out) / "timing_samples.npz", **samples)
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
        elif e["scope"] == "control":
            verdict = ("[cyan]hardware: value-dependent[/]" if e["leak"] else "[green]hardware: none detected[/]")
        t.add_row(e["name"], e["scope"], e.get("mode", ""), f"{e['n_pairs']:,}", f"{e['a']['median']:.0f}",
                  f"{e['b']['median']:.0f}", f"{e['mean_diff_ns']:+.1f} [{ci[0]:+.1f}, {ci[1]:+.1f}]",
                  f"{e['dudect_max_abs_t']:.2f}", f"{e['paired_t']:+.2f}", verdict)
    Console(width=170).print(t)


if __name__ == "__main__":
    sys.exit(I.module_main("python -m flashcore.audit.timing", add_arguments, run))
