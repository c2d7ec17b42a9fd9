"""Gate 1 (the static SASS audit) inside pytest: a representative subset of the real secure audit specs
(``flashcore.audit.specs.audit_specs(secure=True)``, the list ``flashcore audit sass`` gates on) compiled
for sm_90a and analysed, with zero violations required. Without it a secret-dependent loop bound or an
IEEE-division slow path in the secure kernel passes every test and only the CLI step catches it.

The subset: every kernel family in the list (the secure Triton kernel, both pre-passes, the secure Gluon
kernel, the KV-cache split and combine kernels), both dtype families, every head-dim class of the default audit (8, 64, 72: a masked head dim,
128, 256), every causal mode (none, secret diagonal, public diagonal; on the Gluon kernel too), GQA and not, both sequence lengths
(a tile multiple and a partial tile). A negative control (the fast kernel's varlen form, whose loop bounds
come from the cumulative lengths) must be flagged, so the gate is not passing because it sees nothing.

It runs in a fresh process without ``TRITON_INTERPRET``: once the interpreter has run a kernel in a
process, Triton 3.6's Gluon front end fails on ``warp_specialize`` (see conftest.gluon_sass).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import flashcore

pytest.importorskip("triton")

# name prefixes (the configuration suffix, e.g. ``_128x64w8s3``, is left to the planner's tables)
SECURE_SUBSET = (
    "secure_bf16_d64_full_s1000_gqa4_",
    "secure_bf16_d128_causal_s4096_gqa1_",
    "secure_bf16_d256_causal_pubdiag_s1000_gqa4_",
    "secure_fp32_d72_causal_s1000_gqa4_",
    "secure_fp32_d8_full_s4096_gqa1_",
    "secure_fp32_d128_causal_pubdiag_s4096_gqa1_",
    "secure_prepass_bf16_d72_s1000_hkv2",
    "secure_prepass_kv_bf16_d128_s1000_hkv2",
    # below 2^28 the pre-passes let the secure Gluon kernel launch as they start, and the kernel's loader waits for
    # the pre-pass's grid before its K/V copies (perf-notes v44): PREEXIT and ACQBULK in the listings
    "secure_prepass_kv_bf16_d128_s1000_hkv2_pdl",
    "secure_gluon_ws_bf16_d64_full_s1000_gqa4_lse_1wg_pdl",
    "secure_fill_rows_bf16_d128_s1000_h8",
    # secure="strict" in fp32 at D=256: 64-row tiles spilled under the secret length's predicate (the gate's finding)
    "secure_fill_rows_fp32_d256_s4096_h8",
    # causal, below 2^28: the loader warpgroup writes V's padding (perf-notes v34; the secret key lengths in the
    # loader's selects)
    "secure_gluon_ws_bf16_d128_causal_s1000_gqa4_lse_2wg_sanitise",
    # causal with a secret diagonal (explicit query lengths, perf-notes v36): every key tile, masked with both secret
    # lengths; the one-warpgroup form with V's padding by the loader
    "secure_gluon_ws_fp16_d64_causal_secretdiag_s1000_gqa4_lse_1wg_sanitise",
    "secure_gluon_ws_fp16_d64_full_s4096_gqa1_",
    # secure chunked prefill (plan.prefill): secret key lengths, V cleared by the loader warpgroup; the paged form (a
    # TMA copy per page, page indices read by the loader, its elected copies' operands in registers that hold secret
    # lengths on other paths: the form that needed the gate's guarded copies, 2026-11-27)
    "secure_gluon_ws_bf16_d128_causal_s1024_gqa4_lse_2wg_keylens_page16",
    # the same with V from the V pre-pass (perf-notes v46: the loader a copying warp, K by page, V by tile), and that
    # pre-pass through a page table (its own kernel)
    "secure_gluon_ws_fp16_d64_causal_s1024_gqa4_lse_2wg_keylens_page32_vprepass",
    "secure_prepass_paged16_bf16_d128_s1024_hkv8",
    # the KV-cache kernels: a paged cache (the form the gate once flagged through the pipeliner's shared-memory copy
    # of the page index), FP8 with fp16 q (since v52 the secure FP8 page gather: V by K's offsets, V's select from
    # loaded tensors), a left-padded contiguous cache in fp32, and the combine step
    "secure_decode_bf16_qbf16_d128_paged16_sq1_causal_splits7_",
    "secure_decode_fp8_qfp16_d128_paged64_sq4_splits3_",
    "secure_decode_fp32_qfp32_d128_leftpad_sq1_causal_splits1_",
    "secure_decode_combine_bf16_d128_sq1_g4",
)
NEGATIVE_CONTROL = "fast_bf16_d64_causal_s1000_gqa4_varlen_"

_CODE = r"""
import json, sys
from flashcore.audit.sass import audit_kernels
from flashcore.audit.specs import audit_specs
prefixes, negative = json.loads(sys.argv[1])
secure = audit_specs(secure=True)
fast = audit_specs(secure=False)
fns = sorted({getattr(s["fn"], "__name__", str(s["fn"])) for s in secure})
def pick(specs, prefix):  # (a "_pdl", "_vprepass" or "_vscalars" form only where the prefix names one)
    hits = [s for s in specs if s["name"].startswith(prefix) and ("_pdl" in prefix or not s["name"].endswith("_pdl"))
            and ("_vprepass" in prefix or "_vprepass" not in s["name"])
            and ("_vscalars" in prefix or not s["name"].endswith("_vscalars"))]
    return [h["name"] for h in hits], hits[:1]
