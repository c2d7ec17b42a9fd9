"""KV-cache kernel configurations and the host cost of KV-cache calls (issue 22; docs/perf-notes.md v22).

Three questions, one device call:

* ``correct``: the split kernel (bf16, FP8) against the float64 reference on random lengths, leftpad, paged and
  contiguous caches, chunked-prefill query lengths, split counts 1 and many; outputs poisoned with NaN first.
* ``configs``: candidate :class:`~flashcore.launch.triton_decode.DecodeConfig` per shape (chunked prefill
  Sq 512 against 8k, the FP8 cache, B1 4k), each planned once (``plan.decode.plan_kvcache(config=...)``) and
  timed as a CUDA-graph replay (``do_bench_cudagraph``: GPU time, no host), beside the planner's own choice
  and, for FP8, the bf16 cache of the same problem.
* ``host``: wall time per eager call (200 calls, then one sync) of a B1 decode step as transformers makes it:
  the same cache every call (a plan-cache hit), a cache one token longer every call (a new ``[B, Hkv, S, D]``
  tensor viewed as ``[B, S, Hkv, D]``, as transformers' DynamicCache hands it over), and SDPA on the same
  growing tensors.
* ``same_kv`` (v25): the planner's configuration with V addressed by K's offsets (``SAME_KV``) against V's own
  address arithmetic, interleaved, per shape. Config cases whose tuple ends in ``True`` after the secure flag lay
  each sequence's pages out in order (the control of v25.1).

* ``interleaved`` (v52.3): the candidates of ``--cases`` as CUDA graphs replayed in a random order each round, every
  case's inputs kept, so clock drift falls on all alike (``--rounds``).
* ``combine`` (v27): the combine step launched as a programmatic dependent of the split step against a plain
  launch, per shape, cold L2 (as the bench harness times) and as a CUDA-graph replay, with SDPA beside it.

    python -m flashcore.bench.experiments.kv_configs --out $OUT [--only correct,configs,host,same_kv,combine]

Writes ``decode_configs.json`` and prints a table. (Named kv_configs: the KV-cache kernel's configurations.)
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

import flashcore
from ... import _checks as C
from ...launch.triton_decode import DecodeConfig
from ...plan.decode import plan_kvcache
from ...reference import attention_with_kvcache as reference
from ..results import collect_environment
from . import parser

E4M3 = torch.float8_e4m3fn


def _make(B, Hq, Hkv, D, cap, Sq, page, fp8, gen, dev, lens=None, ordered=False):
    """q, caches (paged: shuffled pages; ``ordered``: each sequence's pages in order, the control), and the call's
    keyword arguments (every sequence full unless ``lens``)."""
    q = torch.randn(B, Sq, Hq, D, generator=gen, device=dev).to(torch.bfloat16)
    kc = torch.randn(B, cap, Hkv, D, generator=gen, device=dev)
    vc = torch.randn(B, cap, Hkv, D, generator=gen, device=dev)
    kw = dict(cache_seqlens=lens if lens is not None else torch.full((B,), cap, dtype=torch.int32, device=dev))
    if fp8:
        kd = torch.rand(B, Hkv, generator=gen, device=dev) + 0.5
        vd = torch.rand(B, Hkv, generator=gen, device=dev) + 0.5
        kc, vc = (kc / kd[:, None, :, None]).to(E4M3), (vc / vd[:, None, :, None]).to(E4M3)
        kw.update(k_descale=kd, v_descale=vd)
    else:
        kc, vc = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
    if page:
        n = B * cap // page
        perm = torch.arange(n, device=dev) if ordered else torch.randperm(n, generator=gen, device=dev)
        table = perm.view(B, cap // page).to(torch.int32)
        pk = torch.empty((n, page, Hkv, D), dtype=kc.dtype, device=dev)
        pv = torch.empty_like(pk)
        pk[perm] = kc.reshape(n, page, Hkv, D)
        pv[perm] = vc.reshape(n, page, Hkv, D)
        kc, vc = pk, pv
        kw["page_table"] = table
    return q, kc, vc, kw


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


def correct(dev) -> list:
    gen = torch.Generator(device=dev).manual_seed(int(time.time()) & 0xFFFF)
    rows = []
    cases = [  # B, Hq, Hkv, D, cap, Sq, page, fp8, splits, leftpad
        (3, 32, 8, 128, 2048, 300, 0, False, 0, False), (3, 32, 8, 128, 2048, 300, 128, False, 3, False),
        (2, 16, 2, 128, 4096, 512, 16, False, 0, False), (2, 32, 8, 64, 1024, 77, 0, False, 2, True),
        (2, 32, 8, 128, 2048, 1, 0, False, 0, False), (2, 32, 8, 128, 2048, 4, 64, False, 5, False),
        (2, 32, 8, 128, 2048, 1, 0, True, 0, False), (2, 32, 8, 128, 2048, 200, 128, True, 0, False),
        (4, 8, 8, 256, 1000, 33, 0, False, 0, True),
        # v24: FP8 tiles read as uint16 pairs (odd head dims are masked pairs, D 72; paged, split, secure)
        (2, 32, 8, 72, 1008, 3, 16, True, 3, False), (3, 16, 4, 64, 2048, 1, 0, True, 4, True),
        (2, 32, 8, 128, 4096, 1, 16, True, 0, False, True), (2, 32, 8, 128, 2048, 2, 0, True, 3, False, True),
    ]
    for B, Hq, Hkv, D, cap, Sq, page, fp8, splits, leftpad, *sec in cases:
        secure = bool(sec and sec[0])
        lens = torch.randint(Sq, cap + 1, (B,), generator=gen, device=dev, dtype=torch.int32)
        lens[0] = cap
        q, kc, vc, kw = _make(B, Hq, Hkv, D, cap, Sq, page, fp8, gen, dev, lens=lens)
        if leftpad:
            frac = torch.rand(B, generator=gen, device=dev)
            kw["cache_leftpad"] = (frac * torch.clamp(lens, max=200)).to(torch.int32)
        out = torch.full_like(q, float("nan"))
        o, lse = flashcore.attention_with_kvcache(q, kc, vc, num_splits=splits, return_lse=True, out=out,
                                                  secure=secure, **kw)
        ref, ref_lse = reference(q.double(), kc.double() if not fp8 else kc, vc.double() if not fp8 else vc,
                                 return_lse=True, **kw)
        err = _rel(o, ref)
        fin = torch.isfinite(ref_lse)
        lerr = (lse[fin].double() - ref_lse[fin]).abs().max().item() if fin.any() else 0.0
        ok = err < 1e-2 and lerr < 1e-3 and not torch.isnan(o).any().item() and torch.equal(torch.isfinite(lse), fin)
        rows.append(dict(B=B, Hq=Hq, Hkv=Hkv, D=D, cap=cap, Sq=Sq, page=page, fp8=fp8, splits=splits,
                         leftpad=leftpad, secure=secure, err=err, lse_err=lerr, ok=bool(ok)))
    return rows


def _graph_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return 1e3 * do_bench_cudagraph(fn, rep=60)  # ms -> us


def _planned(q, kc, vc, kw, cfg, secure=False):
    """A replayable call with ``cfg`` (None: the planner's), through the same plan class the library runs."""
    opt = {n: kw.get(n) for n in ("k", "v", "page_table", "cache_batch_idx", "cache_leftpad", "cu_seqlens_q",
                                  "k_descale", "v_descale")}
    a = C.check_kvcache(q, kc, vc, cache_seqlens=kw["cache_seqlens"], **opt, max_seqlen_q=None, causal=True,
                        scale=None, num_splits=0, return_lse=False, out=None, secure=secure, backend="auto")
    out = torch.empty_like(q)
    plan = plan_kvcache(a, q, kc, vc, None, None, opt["page_table"], None, None, out, config=cfg)
    t = dict(opt, cache_seqlens=kw["cache_seqlens"])
    return plan, (lambda: plan(q, kc, vc, t, out))


CFG = DecodeConfig
V52_GATHER = dict(gather_kv_offsets=True, whole_tiles=True, seen_by_load=True)  # v52.6's secure FP8 gather form
CONFIG_CASES = {
    # name: (B, Hq, Hkv, D, cap, Sq, page, fp8, candidates)
    "prefill512_8k": ((4, 32, 8, 128, 8192, 512, 0, False),
                      [CFG(64, 128, 8, 3, 1), CFG(128, 128, 8, 3, 1), CFG(128, 64, 8, 3, 1), CFG(128, 64, 4, 3, 1),
                       CFG(128, 128, 8, 2, 1), CFG(64, 64, 4, 3, 1), CFG(128, 64, 8, 4, 1), CFG(256, 64, 8, 3, 1)]),
    "prefill512_8k_page128": ((4, 32, 8, 128, 8192, 512, 128, False),
                              [CFG(128, 128, 8, 3, 1), CFG(128, 64, 8, 3, 1)]),
    "fp8_b64_16k": ((64, 32, 8, 128, 16384, 1, 0, True),
                    [CFG(16, 128, 8, 3, 1), CFG(16, 256, 8, 3, 1), CFG(16, 128, 4, 3, 1), CFG(16, 128, 4, 4, 1),
                     CFG(16, 256, 4, 3, 1), CFG(16, 128, 8, 4, 1), CFG(16, 64, 4, 4, 1), CFG(16, 256, 8, 2, 1)]),
    "bf16_b64_16k": ((64, 32, 8, 128, 16384, 1, 0, False), [CFG(16, 128, 8, 3, 1)]),
    "fp8_b1_64k": ((1, 32, 8, 128, 65536, 1, 0, True),
                   [CFG(16, 128, 8, 3, 66), CFG(16, 256, 8, 3, 66), CFG(16, 128, 4, 4, 66), CFG(16, 256, 4, 3, 66),
                    CFG(16, 128, 8, 3, 128), CFG(16, 128, 8, 3, 16), CFG(16, 128, 4, 3, 16)]),
    "bf16_b1_64k": ((1, 32, 8, 128, 65536, 1, 0, False), [CFG(16, 128, 8, 3, 66)]),
    "b64_8k": ((64, 32, 8, 128, 8192, 1, 0, False), []),
    "b64_8k_p16": ((64, 32, 8, 128, 8192, 1, 16, False), []),
    "b64_8k_p64": ((64, 32, 8, 128, 8192, 1, 64, False), []),
    "b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, False), []),
    # v22.4: paged layouts, fast and secure: unmasked loop (full_tiles) and register page loads (reg_pages)
    "p128_b64_8k": ((64, 32, 8, 128, 8192, 1, 128, False),
                    [CFG(16, 128, 8, 3, 1, full_tiles=True), CFG(16, 128, 8, 3, 1, reg_pages=True),
                     CFG(16, 128, 8, 3, 1, full_tiles=True, reg_pages=True)]),
    "p128_b1_64k": ((1, 32, 8, 128, 65536, 1, 128, False),
                    [CFG(16, 128, 8, 3, 16, full_tiles=True), CFG(16, 128, 8, 3, 16, reg_pages=True),
                     CFG(16, 128, 8, 3, 16, full_tiles=True, reg_pages=True)]),
    "p16_b64_8k": ((64, 32, 8, 128, 8192, 1, 16, False),
                   [CFG(16, 128, 8, 3, 1, reg_pages=True), CFG(16, 16, 8, 3, 1), CFG(16, 16, 4, 4, 1),
                    CFG(16, 16, 8, 3, 1, reg_pages=True), CFG(16, 16, 4, 4, 1, reg_pages=True),
                    CFG(16, 16, 8, 3, 1, reg_pages=True, full_tiles=True)]),
    "p64_b64_8k": ((64, 32, 8, 128, 8192, 1, 64, False),
                   [CFG(16, 128, 8, 3, 1, reg_pages=True), CFG(16, 64, 8, 3, 1, reg_pages=True),
                    CFG(16, 64, 8, 3, 1, reg_pages=True, full_tiles=True)]),
    "secure_p16_b64_8k": ((64, 32, 8, 128, 8192, 1, 16, False, True),
                          [CFG(16, 16, 8, 3, 1), CFG(16, 16, 4, 4, 1), CFG(16, 16, 4, 3, 1), CFG(16, 128, 4, 3, 1)]),
    "secure_p64_b64_8k": ((64, 32, 8, 128, 8192, 1, 64, False, True), [CFG(16, 64, 8, 3, 1), CFG(16, 64, 4, 4, 1)]),
    "secure_p128_b64_8k": ((64, 32, 8, 128, 8192, 1, 128, False, True), []),
    "secure_b64_8k": ((64, 32, 8, 128, 8192, 1, 0, False, True), []),
    "secure_p16_b1_64k": ((1, 32, 8, 128, 65536, 1, 16, False, True),
                          [CFG(16, 16, 8, 3, 16), CFG(16, 16, 4, 4, 16), CFG(16, 16, 4, 4, 32)]),
    # v22.5: the layouts still short of their bars after v22.4
    "p16_b1_64k": ((1, 32, 8, 128, 65536, 1, 16, False),
                   [CFG(16, 128, 8, 3, 16), CFG(16, 128, 4, 3, 33), CFG(16, 128, 8, 3, 33), CFG(16, 128, 4, 4, 33),
                    CFG(16, 128, 4, 2, 66), CFG(16, 16, 4, 4, 33, reg_pages=True), CFG(16, 64, 4, 3, 33)]),
    "p64_b1_64k": ((1, 32, 8, 128, 65536, 1, 64, False),
                   [CFG(16, 128, 8, 3, 16), CFG(16, 128, 4, 3, 33), CFG(16, 64, 8, 3, 16),
                    CFG(16, 64, 4, 4, 33), CFG(16, 64, 8, 3, 33)]),
    "secure_p16_b64_8k_b": ((64, 32, 8, 128, 8192, 1, 16, False, True),
                            [CFG(16, 16, 2, 4, 1), CFG(16, 16, 4, 6, 1), CFG(16, 32, 4, 4, 1), CFG(16, 64, 4, 4, 1),
                             CFG(16, 16, 4, 5, 1)]),
    "secure_p128_b64_8k_b": ((64, 32, 8, 128, 8192, 1, 128, False, True),
                             [CFG(16, 128, 8, 4, 1), CFG(16, 128, 4, 3, 1), CFG(16, 128, 4, 4, 1),
                              CFG(16, 64, 8, 3, 1), CFG(16, 64, 4, 4, 1)]),
    "prefill512_8k_p16": ((4, 32, 8, 128, 8192, 512, 16, False),
                          [CFG(128, 128, 8, 3, 1, reg_pages=True), CFG(128, 16, 4, 3, 1),
                           CFG(128, 64, 8, 3, 1, reg_pages=True, full_tiles=True)]),
    "prefill512_8k_p128": ((4, 32, 8, 128, 8192, 512, 128, False),
                           [CFG(128, 128, 8, 3, 1, reg_pages=True)]),
    # v24: FP8 tiles as uint16 pairs; the bf16 cache of each shape beside it, pages, secure mode
    "fp8_b64_8k": ((64, 32, 8, 128, 8192, 1, 0, True), [CFG(16, 256, 8, 3, 1), CFG(16, 128, 8, 4, 1),
                                                         CFG(16, 128, 4, 4, 1)]),
    "fp8w_b64_16k": ((64, 32, 8, 128, 16384, 1, 0, True), [CFG(16, 128, 8, 3, 1), CFG(16, 64, 4, 4, 1),
                                                           CFG(16, 128, 4, 3, 1), CFG(16, 256, 8, 3, 1)]),
    "fp8_b64_8k_p128": ((64, 32, 8, 128, 8192, 1, 128, True), [CFG(16, 128, 8, 3, 1)]),
    "bf16_b64_8k_p128": ((64, 32, 8, 128, 8192, 1, 128, False), []),
    "fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True),
                        [CFG(16, 128, 4, 3, 1), CFG(16, 128, 4, 4, 1), CFG(16, 16, 4, 4, 1, reg_pages=True),
                         CFG(16, 16, 8, 3, 1, reg_pages=True, full_tiles=True)]),
    "bf16_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, False), []),
    "secure_fp8_b64_16k": ((64, 32, 8, 128, 16384, 1, 0, True, True),
                           [CFG(16, 128, 8, 3, 1), CFG(16, 128, 4, 4, 1), CFG(16, 64, 4, 4, 1)]),
    "secure_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True, True), [CFG(16, 16, 4, 4, 1)]),
    "secure_bf16_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, False, True), []),
    "secure_bf16_b64_16k": ((64, 32, 8, 128, 16384, 1, 0, False, True), []),
    "fp8_b1_4k": ((1, 32, 8, 128, 4096, 1, 0, True), [CFG(16, 128, 8, 3, 16)]),
    # v24.5: B1 with FP8 is compute-bound per program (one program per SM at 16 splits): two per SM?
    "fp8_b1_64k_b": ((1, 32, 8, 128, 65536, 1, 0, True),
                     [CFG(16, 128, 4, 4, 33), CFG(16, 64, 4, 4, 33), CFG(16, 128, 8, 3, 33), CFG(16, 64, 4, 4, 16),
                      CFG(16, 128, 4, 3, 24)]),
    "bf16_b1_64k_b": ((1, 32, 8, 128, 65536, 1, 0, False),
                      [CFG(16, 128, 4, 3, 33), CFG(16, 128, 4, 4, 33), CFG(16, 128, 8, 3, 33)]),
    "fp8_b1_4k_b": ((1, 32, 8, 128, 4096, 1, 0, True), [CFG(16, 64, 4, 4, 16), CFG(16, 64, 4, 3, 32)]),
    "fp8_b64_16k_p16_b": ((64, 32, 8, 128, 16384, 1, 16, True), [CFG(16, 64, 4, 4, 1), CFG(16, 64, 8, 3, 1),
                                                                 CFG(16, 32, 4, 4, 1)]),
    "fp8_b64_16k_p16_c": ((64, 32, 8, 128, 16384, 1, 16, True), [CFG(16, 128, 8, 3, 1)]),
    "fp8_b64_16k_p64": ((64, 32, 8, 128, 16384, 1, 64, True), [CFG(16, 128, 8, 3, 1)]),
    "fp8_b64_16k_p1": ((64, 32, 8, 128, 16384, 1, 1, True), [CFG(16, 128, 8, 3, 1)]),
    "fp8_b64_16k_p32": ((64, 32, 8, 128, 16384, 1, 32, True), [CFG(16, 128, 8, 3, 1)]),
    "fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True), []),
    # v57: the secure 16-bit gathers with splits on V by K's offsets, unmasked whole tiles and V zeroed by an AND of
    # loaded positions (the planner's since v57) against v50's form at the same tiles (the candidate), and the fast path
    **{f"v57_{mode}_p{page}_{name}": ((B, 32, 8, 128, cap, 1, page, False, mode == "secure"),
                                      [CFG(16, 64, 4, 3, splits, gather_kv_offsets=False)] if mode == "secure" else [])
       for name, B, cap, page, splits in (("b8_4k", 8, 4096, 16, 4), ("b1_4k", 1, 4096, 16, 16),
                                          ("b1_64k", 1, 65536, 16, 33), ("b1_64k", 1, 65536, 32, 33))
       for mode in ("secure", "fast")},
    # v37: secure FP8 B1 64k page 16, the one secure decode row under 0.9x of fast on the H100 (0.88): the planner's
    # per-key gather runs 4 warps, 2 stages, 33 splits, where the fast form's needed 5 stages (v25.2)
    "secure_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True, True),
                              [CFG(16, 128, 4, 3, 33), CFG(16, 128, 4, 4, 33), CFG(16, 128, 4, 5, 33),
                               CFG(16, 128, 8, 5, 16), CFG(16, 128, 8, 3, 16), CFG(16, 64, 4, 4, 33),
                               CFG(16, 16, 4, 4, 33), CFG(16, 16, 4, 4, 16)]),
    # v37, after the planner took 3 stages there: the other gathers of that form, and v36's 2 stages against it
    "secure_fp8_b1_64k_p16_b": ((1, 32, 8, 128, 65536, 1, 16, True, True), [CFG(16, 128, 4, 2, 33)]),
    "secure_fp8_b1_64k_p64": ((1, 32, 8, 128, 65536, 1, 64, True, True), [CFG(16, 128, 4, 2, 33)]),
    "secure_fp8_b1_64k_p1": ((1, 32, 8, 128, 65536, 1, 1, True, True), [CFG(16, 128, 4, 2, 33)]),
    "secure_fp8_b1_4k_p16": ((1, 32, 8, 128, 4096, 1, 16, True, True), [CFG(16, 128, 4, 2, 16)]),
    "fp8_b1_64k_p16_b": ((1, 32, 8, 128, 65536, 1, 16, True), [CFG(16, 128, 4, 3, 33)]),
    # v37: the fast bf16 gather with splits (B1 64k pages 16/64, 3.7%/3.0% behind contiguous against a 3% bar) with
    # register page loads, whose index is no pipeline stage (the secure FP8 gather's lesson above)
    "bf16_b1_64k_p16_reg": ((1, 32, 8, 128, 65536, 1, 16, False),
                            [CFG(16, 128, 8, 5, 16, reg_pages=True), CFG(16, 128, 8, 4, 16, reg_pages=True),
                             CFG(16, 128, 8, 3, 16, reg_pages=True), CFG(16, 128, 4, 3, 33, reg_pages=True),
                             CFG(16, 128, 4, 2, 33, reg_pages=True), CFG(16, 64, 8, 4, 16, reg_pages=True)]),
    "bf16_b1_64k_p64_reg": ((1, 32, 8, 128, 65536, 1, 64, False),
                            [CFG(16, 128, 8, 5, 16, reg_pages=True), CFG(16, 128, 8, 3, 16, reg_pages=True),
                             CFG(16, 128, 4, 3, 33, reg_pages=True)]),
    "bf16_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, False), []),
    # secure FP8 B64 16k page 16 at one split (0.92x of fast on the H100, 0.58x on the H200) runs the bf16-tuned
    # page-per-tile form (16-key tiles, 2 warps, 4 stages, v22.5): FP8 tiles are half the bytes (written in v37, not run
    # yet: the session's device time ran out)
    "fp8_b64_16k_p16_ref": ((64, 32, 8, 128, 16384, 1, 16, True), []),
    "secure_fp8_b64_16k_p16_b": ((64, 32, 8, 128, 16384, 1, 16, True, True),
                                 [CFG(16, 16, 2, 6, 1), CFG(16, 16, 4, 4, 1), CFG(16, 16, 4, 6, 1), CFG(16, 32, 4, 3, 1),
                                  CFG(16, 64, 4, 3, 1), CFG(16, 128, 4, 3, 1)]),
    "bf16_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, False), []),
    # v46: secure FP8 B64 16k contiguous (0.79-0.81x of fast FP8 on the H200, 1.00 on the H100) at one split: its
    # planner form is 64-key tiles, 4 warps, 3 stages (v24.3); wider tiles and more warps, beside the fast form
    "fp8_b64_16k_ref": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "secure_fp8_b64_16k_c": ((64, 32, 8, 128, 16384, 1, 0, True, True),
                             [CFG(16, 64, 4, 4, 1), CFG(16, 64, 8, 3, 1), CFG(16, 128, 4, 3, 1), CFG(16, 128, 8, 3, 1),
                              CFG(16, 32, 4, 4, 1), CFG(16, 32, 2, 4, 1)]),
    # v46: secure paged decode at one split, pages below 64 keys (page-per-tile 16- or 32-key tiles since v22.5, before
    # the register page loads of v37): 64-key gathers, bf16 and FP8, beside the fast forms
    "bf16_b64_8k_p16_ref": ((64, 32, 8, 128, 8192, 1, 16, False), []),
    "secure_bf16_b64_8k_p16_v46": ((64, 32, 8, 128, 8192, 1, 16, False, True),
                                   [CFG(16, 64, 4, 3, 1), CFG(16, 64, 4, 4, 1), CFG(16, 64, 8, 3, 1),
                                    CFG(16, 32, 4, 4, 1), CFG(16, 128, 4, 3, 1)]),
    "secure_fp8_b64_16k_p16_v46": ((64, 32, 8, 128, 16384, 1, 16, True, True),
                                   [CFG(16, 64, 4, 3, 1), CFG(16, 64, 4, 4, 1), CFG(16, 64, 8, 3, 1),
                                    CFG(16, 64, 2, 4, 1)]),
    "fp8_b64_16k_p32_ref": ((64, 32, 8, 128, 16384, 1, 32, True), []),
    "secure_fp8_b64_16k_p32_v46": ((64, 32, 8, 128, 16384, 1, 32, True, True),
                                   [CFG(16, 64, 4, 3, 1), CFG(16, 128, 4, 3, 1)]),
    "bf16_b64_8k_p32_ref": ((64, 32, 8, 128, 8192, 1, 32, False), []),
    "secure_bf16_b64_8k_p32_v46": ((64, 32, 8, 128, 8192, 1, 32, False, True), [CFG(16, 64, 4, 3, 1)]),
    # v25: paged B1 64k is 10-11% behind contiguous at every tile shape tried (v22.5): the kernel's gather, or
    # where the pages lie? The same configurations on a contiguous cache, and on a paged cache with pages in order
    "b1_64k_ctl": ((1, 32, 8, 128, 65536, 1, 0, False),
                   [CFG(16, 128, 4, 2, 33), CFG(16, 64, 8, 3, 16), CFG(16, 64, 8, 3, 33), CFG(16, 128, 8, 3, 33)]),
    "p16_b1_64k_ordered": ((1, 32, 8, 128, 65536, 1, 16, False, False, True), [CFG(16, 128, 8, 3, 16)]),
    "p64_b1_64k_ordered": ((1, 32, 8, 128, 65536, 1, 64, False, False, True),
                           [CFG(16, 64, 8, 3, 16), CFG(16, 64, 8, 3, 33)]),
    "p16_b64_8k_ordered": ((64, 32, 8, 128, 8192, 1, 16, False, False, True), []),
    # v25.2: the per-key gather's loop is single-buffered below 5 stages (TTGIR: one K/V slot, async_wait num=0:
    # the page index is a load of its own stage ahead of K/V), so each tile waits for its full load latency
    "p16_b1_64k_s": ((1, 32, 8, 128, 65536, 1, 16, False),
                     [CFG(16, 128, 8, 5, 16), CFG(16, 128, 8, 6, 16), CFG(16, 128, 4, 5, 33), CFG(16, 64, 8, 5, 16),
                      CFG(16, 64, 4, 5, 33), CFG(16, 64, 8, 5, 33), CFG(16, 128, 8, 5, 33)]),
    "p64_b1_64k_s": ((1, 32, 8, 128, 65536, 1, 64, False),
                     [CFG(16, 128, 8, 5, 16), CFG(16, 128, 4, 5, 33), CFG(16, 64, 8, 5, 16)]),
    "p16_b64_8k_s": ((64, 32, 8, 128, 8192, 1, 16, False),
                     [CFG(16, 128, 8, 5, 1), CFG(16, 128, 8, 6, 1), CFG(16, 128, 4, 5, 1), CFG(16, 64, 4, 5, 1)]),
    "p1_b64_8k_s": ((64, 32, 8, 128, 8192, 1, 1, False), [CFG(16, 128, 8, 5, 1), CFG(16, 64, 4, 5, 1)]),
    "fp8_b64_16k_p16_s": ((64, 32, 8, 128, 16384, 1, 16, True),
                          [CFG(16, 64, 4, 5, 1), CFG(16, 64, 4, 6, 1), CFG(16, 128, 8, 5, 1), CFG(16, 128, 4, 5, 1),
                           CFG(16, 64, 8, 5, 1)]),
    "fp8_b1_64k_p16_s": ((1, 32, 8, 128, 65536, 1, 16, True),
                         [CFG(16, 128, 8, 5, 16), CFG(16, 128, 4, 5, 33), CFG(16, 64, 4, 5, 33)]),
    # v25.3: programs per SM by split count (264 programs = 2 per SM at 33 splits; 49 splits = 3, 66 = 4)
    "p16_b1_64k_n": ((1, 32, 8, 128, 65536, 1, 16, False),
                     [CFG(16, 128, 4, 2, 49), CFG(16, 64, 4, 2, 49), CFG(16, 64, 4, 2, 66), CFG(16, 64, 4, 2, 82),
                      CFG(16, 64, 4, 5, 49), CFG(16, 128, 4, 5, 49), CFG(16, 64, 2, 2, 66), CFG(16, 64, 2, 5, 66)]),
    "b1_64k_n": ((1, 32, 8, 128, 65536, 1, 0, False),
                 [CFG(16, 128, 4, 2, 49), CFG(16, 64, 4, 3, 49), CFG(16, 64, 4, 3, 66), CFG(16, 128, 4, 3, 49)]),
    "fp8_b1_64k_p16_n": ((1, 32, 8, 128, 65536, 1, 16, True),
                         [CFG(16, 128, 4, 5, 33), CFG(16, 128, 4, 5, 49), CFG(16, 128, 4, 5, 66),
                          CFG(16, 128, 8, 5, 33), CFG(16, 128, 4, 6, 49)]),
    "fp8_b64_16k_p16_n": ((64, 32, 8, 128, 16384, 1, 16, True),
                          [CFG(16, 128, 4, 5, 1), CFG(16, 128, 4, 6, 1), CFG(16, 128, 8, 6, 1), CFG(16, 64, 2, 5, 1)]),
    # v25.4: the planner's FP8 gather (128-key tiles, 4 warps, 5 stages) against its v24 configuration, pages 1/16/32
    "fp8_b64_16k_p16_v25": ((64, 32, 8, 128, 16384, 1, 16, True), [CFG(16, 64, 4, 4, 1)]),
    "fp8_b64_16k_p32_v25": ((64, 32, 8, 128, 16384, 1, 32, True), [CFG(16, 64, 4, 4, 1)]),
    "fp8_b64_16k_p1_v25": ((64, 32, 8, 128, 16384, 1, 1, True), [CFG(16, 64, 4, 4, 1)]),
    "fp8_b1_64k_p16_v25": ((1, 32, 8, 128, 65536, 1, 16, True), [CFG(16, 128, 4, 2, 33)]),
    "fp8_b1_64k_p32_v25": ((1, 32, 8, 128, 65536, 1, 32, True), [CFG(16, 128, 4, 2, 33)]),
    "fp8_b1_64k_p1_v25": ((1, 32, 8, 128, 65536, 1, 1, True), [CFG(16, 128, 4, 2, 33)]),
    # v25.6: V addressed by K's offsets (SAME_KV): the gather's per-key address work once per tile
    "p16_b1_64k_kv": ((1, 32, 8, 128, 65536, 1, 16, False),
                      [CFG(16, 128, 8, 5, 16), CFG(16, 128, 4, 5, 33), CFG(16, 128, 8, 5, 33), CFG(16, 64, 4, 5, 33),
                       CFG(16, 128, 8, 3, 16)]),
    "p64_b1_64k_kv": ((1, 32, 8, 128, 65536, 1, 64, False), [CFG(16, 128, 8, 5, 16), CFG(16, 64, 8, 3, 33)]),
    # v25.8: the planner's bf16 gather with splits (8 warps, 5 stages, one program per SM) against v18.3's
    "bf16_b1_64k_p1_v25": ((1, 32, 8, 128, 65536, 1, 1, False), [CFG(16, 128, 4, 2, 33)]),
    "bf16_b1_64k_p16_v25": ((1, 32, 8, 128, 65536, 1, 16, False), [CFG(16, 128, 4, 2, 33)]),
    "bf16_b1_64k_p32_v25": ((1, 32, 8, 128, 65536, 1, 32, False), [CFG(16, 128, 4, 2, 33)]),
    "bf16_b1_64k_p64_v25": ((1, 32, 8, 128, 65536, 1, 64, False), [CFG(16, 128, 4, 2, 33)]),
    "bf16_b1_4k_p16_v25": ((1, 32, 8, 128, 4096, 1, 16, False), [CFG(16, 128, 4, 2, 16)]),
    # v25.9: FP8 page 64 with splits is a gather at 128-key tiles too (one slot at 2 stages)
    "fp8_b1_64k_p64_v25": ((1, 32, 8, 128, 65536, 1, 64, True), [CFG(16, 128, 4, 5, 33), CFG(16, 64, 4, 4, 33)]),
    "fp8_b1_64k_p128_v25": ((1, 32, 8, 128, 65536, 1, 128, True), []),
    # v32: secure chunked prefill from a paged cache on the Gluon kernel's secure form (the planner's choice) against
    # the secure decode kernel that ran it before (its configuration, forced); the fast path and the contiguous cache
    # beside them
    "v32_fast_prefill512_8k_p16": ((4, 32, 8, 128, 8192, 512, 16, False), []),
    "v32_secure_prefill512_8k_p16": ((4, 32, 8, 128, 8192, 512, 16, False, True), [CFG(64, 128, 8, 3, 1)]),
    "v32_secure_prefill512_8k_p64": ((4, 32, 8, 128, 8192, 512, 64, False, True), [CFG(64, 128, 8, 3, 1)]),
    "v32_fast_prefill512_8k": ((4, 32, 8, 128, 8192, 512, 0, False), []),
    "v32_secure_prefill512_8k": ((4, 32, 8, 128, 8192, 512, 0, False, True), []),
    # v51: the fast bf16 gather with splits (B1 page 16: 7.7% behind contiguous at 64k, 11% at 4k in the suite at
    # 51b220e; bar 3%) on the tiles that made the secure gather 2-9% faster than it (v50: 64 keys, 4 warps, 3 stages,
    # two programs per SM, register page loads), with and without register page loads, beside contiguous (the forms
    # run without them are marked reg_pages=False since reg_pages became the policy there)
    "v51_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, False), []),
    "v51_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, False),
                       [CFG(16, 64, 4, 3, 33, reg_pages=False), CFG(16, 64, 4, 3, 33, reg_pages=True),
                        CFG(16, 64, 4, 4, 33, reg_pages=False),
                        CFG(16, 64, 4, 4, 33, reg_pages=True), CFG(16, 128, 4, 3, 33, reg_pages=True),
                        CFG(16, 64, 8, 4, 16, reg_pages=True)]),
    "v51_b1_64k_p32": ((1, 32, 8, 128, 65536, 1, 32, False),
                       [CFG(16, 64, 4, 3, 33, reg_pages=False), CFG(16, 64, 4, 3, 33, reg_pages=True)]),
    "v51_b1_4k_contig": ((1, 32, 8, 128, 4096, 1, 0, False), []),
    "v51_b1_4k_p16": ((1, 32, 8, 128, 4096, 1, 16, False),
                      [CFG(16, 64, 4, 3, 16, reg_pages=False), CFG(16, 64, 4, 3, 16, reg_pages=True),
                       CFG(16, 64, 4, 3, 32, reg_pages=False),
                       CFG(16, 64, 4, 3, 32, reg_pages=True)]),
    "v51_b64_8k_contig": ((64, 32, 8, 128, 8192, 1, 0, False), []),
    "v51_b64_8k_p16": ((64, 32, 8, 128, 8192, 1, 16, False),
                       [CFG(16, 64, 4, 3, 1, reg_pages=True), CFG(16, 64, 4, 4, 1, reg_pages=True),
                        CFG(16, 128, 4, 3, 1, reg_pages=True)]),
    # v51.2: around the winner of v51 (64-key tiles, 4 warps, 3 stages, register page loads): more programs per SM,
    # pages 1 and 64, the one-split gather at B64, and FP8 (1.51x the bf16 cache at page 16 against a 1.8x bar)
    "v51b_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, False), []),
    "v51b_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, False),
                        [CFG(16, 64, 4, 3, 33, reg_pages=True), CFG(16, 64, 4, 2, 49, reg_pages=True),
                         CFG(16, 32, 4, 4, 49, reg_pages=True), CFG(16, 32, 4, 3, 66, reg_pages=True),
                         CFG(16, 64, 2, 3, 33, reg_pages=True), CFG(16, 64, 8, 3, 33, reg_pages=True)]),
    "v51b_b1_64k_p64": ((1, 32, 8, 128, 65536, 1, 64, False),
                        [CFG(16, 64, 4, 3, 33, reg_pages=True),
                         CFG(16, 64, 4, 3, 33, reg_pages=True, full_tiles=True)]),
    "v51b_b1_64k_p1": ((1, 32, 8, 128, 65536, 1, 1, False), [CFG(16, 64, 4, 3, 33, reg_pages=True)]),
    "v51b_b1_4k_contig": ((1, 32, 8, 128, 4096, 1, 0, False), []),
    "v51b_b1_4k_p16": ((1, 32, 8, 128, 4096, 1, 16, False),
                       [CFG(16, 64, 4, 3, 32, reg_pages=True), CFG(16, 32, 4, 4, 64, reg_pages=True),
                        CFG(16, 64, 4, 2, 32, reg_pages=True)]),
    "v51b_b64_8k_contig": ((64, 32, 8, 128, 8192, 1, 0, False), []),
    "v51b_b64_8k_p16": ((64, 32, 8, 128, 8192, 1, 16, False),
                        [CFG(16, 64, 4, 4, 1, reg_pages=True), CFG(16, 64, 4, 5, 1, reg_pages=True),
                         CFG(16, 64, 8, 4, 1, reg_pages=True), CFG(16, 32, 4, 4, 1, reg_pages=True),
                         CFG(16, 32, 4, 6, 1, reg_pages=True), CFG(16, 128, 8, 4, 1, reg_pages=True)]),
    "v51b_fp8_b64_16k_contig": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v51b_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True),
                             [CFG(16, 64, 4, 4, 1, reg_pages=True), CFG(16, 64, 4, 5, 1, reg_pages=True),
                              CFG(16, 128, 4, 4, 1, reg_pages=True), CFG(16, 128, 4, 5, 1, reg_pages=True),
                              CFG(16, 32, 4, 4, 1, reg_pages=True)]),
    "v51b_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, False), []),
    # v51.3: the one-split page-16 gather at B64 (4.1-4.5% behind contiguous in the suite at 51b220e; v51.2's planner
    # row swung 499-523 us between two calls): register page loads on 32- and 64-key tiles, each twice, interleaved
    "v51c_b64_8k_contig": ((64, 32, 8, 128, 8192, 1, 0, False), []),
    "v51c_b64_8k_p16": ((64, 32, 8, 128, 8192, 1, 16, False),
                        [CFG(16, 32, 4, 4, 1, reg_pages=True), CFG(16, 64, 4, 4, 1, reg_pages=True),
                         CFG(16, 128, 8, 3, 1), CFG(16, 32, 4, 4, 1, reg_pages=True),
                         CFG(16, 64, 4, 4, 1, reg_pages=True), CFG(16, 32, 4, 3, 1, reg_pages=True),
                         CFG(16, 32, 8, 4, 1, reg_pages=True), CFG(16, 128, 8, 3, 1)]),
    "v51c_b64_8k_contig2": ((64, 32, 8, 128, 8192, 1, 0, False), []),
    "v51c_b64_16k_contig": ((64, 32, 8, 128, 16384, 1, 0, False), []),
    "v51c_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, False),
                         [CFG(16, 32, 4, 4, 1, reg_pages=True), CFG(16, 64, 4, 4, 1, reg_pages=True),
                          CFG(16, 128, 8, 3, 1), CFG(16, 32, 4, 4, 1, reg_pages=True),
                          CFG(16, 64, 4, 4, 1, reg_pages=True)]),
    "v51c_b64_8k_p32": ((64, 32, 8, 128, 8192, 1, 32, False),
                        [CFG(16, 32, 4, 4, 1, reg_pages=True), CFG(16, 64, 4, 4, 1, reg_pages=True)]),
    "v51c_b64_8k_p64": ((64, 32, 8, 128, 8192, 1, 64, False),
                        [CFG(16, 64, 4, 4, 1, reg_pages=True), CFG(16, 64, 8, 3, 1, reg_pages=True)]),
    # v51.4: v51.3's fastest one-split page-16 form (32-key tiles, 4 warps, 3 stages, register page loads: 475 us
    # against the planner's 487-488, contiguous 469-470) once more, three times each, interleaved, 8k and 16k
    "v51d_b64_8k_contig": ((64, 32, 8, 128, 8192, 1, 0, False), []),
    "v51d_b64_8k_p16": ((64, 32, 8, 128, 8192, 1, 16, False),
                        [CFG(16, 32, 4, 3, 1, reg_pages=True), CFG(16, 128, 8, 3, 1),
                         CFG(16, 32, 4, 2, 1, reg_pages=True), CFG(16, 32, 4, 3, 1, reg_pages=True),
                         CFG(16, 128, 8, 3, 1), CFG(16, 64, 4, 3, 1, reg_pages=True),
                         CFG(16, 32, 4, 3, 1, reg_pages=True), CFG(16, 128, 8, 3, 1),
                         CFG(16, 32, 2, 3, 1, reg_pages=True)]),
    "v51d_b64_8k_contig2": ((64, 32, 8, 128, 8192, 1, 0, False), []),
    "v51d_b64_16k_contig": ((64, 32, 8, 128, 16384, 1, 0, False), []),
    "v51d_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, False),
                         [CFG(16, 32, 4, 3, 1, reg_pages=True), CFG(16, 128, 8, 3, 1),
                          CFG(16, 32, 4, 3, 1, reg_pages=True), CFG(16, 128, 8, 3, 1),
                          CFG(16, 32, 4, 3, 1, reg_pages=True), CFG(16, 128, 8, 3, 1)]),
    "v51d_b64_8k_p32": ((64, 32, 8, 128, 8192, 1, 32, False),
                        [CFG(16, 32, 4, 3, 1, reg_pages=True), CFG(16, 128, 8, 3, 1),
                         CFG(16, 32, 4, 3, 1, reg_pages=True)]),
    "v51d_b64_8k_p1": ((64, 32, 8, 128, 8192, 1, 1, False), [CFG(16, 32, 4, 3, 1, reg_pages=True)]),
    # v51.5: B1 64k pages 16 and 64 after v51 (3.6% and 4.5% behind contiguous in the suite): page-per-tile 16-key
    # tiles (unmasked), more programs per SM; secure page 64 with splits on v50's 64-key tiles (the hoisted loop)
    "v51e_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, False), []),
    "v51e_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, False),
                        [CFG(16, 16, 4, 4, 33, reg_pages=True), CFG(16, 16, 4, 4, 66, reg_pages=True),
                         CFG(16, 16, 2, 4, 66, reg_pages=True), CFG(16, 16, 2, 6, 66, reg_pages=True),
                         CFG(16, 32, 4, 3, 33, reg_pages=True), CFG(16, 64, 4, 3, 33, reg_pages=True)]),
    "v51e_b1_64k_p64": ((1, 32, 8, 128, 65536, 1, 64, False),
                        [CFG(16, 64, 4, 4, 33, reg_pages=True), CFG(16, 64, 8, 3, 16, reg_pages=True),
                         CFG(16, 64, 8, 4, 16, reg_pages=True), CFG(16, 64, 4, 3, 33, reg_pages=True)]),
    "v51e_secure_b1_64k_p64": ((1, 32, 8, 128, 65536, 1, 64, False, True), [CFG(16, 128, 4, 2, 33)]),
    "v51e_b1_64k_contig2": ((1, 32, 8, 128, 65536, 1, 0, False), []),
    # v51.6: secure FP8 decode at one split, contiguous (0.86-0.89 of fast in the suites at 0f7910b/08e3043; bar 0.9):
    # the hoisted loop (v48 measured it at the planner's tiles only, 0.87-0.88) at wider tiles, more stages and warps
    "v51f_fp8_b64_16k": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v51f_secure_fp8_b64_16k": ((64, 32, 8, 128, 16384, 1, 0, True, True),
                                [CFG(16, 64, 4, 3, 1, hoisted=True), CFG(16, 64, 4, 4, 1, hoisted=True),
                                 CFG(16, 128, 4, 3, 1, hoisted=True), CFG(16, 128, 8, 3, 1, hoisted=True),
                                 CFG(16, 64, 8, 3, 1, hoisted=True), CFG(16, 64, 4, 3, 1),
                                 CFG(16, 128, 4, 4, 1, hoisted=True)]),
    "v51f_fp8_b64_16k_2": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    # v51.7: the planner's new secure FP8 one-split form (hoisted, 128-key tiles, 4 warps, 4 stages) against the form
    # before it (128 keys, 3 stages, not hoisted), interleaved with the fast form (whose time swung 524-572 in v51.6)
    "v51g_fp8_b64_16k": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v51g_secure_fp8_b64_16k": ((64, 32, 8, 128, 16384, 1, 0, True, True),
                                [CFG(16, 128, 4, 3, 1, hoisted=False), CFG(16, 128, 4, 4, 1)]),
    "v51g_fp8_b64_16k_2": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v51g_secure_fp8_b64_16k_2": ((64, 32, 8, 128, 16384, 1, 0, True, True), [CFG(16, 128, 4, 3, 1, hoisted=False)]),
    "v51g_fp8_b64_16k_3": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    # v52: the fast FP8 page gathers (B64 16k page 16 1.69x the bf16 cache against a 1.8x bar, 11% behind the FP8
    # contiguous cache) in the loop without masks (FULL_TILES) with register page loads: 932 -> 798 instructions per
    # 128-key tile (sm_90a, CPU compile; contiguous 2 x 382 per 64 keys), interleaved with the contiguous cache
    "v52_fp8_b64_16k_contig": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v52_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True),
                            [CFG(16, 128, 4, 5, 1, full_tiles=True, reg_pages=True),
                             CFG(16, 128, 4, 4, 1, full_tiles=True, reg_pages=True),
                             CFG(16, 128, 4, 3, 1, full_tiles=True, reg_pages=True),
                             CFG(16, 64, 4, 4, 1, full_tiles=True, reg_pages=True),
                             CFG(16, 128, 4, 5, 1, full_tiles=True, reg_pages=False),
                             CFG(16, 128, 8, 3, 1, full_tiles=True, reg_pages=True),
                             CFG(16, 128, 4, 5, 1)]),
    "v52_fp8_b64_16k_contig2": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v52_secure_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True, True), []),
    "v52_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, False),
                        [CFG(16, 32, 4, 3, 1, full_tiles=True, reg_pages=True)]),
    "v52_b64_16k_contig": ((64, 32, 8, 128, 16384, 1, 0, False), []),
    "v52_fp8_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, True), []),
    "v52_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True),
                           [CFG(16, 128, 4, 5, 33, full_tiles=True, reg_pages=True),
                            CFG(16, 128, 4, 4, 33, full_tiles=True, reg_pages=True),
                            CFG(16, 128, 4, 3, 33, full_tiles=True, reg_pages=True),
                            CFG(16, 64, 4, 4, 33, full_tiles=True, reg_pages=True),
                            CFG(16, 128, 8, 3, 16, full_tiles=True, reg_pages=True)]),
    "v52_fp8_b1_64k_contig_w4": ((1, 32, 8, 128, 65536, 1, 0, True),
                                 [CFG(16, 128, 4, 4, 33), CFG(16, 128, 4, 3, 33), CFG(16, 64, 4, 4, 33),
                                  CFG(16, 128, 8, 4, 16), CFG(16, 256, 8, 3, 16)]),
    "v52_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, False), []),
    "v52_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, False),
                       [CFG(16, 64, 4, 3, 33, full_tiles=True, reg_pages=True)]),
    "v52_fp8_b64_16k_p16_2": ((64, 32, 8, 128, 16384, 1, 16, True),
                              [CFG(16, 128, 4, 5, 1, full_tiles=True, reg_pages=True),
                               CFG(16, 128, 4, 4, 1, full_tiles=True, reg_pages=True)]),
    "v52_fp8_b64_16k_contig3": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    # v52.2: around v52's winners: FP8 B1 contiguous on 4 warps, 3 stages, two programs per SM (41.0 us against the
    # planner's 48.3), FP8 gathers without masks on register page loads (B64 page 16 561-576 against 594-626, B1 43.3
    # against 45.5); pages 1 and 32, 4k, interleaved with the contiguous cache
    "v52b_fp8_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, True),
                               [CFG(16, 128, 4, 3, 33), CFG(16, 128, 4, 2, 33), CFG(16, 128, 4, 3, 66),
                                CFG(16, 64, 4, 3, 49), CFG(16, 64, 4, 4, 66), CFG(16, 128, 2, 3, 33),
                                CFG(16, 128, 4, 3, 33)]),
    "v52b_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True),
                            [CFG(16, 128, 4, 3, 33, full_tiles=True, reg_pages=True),
                             CFG(16, 128, 4, 3, 33, reg_pages=True), CFG(16, 128, 4, 2, 33, full_tiles=True, reg_pages=True),
                             CFG(16, 64, 4, 3, 49, full_tiles=True, reg_pages=True),
                             CFG(16, 128, 4, 3, 66, full_tiles=True, reg_pages=True),
                             CFG(16, 128, 4, 3, 33, full_tiles=True, reg_pages=True)]),
    "v52b_fp8_b1_64k_p1": ((1, 32, 8, 128, 65536, 1, 1, True),
                           [CFG(16, 128, 4, 3, 33, full_tiles=True, reg_pages=True)]),
    "v52b_fp8_b1_64k_p32": ((1, 32, 8, 128, 65536, 1, 32, True),
                            [CFG(16, 128, 4, 3, 33, full_tiles=True, reg_pages=True)]),
    "v52b_fp8_b1_64k_p64": ((1, 32, 8, 128, 65536, 1, 64, True),
                            [CFG(16, 128, 4, 3, 33, full_tiles=True, reg_pages=True),
                             CFG(16, 64, 4, 3, 33, reg_pages=True)]),
    "v52b_fp8_b1_4k_contig": ((1, 32, 8, 128, 4096, 1, 0, True),
                              [CFG(16, 128, 4, 3, 16), CFG(16, 64, 4, 3, 32), CFG(16, 128, 4, 3, 32)]),
    "v52b_fp8_b1_4k_p16": ((1, 32, 8, 128, 4096, 1, 16, True),
                           [CFG(16, 128, 4, 3, 16, full_tiles=True, reg_pages=True),
                            CFG(16, 64, 4, 3, 32, full_tiles=True, reg_pages=True)]),
    "v52b_fp8_b64_16k_contig": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v52b_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True),
                             [CFG(16, 128, 4, 4, 1, full_tiles=True, reg_pages=True),
                              CFG(16, 64, 4, 4, 1, full_tiles=True, reg_pages=True),
                              CFG(16, 64, 4, 3, 1, full_tiles=True, reg_pages=True),
                              CFG(16, 64, 4, 5, 1, full_tiles=True, reg_pages=True),
                              CFG(16, 32, 4, 4, 1, full_tiles=True, reg_pages=True)]),
    "v52b_fp8_b64_16k_contig2": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v52b_fp8_b64_16k_p16_2": ((64, 32, 8, 128, 16384, 1, 16, True),
                               [CFG(16, 128, 4, 4, 1, full_tiles=True, reg_pages=True),
                                CFG(16, 64, 4, 4, 1, full_tiles=True, reg_pages=True)]),
    "v52b_fp8_b64_16k_contig3": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v52b_fp8_b64_16k_p1": ((64, 32, 8, 128, 16384, 1, 1, True),
                            [CFG(16, 128, 4, 4, 1, full_tiles=True, reg_pages=True),
                             CFG(16, 64, 4, 4, 1, full_tiles=True, reg_pages=True)]),
    "v52b_fp8_b64_16k_p32": ((64, 32, 8, 128, 16384, 1, 32, True),
                             [CFG(16, 128, 4, 4, 1, full_tiles=True, reg_pages=True),
                              CFG(16, 64, 4, 4, 1, full_tiles=True, reg_pages=True)]),
    # v52.3: v52.2's candidates interleaved replay by replay (--only interleaved): the B64 rows drifted 520 -> 565 us
    # within a run, which left the page-16 gain between 1% and 6%
    "v52c_fp8_b64_16k_contig": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v52c_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True),
                             [CFG(16, 128, 4, 4, 1, full_tiles=True, reg_pages=True),
                              CFG(16, 64, 4, 4, 1, full_tiles=True, reg_pages=True),
                              CFG(16, 64, 4, 3, 1, full_tiles=True, reg_pages=True)]),
    "v52c_fp8_b64_16k_p1": ((64, 32, 8, 128, 16384, 1, 1, True),
                            [CFG(16, 128, 4, 4, 1, full_tiles=True, reg_pages=True),
                             CFG(16, 64, 4, 4, 1, full_tiles=True, reg_pages=True)]),
    "v52c_fp8_b64_16k_p32": ((64, 32, 8, 128, 16384, 1, 32, True),
                             [CFG(16, 128, 4, 4, 1, full_tiles=True, reg_pages=True),
                              CFG(16, 64, 4, 4, 1, full_tiles=True, reg_pages=True)]),
    "v52c_b64_16k_contig": ((64, 32, 8, 128, 16384, 1, 0, False), []),
    "v52c_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, False), []),
    "v52c_fp8_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, True),
                               [CFG(16, 128, 4, 3, 33), CFG(16, 64, 4, 3, 49)]),
    "v52c_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True),
                            [CFG(16, 128, 4, 3, 33, full_tiles=True, reg_pages=True),
                             CFG(16, 64, 4, 3, 49, full_tiles=True, reg_pages=True)]),
    "v52c_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, False), []),
    "v52c_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, False), []),
    "v52c_fp8_b1_4k_contig": ((1, 32, 8, 128, 4096, 1, 0, True), [CFG(16, 128, 4, 3, 16)]),
    "v52c_fp8_b1_4k_p16": ((1, 32, 8, 128, 4096, 1, 16, True),
                           [CFG(16, 128, 4, 3, 16, full_tiles=True, reg_pages=True),
                            CFG(16, 128, 4, 5, 16, full_tiles=True, reg_pages=True)]),
    # v52.4: the planner's v52 forms against the forms before them (given explicitly), interleaved (--only
    # interleaved), with the bf16 cache beside them; page 128 with splits (a page per tile) not measured before
    "v52d_fp8_b64_16k_contig": ((64, 32, 8, 128, 16384, 1, 0, True), []),
    "v52d_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True),
                             [CFG(16, 128, 4, 5, 1, full_tiles=False, reg_pages=False)]),
    "v52d_fp8_b64_16k_p1": ((64, 32, 8, 128, 16384, 1, 1, True),
                            [CFG(16, 128, 4, 5, 1, full_tiles=False, reg_pages=False)]),
    "v52d_fp8_b64_16k_p32": ((64, 32, 8, 128, 16384, 1, 32, True),
                             [CFG(16, 128, 4, 5, 1, full_tiles=False, reg_pages=False)]),
    "v52d_b64_16k_contig": ((64, 32, 8, 128, 16384, 1, 0, False), []),
    "v52d_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, False), []),
    "v52d_fp8_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, True), [CFG(16, 128, 8, 3, 16)]),
    "v52d_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True),
                            [CFG(16, 128, 4, 5, 33, full_tiles=False, reg_pages=False)]),
    "v52d_fp8_b1_64k_p1": ((1, 32, 8, 128, 65536, 1, 1, True),
                           [CFG(16, 128, 4, 5, 33, full_tiles=False, reg_pages=False)]),
    "v52d_fp8_b1_64k_p64": ((1, 32, 8, 128, 65536, 1, 64, True),
                            [CFG(16, 128, 4, 5, 33, full_tiles=False, reg_pages=False)]),
    "v52d_fp8_b1_64k_p128": ((1, 32, 8, 128, 65536, 1, 128, True), [CFG(16, 128, 8, 3, 16)]),
    "v52d_b1_64k_contig": ((1, 32, 8, 128, 65536, 1, 0, False), []),
    "v52d_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, False), []),
    "v52d_b1_64k_p128": ((1, 32, 8, 128, 65536, 1, 128, False), []),
    "v52d_fp8_b1_4k_contig": ((1, 32, 8, 128, 4096, 1, 0, True), [CFG(16, 128, 8, 3, 16)]),
    "v52d_fp8_b8_16k_contig": ((8, 32, 8, 128, 16384, 1, 0, True), [CFG(16, 128, 8, 3, 2)]),
    "v52d_fp8_b8_16k_p16": ((8, 32, 8, 128, 16384, 1, 16, True),
                            [CFG(16, 128, 4, 5, 4, full_tiles=False, reg_pages=False)]),
    # v52.5: secure FP8 page gathers (0.72 of v52's fast form at B64 16k page 16 in the suite at d9e8e20): V addressed
    # by K's per-key offsets (658 -> 603 instructions per 64-key tile) and copies without masks in whole tiles (586),
    # interleaved with the fast form
    "v52e_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True), []),
    "v52e_secure_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True, True),
                                    [CFG(16, 64, 4, 3, 1, gather_kv_offsets=True),
                                     CFG(16, 64, 4, 3, 1, gather_kv_offsets=True, whole_tiles=True),
                                     CFG(16, 64, 4, 4, 1, gather_kv_offsets=True, whole_tiles=True),
                                     CFG(16, 64, 4, 4, 1), CFG(16, 128, 4, 3, 1, gather_kv_offsets=True, whole_tiles=True)]),
    "v52e_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True), []),
    "v52e_secure_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True, True),
                                   [CFG(16, 128, 4, 3, 33, gather_kv_offsets=True),
                                    CFG(16, 128, 4, 3, 33, gather_kv_offsets=True, whole_tiles=True),
                                    CFG(16, 64, 4, 3, 33, gather_kv_offsets=True, whole_tiles=True)]),
    # v52.6: v52.5's secure FP8 gather (V by K's offsets, unmasked copies) with V's select from loaded tensors as an
    # AND (_keep_rows, as the hoisted loop has it): the shared-memory round trip of V's tile gone (STS 14 -> 6 per
    # 64-key tile; with splits 1,126 -> 986 instructions per 128-key tile)
    "v52f_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True), []),
    "v52f_secure_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True, True),
                                    [CFG(16, 64, 4, 3, 1, gather_kv_offsets=True, whole_tiles=True),
                                     CFG(16, 64, 4, 3, 1, **V52_GATHER),
                                     CFG(16, 64, 4, 4, 1, **V52_GATHER),
                                     CFG(16, 128, 4, 3, 1, **V52_GATHER),
                                     CFG(16, 32, 4, 3, 1, **V52_GATHER)]),
    "v52f_fp8_b64_16k_p32": ((64, 32, 8, 128, 16384, 1, 32, True), []),
    "v52f_secure_fp8_b64_16k_p32": ((64, 32, 8, 128, 16384, 1, 32, True, True),
                                    [CFG(16, 64, 4, 3, 1, **V52_GATHER)]),
    "v52f_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True), []),
    "v52f_secure_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True, True),
                                   [CFG(16, 128, 4, 3, 33, gather_kv_offsets=True, whole_tiles=True),
                                    CFG(16, 128, 4, 3, 33, **V52_GATHER),
                                    CFG(16, 64, 4, 3, 33, **V52_GATHER),
                                    CFG(16, 128, 4, 4, 33, **V52_GATHER)]),
    "v52f_fp8_b1_64k_p64": ((1, 32, 8, 128, 65536, 1, 64, True), []),
    "v52f_secure_fp8_b1_64k_p64": ((1, 32, 8, 128, 65536, 1, 64, True, True),
                                   [CFG(16, 128, 4, 3, 33, **V52_GATHER)]),
    "v52f_fp8_b1_4k_p16": ((1, 32, 8, 128, 4096, 1, 16, True), []),
    "v52f_secure_fp8_b1_4k_p16": ((1, 32, 8, 128, 4096, 1, 16, True, True),
                                  [CFG(16, 128, 4, 3, 16, **V52_GATHER)]),
    # v52.7: around v52.6's winner (128-key tiles, 4 warps, 3 stages, V by K's offsets, unmasked copies, V's select
    # from loaded tensors as an AND): B64 0.86 of fast at page 16, B1 64k 0.87
    "v52g_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True), []),
    "v52g_secure_fp8_b64_16k_p16": ((64, 32, 8, 128, 16384, 1, 16, True, True),
                                    [CFG(16, 128, 4, 3, 1, **V52_GATHER),
                                     CFG(16, 128, 4, 4, 1, **V52_GATHER),
                                     CFG(16, 128, 8, 3, 1, **V52_GATHER),
                                     CFG(16, 128, 4, 2, 1, **V52_GATHER),
                                     CFG(16, 256, 8, 3, 1, **V52_GATHER)]),
    "v52g_fp8_b64_16k_p32": ((64, 32, 8, 128, 16384, 1, 32, True), []),
    "v52g_secure_fp8_b64_16k_p32": ((64, 32, 8, 128, 16384, 1, 32, True, True),
                                    [CFG(16, 128, 4, 3, 1, **V52_GATHER)]),
    "v52g_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True), []),
    "v52g_secure_fp8_b1_64k_p16": ((1, 32, 8, 128, 65536, 1, 16, True, True),
                                   [CFG(16, 128, 4, 3, 33, **V52_GATHER),
                                    CFG(16, 128, 8, 3, 16, **V52_GATHER),
                                    CFG(16, 128, 4, 3, 33, **V52_GATHER, seen_per_key=True)]),
    "b1_4k": ((1, 32, 8, 128, 4096, 1, 0, False),
              [CFG(16, 128, 8, 3, 8), CFG(16, 64, 4, 3, 16), CFG(16, 64, 4, 2, 32), CFG(16, 128, 4, 2, 16),
               CFG(16, 32, 4, 2, 32), CFG(16, 64, 8, 3, 16), CFG(16, 128, 8, 3, 4)]),
}


def configs(dev, names) -> list:
    gen = torch.Generator(device=dev).manual_seed(1234)
    rows = []
    for name, (shape, cands) in CONFIG_CASES.items():
        if name not in names:
            continue
        B, Hq, Hkv, D, cap, Sq, page, fp8, *rest = shape
        secure = bool(rest and rest[0])
        ordered = len(rest) > 1 and rest[1]
        q, kc, vc, kw = _make(B, Hq, Hkv, D, cap, Sq, page, fp8, gen, dev, ordered=ordered)
        kv_bytes = B * cap * Hkv * D * 2 * (1 if fp8 else 2)
        base = None
        for cfg in [None] + cands:
            try:
                plan, fn = _planned(q, kc, vc, kw, cfg, secure)
                us = _graph_us(fn)
                o = fn()[0]
                if base is None:
                    base = o.float()
                err = ((o.float() - base).norm() / base.norm()).item()
                label = "gluon prefill route (plan.prefill)" if plan.prefill is not None else str(plan.config)
                rows.append(dict(case=name, cfg=label, auto=cfg is None, us=us,
                                 tbs=kv_bytes / us / 1e6, vs_auto_err=err))  # bytes/us/1e6 = TB/s
            except Exception as e:  # a config that does not compile or fit: say so, go on
                rows.append(dict(case=name, cfg=str(cfg), auto=cfg is None, error=f"{type(e).__name__}: {e}"[:300]))
            print(json.dumps(rows[-1]), flush=True)
        del q, kc, vc
        torch.cuda.empty_cache()
    return rows