chosen, names = [], {}
for p in prefixes:
    names[p], hit = pick(secure, p)
    chosen += hit
neg_names, neg = pick(fast, negative)
reps = audit_kernels(chosen + neg, jobs=int(sys.argv[2]))
out = dict(fns=fns, names=names, neg_names=neg_names, covered=sorted({getattr(s["fn"], "__name__", "?") for s in chosen}),
           reports=[dict(name=r.name, ok=r.ok, error=r.error, counts=r.counts(), n=r.n_instructions,
                         secret=r.secret, unknown=r.unknown_opcodes,
                         first=[str(v) + " | " + " <- ".join(v.trace[:4]) for v in r.violations[:3]]) for r in reps])
print("@@" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def gate():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the flashcore this process imports (a mutated copy included), not whichever is installed
    src = os.path.dirname(os.path.dirname(os.path.abspath(flashcore.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    jobs = "2" if (os.cpu_count() or 1) > 2 else "1"
    res = subprocess.run([sys.executable, "-c", _CODE, json.dumps([SECURE_SUBSET, NEGATIVE_CONTROL]), jobs],
                         capture_output=True, text=True, env=env, timeout=600)
    if res.returncode:
        if "nvdisasm not found" in res.stderr or "ptxas" in res.stderr and "not found" in res.stderr:
            pytest.skip("no CUDA binary tools")
        raise AssertionError(f"the audit failed to run:\n{res.stderr[-4000:]}")
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("@@"))
    return json.loads(line[2:])


def test_subset_names_real_specs_and_covers_every_kernel_family(gate):
    for prefix, names in gate["names"].items():
        assert len(names) == 1, f"{prefix!r} should name exactly one secure audit spec, got {names}"
    assert len(gate["neg_names"]) == 1, gate["neg_names"]
    assert gate["covered"] == gate["fns"], "a kernel family of audit_specs(secure=True) is not in the subset"


def test_secure_specs_have_no_violations(gate):
    reps = gate["reports"][:-1]
    assert len(reps) == len(SECURE_SUBSET)
    bad = []
    for r in reps:
        assert r["n"] > 0 and r["secret"], r  # something was analysed, with secrets declared
        if not r["ok"] or r["unknown"]:
            bad.append(f"{r['name']}: error={r['error']} violations={r['counts']} unknown={r['unknown']}\n    "
                       + "\n    ".join(r["first"]))
    assert not bad, "secure kernels fail the static gate:\n" + "\n".join(bad)


def test_negative_control_is_flagged(gate):
    neg = gate["reports"][-1]
    assert neg["error"] is None and not neg["ok"] and neg["counts"].get("branch"), neg


def test_every_page_size_secure_mode_accepts_is_in_the_gates_list():
    # "every launchable configuration": the page size is a constexpr, so each accepted size is its own binary
    from flashcore._checks import SECURE_PAGE_SIZES
    from flashcore.audit.specs import decode_specs

    names = [s["name"] for s in decode_specs(secure=True)]
    for page in SECURE_PAGE_SIZES:
        assert any(f"_paged{page}_" in n for n in names), f"secure page size {page} is accepted but not audited"


def test_every_secure_chunked_prefill_form_is_in_the_gates_list():
    """Secure chunked prefill on the Gluon kernel (plan.prefill) launches the tables' layout for its query count
    (two consumer warpgroups, three at D=64 non-causal from 2048 queries): every such form, in both dtypes, with a
    contiguous cache and with each page size secure mode takes, V cleared by the loader or cleaned by the V pre-pass
    (over the cache's layout, or through the page table: both listed too), is one the gate compiles."""
    from flashcore._checks import SECURE_PAGE_SIZES
    from flashcore.audit.specs import audit_specs
    from flashcore.plan import tables
    from flashcore.plan.prefill import PREFILL_MIN_SEQLEN_Q

    listed = {s["name"] for s in audit_specs(secure=True) if "_keylens" in s["name"]}
    for elt in ("bf16", "fp16"):
        for hd, least in PREFILL_MIN_SEQLEN_Q.items():
            for causal in (False, True):
                for sq in (least, 512, 2048, 8192):
                    wg = tables.gluon_ws(hd, sq, causal).block_m // 64
                    form = f"secure_gluon_ws_{elt}_d{hd}_{'causal' if causal else 'full'}_"
                    # contiguous, then each page size, V cleared by the loader or from the V pre-pass
                    for cache in ("", "_vprepass", *(f"_page{p}{v}" for p in SECURE_PAGE_SIZES for v in ("", "_vprepass"))):
                        end = f"_{wg}wg_keylens{cache}"
                        assert any(n.startswith(form) and n.endswith(end) for n in listed), (form, sq, end)
    # the V pre-pass over a KV cache's layout ([B, S, Hkv, D] viewed as [B, Hkv, S, D]) and through each page size's
    # table, before the V_PREPASS forms
    names = [s["name"] for s in audit_specs(secure=True) if s["name"].startswith("secure_prepass_")]
    for elt in ("bf16", "fp16"):
        for hd in PREFILL_MIN_SEQLEN_Q:
            assert any(n.startswith(f"secure_prepass_{elt}_d{hd}_") and n.endswith("_cache") for n in names), (elt, hd)
            for p in SECURE_PAGE_SIZES:
                assert any(n.startswith(f"secure_prepass_paged{p}_{elt}_d{hd}_") for n in names), (elt, hd, p)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16", "float32"])
def test_every_secure_dense_selection_runs_a_form_the_gate_lists(dtype_name):
    """What ``select`` launches in secure mode on sm_90 is a form ``audit_specs(secure=True)`` compiles: the Triton
    kernel in its own table's form (the one ``audit.specs.triton_config`` lists), the Gluon kernel in a layout the
    list holds for that dtype, head dim and causal mode. Small and large problems, explicit query lengths (causal:
    the secret-diagonal form, since v36 on the Gluon kernel in the layouts of tables.hopper(secret_diagonal=True))
    and self-attention."""
    import torch

    from flashcore.audit.specs import _on_arch, audit_specs
    from flashcore.plan.select import SM90, select, triton_config
    from flashcore.problem import Problem

    dtype = getattr(torch, dtype_name)
    listed = {s["name"] for s in audit_specs(secure=True) if s["name"].startswith("secure_gluon_ws_")}
    elt = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[dtype_name]
    for hd in (64, 128):
        for B, H, S in ((1, 8, 512), (1, 16, 1024), (2, 8, 1000), (4, 16, 1024), (16, 16, 2048), (1, 32, 4096)):
            for causal in (False, True):
                for self_attention in (False, True):
                    t = torch.empty(B, H, S, hd, dtype=dtype)
                    p = _on_arch(Problem.dense(t, t, t, t, causal=causal, scale=hd ** -0.5, layout="bhsd",
                                               secure=True, self_attention=self_attention, return_lse=False), (9, 0))
                    sel = select(p)
                    what = f"{B}x{H}x{S}x{hd} {dtype_name} causal={causal} self={self_attention}: {sel.explain()}"
                    if sel.kernel == SM90:
                        mode = ("causal_secretdiag" if p.secret_diagonal else "causal") if causal else "full"
                        form = f"secure_gluon_ws_{elt}_d{hd}_{mode}_s"
                        wg = f"_{sel.config.block_m // 64}wg"
                        assert any(n.startswith(form) and n.endswith(wg) for n in listed), what
                    else:
                        assert sel.config == triton_config(p), what


def test_the_committed_report_for_this_triton_covers_the_gates_list_with_analysis_keys():
    """CI runs gate 1 with ``--reuse`` on the committed report of its Triton version (``.ci/run``): that report must
    list exactly the configurations ``audit_specs(secure=True)`` lists, each clean and with its analysis key, or CI
    analyses the rest itself (correct, but the time that made stop 57's CI miss its 90 minutes). Re-run
    ``flashcore audit sass --json audit/results/<file>`` after a change to the list, a kernel or the analyser."""
    import triton

    from flashcore.audit.sass import memo
    from flashcore.audit.specs import audit_specs

    files = {"3.6.0": "sass.json.gz", "3.9.0": "sass-triton-3.9.0.json.gz"}
    if triton.__version__ not in files:
        pytest.skip(f"no committed gate-1 report for triton {triton.__version__}")
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "audit", "results",
                        files[triton.__version__])
    doc = memo.read_report(path)
    # written by this analyser: its keys can match (an edit to memo.ANALYSER_MODULES or another nvdisasm misses
    # every kernel, and CI then analyses all of them)
    assert doc.get("analyser") == memo.analyser_fingerprint(), (
        f"{path} was written by another analyser: re-run flashcore audit sass --json {path}")
    listed = sorted(s["name"] for s in audit_specs(secure=True))
    reported = sorted(r["name"] for r in doc["secure"])
    assert reported == listed, (f"{path}: configurations not in the report {sorted(set(listed) - set(reported))[:10]}, "
                                f"no longer listed {sorted(set(reported) - set(listed))[:10]}")
    assert doc["ok"] is True and all(r["ok"] for r in doc["secure"])
    unkeyed = [r["name"] for r in doc["secure"] if not r.get("analysis_key")]
    assert not unkeyed, f"{path}: {len(unkeyed)} reports without an analysis key (written before --reuse): {unkeyed[:5]}"