SAME_KV_CASES = ("b64_8k", "b64_8k_p16", "bf16_b64_16k_p16", "bf16_b1_64k", "b1_64k_p16", "fp8w_b64_16k",
                 "fp8_b64_16k_p16", "fp8_b1_64k_p16", "prefill512_8k")


def same_kv(dev, rounds=2) -> list:
    """v25.6: the planner's configuration with V addressed by K's offsets (``SAME_KV``, the shipped form) against V's
    own address arithmetic (the constexpr forced off), interleaved ``rounds`` times per case."""
    from ...launch import triton_decode as LD
    build = LD.build_split

    def without(*a, **k):
        fn, grid, args, cx = build(*a, **k)
        return fn, grid, args, dict(cx, SAME_KV=False)

    gen = torch.Generator(device=dev).manual_seed(99)
    rows = []
    for name in SAME_KV_CASES:
        B, Hq, Hkv, D, cap, Sq, page, fp8, *_ = CONFIG_CASES[name][0]
        q, kc, vc, kw = _make(B, Hq, Hkv, D, cap, Sq, page, fp8, gen, dev)
        fns = {}
        for variant in ("same_kv", "own_v"):
            LD.build_split = build if variant == "same_kv" else without
            import flashcore.plan.decode as PD
            PD.build_split = LD.build_split
            try:
                fns[variant] = _planned(q, kc, vc, kw, None)[1]
            finally:
                LD.build_split = PD.build_split = build
        a, b = fns["same_kv"]()[0].float(), fns["own_v"]()[0].float()
        err = ((a - b).norm() / b.norm()).item()
        for r in range(rounds):
            for variant, fn in fns.items():
                rows.append(dict(case=name, variant=variant, round=r, us=_graph_us(fn), vs_own_v_err=err))
                print(json.dumps(rows[-1]), flush=True)
        del q, kc, vc, fns
        torch.cuda.empty_cache()
    return rows


COMBINE_CASES = {
    # name: (B, Hq, Hkv, D, cap, Sq, page, fp8): every one runs with splits (the planner's), so with a combine step
    "b1_4k": (1, 32, 8, 128, 4096, 1, 0, False),
    "b1_4k_page16": (1, 32, 8, 128, 4096, 1, 16, False),
    "b1_4k_fp8": (1, 32, 8, 128, 4096, 1, 0, True),
    "b1_16k": (1, 32, 8, 128, 16384, 1, 0, False),
    "b1_64k": (1, 32, 8, 128, 65536, 1, 0, False),
    "b1_64k_page16": (1, 32, 8, 128, 65536, 1, 16, False),
    "b1_64k_fp8": (1, 32, 8, 128, 65536, 1, 0, True),
    "b4_8k_sq4": (4, 32, 8, 128, 8192, 4, 0, False),
    "b8_8k": (8, 32, 8, 128, 8192, 1, 0, False),
}


def _pdl_off():
    from unittest import mock

    from ...plan import decode as PD

    return mock.patch.object(PD, "combine_pdl", lambda device: False)


def combine(dev, rounds=2, variants=None) -> list:
    """v27: the combine step (one warp per row, all splits' loads at once) launched as a programmatic dependent of
    the split step (``pdl``, the planner's) and as a plain launch (``no_pdl``), per shape, interleaved; timed as
    the bench harness does (cold L2: a 256 MB flush before each call, CUDA events; ``cold_us``) and as a CUDA-graph
    replay (warm L2, ``graph_us``). SDPA (dense, ``enable_gqa``) on the same problem, cold, for reference.
    ``variants``: name -> context manager factory (default ``pdl``/``no_pdl``); outputs compared to the first."""
    from ..timing import Timer

    variants = variants or {"pdl": contextlib.nullcontext, "no_pdl": _pdl_off}
    timer, rows, gen = Timer(dev), [], torch.Generator(device=dev)
    for name, (B, Hq, Hkv, D, cap, Sq, page, fp8) in COMBINE_CASES.items():
        gen.manual_seed(27)
        q, kc, vc, kw = _make(B, Hq, Hkv, D, cap, Sq, page, fp8, gen, dev)
        fns, outs, splits = {}, {}, None
        for v, ctx in variants.items():
            with ctx():
                plan, fn = _planned(q, kc, vc, kw, None)
                outs[v] = fn()[0].float().clone()
            fns[v], splits = fn, plan.config.num_splits
        first = next(iter(variants))
        sdpa_us = None
        if not fp8 and not page:
            qd, kd, vd = q.transpose(1, 2).contiguous(), kc.transpose(1, 2), vc.transpose(1, 2)
            sdpa = lambda: F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True)  # noqa: E731
            sdpa_us = 1e3 * statistics.median(timer.measure([sdpa], flush=True, rep_ms=50))
        for r in range(rounds):
            for v, fn in fns.items():
                cold = 1e3 * statistics.median(timer.measure([fn], flush=True, rep_ms=50))
                rows.append(dict(case=name, variant=v, round=r, splits=splits, cold_us=cold, graph_us=_graph_us(fn),
                                 sdpa_cold_us=sdpa_us, vs_first_err=_rel(outs[v], outs[first])))
                print(f"{name:16s} {v:8s} round {r}: cold {cold:7.1f} us  graph {rows[-1]['graph_us']:7.1f} us"
                      f"  splits {splits}  sdpa {sdpa_us or float('nan'):6.1f}", flush=True)
    return rows


def _loop_us(fn, n=200) -> float:
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def host(dev) -> list:
    """A B1 decode step against 2k cached tokens (32/8 heads, D 128), the way transformers calls it."""
    B, Hq, Hkv, D, S0 = 1, 32, 8, 128, 2048
    n = 200
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    big_k = torch.randn(B, Hkv, S0 + n + 1, D, device=dev, dtype=torch.bfloat16)
    big_v = torch.randn_like(big_k)
    qv = q.transpose(1, 2)
    rows = []
    fixed_k, fixed_v = big_k[:, :, :S0].contiguous(), big_v[:, :, :S0].contiguous()

    def same():
        return flashcore.attention_with_kvcache(qv, fixed_k.transpose(1, 2), fixed_v.transpose(1, 2),
                                                cache_seqlens=S0, validate=False)

    rows.append(dict(what="flashcore, same cache (plan hit), int cache_seqlens", us=_loop_us(same, n)))
    lens = torch.full((B,), S0, dtype=torch.int32, device=dev)

    def same_t():
        return flashcore.attention_with_kvcache(qv, fixed_k.transpose(1, 2), fixed_v.transpose(1, 2),
                                                cache_seqlens=lens, validate=False)

    rows.append(dict(what="flashcore, same cache (plan hit), tensor cache_seqlens", us=_loop_us(same_t, n)))
    # a growing cache: a fresh tensor one token longer per call (transformers' torch.cat), viewed [B, S, H, D]
    grown = [(big_k[:, :, :S0 + i].contiguous(), big_v[:, :, :S0 + i].contiguous()) for i in range(1, n + 2)]
    for label, fn_of in (
        ("flashcore, a cache one token longer per call (new plan per call today)",
         lambda k, v: flashcore.attention_with_kvcache(qv, k.transpose(1, 2), v.transpose(1, 2),
                                                       cache_seqlens=k.shape[2], validate=False)),
        ("sdpa, the same growing cache",
         lambda k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
    ):
        it = iter(grown)
        fn_of(*next(it))
        torch.cuda.synchronize()
        t = time.perf_counter()
        for k, v in it:
            fn_of(k, v)
        torch.cuda.synchronize()
        rows.append(dict(what=label, us=(time.perf_counter() - t) / n * 1e6))
    sd = lambda: F.scaled_dot_product_attention(q, fixed_k, fixed_v, enable_gqa=True)  # noqa: E731
    rows.append(dict(what="sdpa, same cache", us=_loop_us(sd, n)))
    for r in rows:
        print(f"{r['us']:9.1f} us  {r['what']}", flush=True)
    return rows


def hostprof(dev) -> dict:
    """cProfile of 300 calls each: the same cache (plan hit) and a growing cache (a new plan per call)."""
    import cProfile
    import io
    import pstats

    B, Hq, Hkv, D, S0, n = 1, 32, 8, 128, 2048, 300
    qv = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
    big_k = torch.randn(B, Hkv, S0 + n + 1, D, device=dev, dtype=torch.bfloat16)
    big_v = torch.randn_like(big_k)
    grown = [(big_k[:, :, :S0 + i].contiguous(), big_v[:, :, :S0 + i].contiguous()) for i in range(n + 1)]
    res = {}
    for label, pick in (("same", lambda i: grown[0]), ("growing", lambda i: grown[i + 1])):
        k, v = grown[0]
        flashcore.attention_with_kvcache(qv, k.transpose(1, 2), v.transpose(1, 2), cache_seqlens=S0, validate=False)
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for i in range(n):
            k, v = pick(i)
            flashcore.attention_with_kvcache(qv, k.transpose(1, 2), v.transpose(1, 2), cache_seqlens=k.shape[2],
                                             validate=False)
        pr.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(25)
        res[label] = buf.getvalue()
        print(label, buf.getvalue()[:6000], flush=True)
    return res


def hostparts(dev) -> dict:
    """Host time of the pieces of one plan-hit call (B1 32/8 D128, 2k cache), each timed alone over 2000 calls
    while the GPU is kept busy (``torch.cuda._sleep``), so no piece waits for the GPU."""
    from ...ops import KV_OPTIONAL, lengths_tensor
    from ...plan.cache import PLANS
    from ...problem import kvcache_key

    B, Hq, Hkv, D, S0 = 1, 32, 8, 128, 2048
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S0, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(B, Hkv, S0, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    lens = torch.full((B,), S0, dtype=torch.int32, device=dev)
    opt = {n: None for n in KV_OPTIONAL}
    flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, validate=False)
    flags = (None, True, None, 0, False, False, False)
    key = kvcache_key("auto", q, k, v, tuple(opt[n] for n in KV_OPTIONAL) + (lens,), None, flags=flags)
    plan = PLANS.get(key)
    t = dict(opt, cache_seqlens=lens)
    dummy = lens
    ws = [torch.empty(shape, device=dev) for _, shape in plan.workspace] or [lens, lens]  # part_o, part_lse
    out = torch.empty_like(q)
    pieces = {
        "whole call (tensor cache_seqlens)": lambda: flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens,
                                                                                    validate=False),
        "whole call (int cache_seqlens)": lambda: flashcore.attention_with_kvcache(q, k, v, cache_seqlens=S0,
                                                                                 validate=False),
        "lengths_tensor (int, shared)": lambda: lengths_tensor(S0, B, q.device, secure=False),
        "kvcache_key": lambda: kvcache_key("auto", q, k, v, tuple(opt[n] for n in KV_OPTIONAL) + (lens,), None,
                                           flags=flags),
        "plan(...) (allocations + launches)": lambda: plan(q, k, v, t, None),
        "torch.empty (out)": lambda: torch.empty(q.shape, dtype=q.dtype, device=dev),
        "split launch alone": lambda: plan.split.run((q, k, v, out, dummy, ws[0], ws[1], dummy, dummy, dummy, dummy,
                                                      dummy, dummy, dummy), dev),
        "sdpa (same cache)": lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                     v.transpose(1, 2), enable_gqa=True),
        # v28.2's control: the workspace split into its views on every call, as before
        "plan(...), workspace views made per call": (lambda: plan(q, k, v, t, None), _uncached_workspace_views),
    }
    res = {}
    for name, fn in pieces.items():
        fn, ctx = fn if isinstance(fn, tuple) else (fn, contextlib.nullcontext)
        with ctx():
            fn()
            torch.cuda.synchronize()
            per = []
            for _ in range(5):
                torch.cuda._sleep(int(3e8))
                t0 = time.perf_counter()
                for _ in range(400):
                    fn()
                per.append((time.perf_counter() - t0) / 400 * 1e6)
                torch.cuda.synchronize()
        res[name] = sorted(per)[2]
        print(f"{res[name]:8.1f} us  {name}", flush=True)
    return res


def _uncached_workspace_views():
    """The workspace as before v28.2: one cached flat buffer per size, split into its views on every call."""
    from unittest import mock

    from ...plan import decode as PD

    flats = {}

    def views(shapes, device):
        import math

        sizes = [math.prod(s) for _, s in shapes]
        key = (sum(sizes), device.index, PD.current_stream(device))
        flat = flats.get(key)
        if flat is None:
            flat = flats[key] = torch.empty(sum(sizes), dtype=torch.float32, device=device)
        return {name: part.view(s) for (name, s), part in zip(shapes, flat.split(sizes))}

    return mock.patch.object(PD, "workspace_views", views)


def interleaved(dev, names, rounds: int = 60, target_ms: float = 2.0) -> list:
    """v52.3: every candidate of the cases ``names`` (the planner's first) captured as a CUDA graph of as many calls as
    take ~``target_ms``, then the graphs replayed one at a time in a fresh random order each round, each replay timed
    by CUDA events: drift in the GPU's clocks over the run (v52: the same FP8 contiguous row 521 then 550 us a minute
    later) falls on every candidate alike. Reports each candidate's median microseconds per call."""
    import random
    gen = torch.Generator(device=dev).manual_seed(4321)
    entries, keep = [], []
    for name in names:
        shape, cands = CONFIG_CASES[name]
        B, Hq, Hkv, D, cap, Sq, page, fp8, *rest = shape
        secure = bool(rest and rest[0])
        q, kc, vc, kw = _make(B, Hq, Hkv, D, cap, Sq, page, fp8, gen, dev, ordered=len(rest) > 1 and rest[1])
        keep.append((q, kc, vc, kw))
        base = None
        for cfg in [None] + cands:
            try:
                plan, fn = _planned(q, kc, vc, kw, cfg, secure)
                o = fn()[0].float()
                base = o if base is None else base
                err = ((o - base).norm() / base.norm()).item()
                one = _graph_us(fn)
                reps = max(1, min(200, round(target_ms * 1e3 / one)))
                g = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    fn()
                torch.cuda.current_stream().wait_stream(s)
                with torch.cuda.graph(g):
                    for _ in range(reps):
                        fn()
                label = "gluon prefill route (plan.prefill)" if plan.prefill is not None else str(plan.config)
                # the plan and its call (whose output buffer the graph writes) live as long as the graph
                entries.append(dict(case=name, cfg=label, auto=cfg is None, reps=reps, err=err, graph=g, times=[],
                                    call=(plan, fn)))
            except Exception as e:
                print(json.dumps(dict(case=name, cfg=str(cfg), error=f"{type(e).__name__}: {e}"[:300])), flush=True)
    torch.cuda.synchronize()
    rng = random.Random(7)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in entries]
    for _ in range(rounds):
        order = list(range(len(entries)))
        rng.shuffle(order)
        for i in order:
            a, b = ev[i]
            a.record()
            entries[i]["graph"].replay()
            b.record()
            b.synchronize()
            entries[i]["times"].append(1e3 * a.elapsed_time(b) / entries[i]["reps"])
    rows = []
    for e in entries:
        t = e.pop("times")
        e.pop("graph")
        e.pop("call")
        e.update(us=statistics.median(t), us_p10=sorted(t)[len(t) // 10], us_p90=sorted(t)[(9 * len(t)) // 10],
                 rounds=len(t))
        rows.append(e)
        print(json.dumps(e), flush=True)
    return rows


def main(argv=None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--only", default="correct,configs,host")
    ap.add_argument("--cases", default=",".join(CONFIG_CASES), help="the config cases to time")
    ap.add_argument("--rounds", type=int, default=60, help="interleaved: rounds of replays")
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    res = dict(env=collect_environment())
    parts = a.only.split(",")
    if "correct" in parts:
        res["correct"] = correct(dev)
        print("correct:", sum(r["ok"] for r in res["correct"]), "/", len(res["correct"]),
              [r for r in res["correct"] if not r["ok"]], flush=True)
    if "host" in parts:
        res["host"] = host(dev)
    if "hostparts" in parts:
        res["hostparts"] = hostparts(dev)
    if "hostprof" in parts:
        res["hostprof"] = hostprof(dev)
    if "configs" in parts:
        res["configs"] = configs(dev, a.cases.split(","))
    if "interleaved" in parts:
        res["interleaved"] = interleaved(dev, a.cases.split(","), rounds=a.rounds)
    if "same_kv" in parts:
        res["same_kv"] = same_kv(dev)
    if "combine" in parts:
        res["combine"] = combine(dev)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "decode_configs.json"), "w") as f:
        json.dump(res, f, indent=1)
    for r in res.get("same_kv", []):
        print(f"{r['case']:18s} {r['variant']:8s} round {r['round']}: {r['us']:8.1f} us  err {r['vs_own_v_err']:.1e}")
    for r in res.get("interleaved", []):
        print(f"{r['case']:24s} {'*' if r['auto'] else ' '} {r['us']:9.1f} us [{r['us_p10']:.1f}, {r['us_p90']:.1f}] "
              f"x{r['reps']}  {r['cfg'][12:120]}")
    for r in res.get("configs", []):
        print(f"{r['case']:24s} {'*' if r['auto'] else ' '} {r.get('us', float('nan')):9.1f} us "
              f"{r.get('tbs', float('nan')):6.2f} TB/s  {r['cfg']}  {r.get('error', '')[:80]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
