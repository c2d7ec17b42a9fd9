"""Without CUDA, the Triton kernels run under the interpreter (must be set before triton is imported)."""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
# the child process of a ``fresh_process`` module (below) compiles for sm_90a only: no interpreter
FRESH_CHILD = os.environ.get("FLASHCORE_FRESH_PROCESS") == "1"
if not HAS_CUDA and not FRESH_CHILD:
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
_FRESH_OUTCOMES: dict[str, str] = {}


def _language_objects():
    import triton.language as tl

    return (tl, tl.core, tl.math, tl.tensor, tl.core.tensor_descriptor_base)


# Triton's interpreter swaps triton.language's functions for interpreter versions while it runs a kernel and puts
# them back afterwards, except on one path: a @jit device function it calls re-patches the language through a scope
# nobody restores (triton/runtime/interpreter.py, InterpretedFunction.__call__, 3.6 and 3.9). After such a call the
# process keeps interpreter lambdas in triton.language, and every later compile in it fails in the front end
# ("'value' object has no attribute 'dtype'", "Unsupported function referenced: _patch_attr.<locals>.<lambda>"):
# seen 2026-11-26 after tests/test_api_errors.py's triton-backend cases, failing the SASS tests that compile after
# them in the same process. The language as imported here (before any kernel ran) is put back after every test.
_PRISTINE_LANGUAGE = {(id(o), name): value for o in _language_objects() for name, value in list(vars(o).items())}


@pytest.fixture(autouse=True)
def _restore_the_language_the_interpreter_left_patched():
    yield
    if not INTERPRET:
        return
    for o in _language_objects():
        for name, value in list(vars(o).items()):
            pristine = _PRISTINE_LANGUAGE.get((id(o), name), value)
            if pristine is not value:
                setattr(o, name, pristine)


def pytest_pyfunc_call(pyfuncitem):
    """Tests marked ``fresh_process`` run in one child pytest per module, without the interpreter, when this
    process runs interpreter tests: after the interpreter has run kernels in a process, triton 3.9's front end
    fails to compile kernels there ("'block_argument' object has no attribute 'dtype'"; seen in CI's full
    suite, never in isolation). Each test still reports its own outcome, from the child's."""
    if "fresh_process" not in pyfuncitem.keywords or not INTERPRET or FRESH_CHILD:
        return None
    if pyfuncitem.nodeid not in _FRESH_OUTCOMES:
        _run_fresh(pyfuncitem)
    outcome = _FRESH_OUTCOMES.get(pyfuncitem.nodeid, "not run")
    assert outcome == "PASSED", f"{pyfuncitem.nodeid}: {outcome} in the fresh process\n{_FRESH_OUTCOMES['<log>']}"
    return True


def _run_fresh(item) -> None:
    import re
    import subprocess
    import sys

    ids = [it.nodeid for it in item.session.items if "fresh_process" in it.keywords and it.fspath == item.fspath]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["FLASHCORE_FRESH_PROCESS"] = "1"
    src = os.path.join(str(item.config.rootpath), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *ids],
                         capture_output=True, text=True, env=env, cwd=str(item.config.rootpath), timeout=1800)
    for m in re.finditer(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+)", res.stdout, re.M):
        _FRESH_OUTCOMES[m.group(2)] = m.group(1)
    _FRESH_OUTCOMES["<log>"] = (res.stdout + res.stderr)[-6000:]
    for i in ids:
        _FRESH_OUTCOMES.setdefault(i, "not reported")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_interp = pytest.mark.skip(reason="interpreter tests run on CPU only (TRITON_INTERPRET=1)")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "interp" in item.keywords and not INTERPRET:
            item.add_marker(skip_interp)


@pytest.fixture
def ran(monkeypatch):
    """What flashcore's entry points actually ran, recorded during the test: ``ran.kernels``, one
    ``(kernel name, Problem)`` per plan run (the Triton or the Gluon kernel, eager or through the custom
    ops; a KV-cache plan records ``("triton_decode", DecodeShape)``); ``ran.reference``, the number of calls
    the API made to its reference backend (``backend="auto"`` on CPU tensors, or ``"reference"``). The test's
    own calls of ``flashcore.reference`` are not counted."""
    import types

    from flashcore import api
    from flashcore.plan.build import Plan
    from flashcore.plan.decode import DecodePlan

    rec = types.SimpleNamespace(kernels=[], reference=0)
    plan_call = Plan.__call__

    def call(self, *args, **kwargs):
        rec.kernels.append((self.selection.kernel, self.problem))
        return plan_call(self, *args, **kwargs)

    class _ReferenceSpy:
        def __getattr__(self, name):
            f = getattr(real_ref, name)
            if not callable(f):
                return f

            def counted(*args, **kwargs):
                rec.reference += 1
                return f(*args, **kwargs)
            return counted

    from flashcore import ops

    decode_call = DecodePlan.__call__

    def call_decode(self, *args, **kwargs):
        rec.kernels.append(("triton_decode", self.shape))
        return decode_call(self, *args, **kwargs)

    real_ref = api._ref
    monkeypatch.setattr(Plan, "__call__", call)
    monkeypatch.setattr(DecodePlan, "__call__", call_decode)
    monkeypatch.setattr(api, "_ref", _ReferenceSpy())
    monkeypatch.setattr(ops, "_ref", _ReferenceSpy())  # the varlen and KV-cache references run from ops.py
    return rec


@pytest.fixture
def strict_interpreter(monkeypatch):
    """Triton's interpreter made strict about memory, for the tests that use this fixture:

    * bounds: every unmasked load or store of a kernel launched during the test must fall inside the storage
      of one of that launch's tensor arguments (an access past the end of a buffer fails at once, with the
      kernel's name and the offending addresses);
    * undefined lanes: a masked load without ``other=`` leaves its masked-off lanes undefined (on a GPU they
      keep whatever the registers held); the interpreter fills zeros, which hides a kernel that depends on
      them. Here they are NaN (floating point, FP8 included) or -1 (signed integers).

    Returns the list of the checked launches' kernel names."""
    import types

    import numpy as np
    from triton.runtime import interpreter as I

    launches = []
    ranges: list[tuple[int, int]] = []
    init = I.GridExecutor._init_args_hst

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = init(self, args_dev, kwargs)
        ranges.clear()
        for a in list(args_hst) + list(kwargs_hst.values()):
            if isinstance(a, torch.Tensor):
                st = a.untyped_storage()
                ranges.append((st.data_ptr(), st.data_ptr() + st.nbytes()))
        launches.append(getattr(self.fn, "__name__", "?"))
        return args_hst, kwargs_hst

    def check(what, ptrs, mask, itemsize):
        p = np.asarray(ptrs, dtype=np.uint64)[np.asarray(mask, dtype=bool)]
        ok = np.zeros(p.shape, dtype=bool)
        for lo, hi in ranges:
            ok |= (p >= lo) & (p + itemsize <= hi)
        if not ok.all():
            bad = p[~ok]
            raise AssertionError(f"{launches[-1]}: {bad.size} {what}(s) outside every argument's storage, "
                                 f"e.g. {[hex(int(x)) for x in bad[:3]]}; storages {[(hex(a), b - a) for a, b in ranges]}")

    real = I._interpreter

    def load(ptrs, mask, other, dtype):
        check("load", ptrs, mask, np.dtype(dtype).itemsize)
        return real.load(ptrs, mask, other, dtype)

    def store(ptrs, value, mask):
        check("store", ptrs, mask, value.dtype.itemsize)
        return real.store(ptrs, value, mask)

    masked_load = I.InterpreterBuilder.create_masked_load

    def create_masked_load(self, ptrs, mask, other, *args):
        if other is None:
            dtype_tt = ptrs.get_element_ty()
            dtype_np = I._get_np_dtype(dtype_tt)
            if np.issubdtype(dtype_np, np.floating):
                fill = np.nan
            elif np.issubdtype(dtype_np, np.unsignedinteger):  # FP8 is held as uint8: 0xff is e4m3's NaN
                fill = np.iinfo(dtype_np).max
            else:
                fill = -1
            other = I.TensorHandle(np.full(ptrs.data.shape, fill, dtype=dtype_np), dtype_tt)
        return masked_load(self, ptrs, mask, other, *args)

    proxy = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real) if not n.startswith("__")})
    proxy.load, proxy.store = load, store
    monkeypatch.setattr(I.GridExecutor, "_init_args_hst", init_args)
    monkeypatch.setattr(I, "_interpreter", proxy)
    monkeypatch.setattr(I.InterpreterBuilder, "create_masked_load", create_masked_load)
    return launches


def nvdisasm_missing() -> str | None:
    """Why the SASS tests cannot compile and disassemble here (no ``nvdisasm``), or None: their skip condition."""
    from flashcore.audit.sass.compile import _tool

    try:
        _tool("nvdisasm")
    except FileNotFoundError as e:
        return str(e)
    return None


def rel_err(out, ref) -> float:
    ref = ref.double()
    denom = ref.norm().item()
    return (out.double() - ref).norm().item() / max(denom, 1e-30)


def capture_cuda_graph(fn):
    """Capture ``fn()`` in a CUDA graph on a side stream (as PyTorch recommends); returns
    ``(graph, fn's outputs)``. Warm ``fn`` up first: compiling or planning inside capture fails."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph):
            outs = fn()
    torch.cuda.current_stream().wait_stream(s)
    return graph, outs


_GLUON_SASS = """
import json, sys
from dataclasses import replace
from flashcore.audit.sass import compile_cubin, disassemble
from flashcore.audit.specs import gluon_spec
from flashcore.plan import knobs, tables
a = json.loads(sys.argv[1])
with knobs.override(trace=a["trace"], **a["attrs"]):
    cfg = None
    if a["block_m"] is not None:
        base = (tables.gluon_secure if a["secure"] else tables.gluon_ws)(a["head_dim"], 4096, a["causal"])
        cfg = replace(base, block_m=a["block_m"])
    spec = gluon_spec(a["head_dim"], a["causal"], return_lse=True, cfg=cfg, secure=a["secure"])
c = compile_cubin(spec["fn"], spec["signature"], spec["constexprs"], num_warps=spec["num_warps"],
                  num_stages=spec["num_stages"], attrs=spec["attrs"], maxnreg=spec["maxnreg"])
sys.stdout.write(disassemble(c.cubin))
"""


def gluon_sass(head_dim: int, causal: bool, secure: bool = False, block_m=None, trace: bool = False,
               attrs: dict | None = None) -> str:
    """sm_90a SASS of the Gluon kernel as flashcore launches it, compiled in a fresh process without
    ``TRITON_INTERPRET``: once the interpreter has run a kernel in this process, Triton 3.6's Gluon
    front end fails on warp_specialize (a CompilationError; seen when the interpreter tests run first).
    ``attrs``: Gluon kernel switches (``plan.knobs.GluonSwitches``) to set first, e.g. ``{"stagger": 0}``."""
    return _compile_in_fresh_process(_GLUON_SASS, "the Gluon kernel", dict(
        head_dim=head_dim, causal=causal, secure=secure, block_m=block_m, trace=trace, attrs=attrs or {}))


def _compile_in_fresh_process(script: str, what: str, args: dict) -> str:
    """Run a compile ``script`` (it prints SASS) with ``args`` as JSON, in a fresh process without
    ``TRITON_INTERPRET`` and with this checkout's ``src`` first on the path (see gluon_sass)."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-c", script, json.dumps(args)], capture_output=True, text=True, env=env)
    if res.returncode:
        raise RuntimeError(f"compiling {what} failed:\n{res.stderr[-4000:]}")
    return res.stdout


_GLUON_BWD_SASS = """
import json, sys
from flashcore.audit.sass import compile_cubin, disassemble
from flashcore.audit.specs import hopper_dkdv_spec
a = json.loads(sys.argv[1])
spec = hopper_dkdv_spec(a["head_dim"], a["causal"], form=tuple(a["form"]) if a["form"] else None,
                        fused_dq=a["fused_dq"], Hkv=a["hkv"], ordered_dq=a["ordered_dq"])
c = compile_cubin(spec["fn"], spec["signature"], spec["constexprs"], num_warps=spec["num_warps"],
                  num_stages=spec["num_stages"], attrs=spec["attrs"], maxnreg=spec["maxnreg"])
sys.stdout.write(disassemble(c.cubin))
"""


def gluon_bwd_sass(head_dim: int, causal: bool, form=None, fused_dq: bool = False, hkv: int = 2,
                   ordered_dq: bool = False) -> str:
    """sm_90a SASS of the Hopper backward's dK/dV kernel as the backward launches it (``form``: another (query tile,
    key tile, warps, ring depth); ``fused_dq``: the form that adds dQ itself; ``hkv``: K/V heads beside 8 query
    heads, 8 being no GQA, which Triton specialises; ``ordered_dq``: deterministic's fused form), compiled in a fresh
    process without ``TRITON_INTERPRET`` (see gluon_sass)."""
    return _compile_in_fresh_process(_GLUON_BWD_SASS, "the Gluon dK/dV kernel",
                                     dict(head_dim=head_dim, causal=causal, form=list(form) if form else None,
                                          fused_dq=fused_dq, hkv=hkv, ordered_dq=ordered_dq))


# The Gluon kernel's register budgets (launch/sm90_fwd.py: three consumer warpgroups at 160 registers, two at 240)
# were fitted with Triton 3.6's toolchain (its PTX, ptxas 12.8 for sm_90a), and the machine-code tests pin what that
# gives: no spills (or the few listed there), every main loop's MMAs overlapping the softmax. Later Triton versions
# bring other PTX and another ptxas for sm_90a (3.7: 12.8; 3.8: 12.9 with --regAllocOptLevel=2; 3.9: 13.4 with
# --regAllocOptLevel=2), under which some forms no longer fit: performance regressions of the toolchain, not wrong
# results (the audit and the correctness tests run the same), measured here on the CPU, listed per Triton version
# below and in docs/design.md ("Triton versions"). A test that pins such a property asserts the miss (so a toolchain
# that fits again fails the test, and its entry goes) and reports an expected failure (``expect_register_fit``).
REGISTER_MISSES = {
    "3.7": {
        "fast_d64_3wg_traced": "the traced D=64 three-warpgroup form (debug timeline) spills 2 registers (2 STL, 2 LDL; "
                               "none in the main loop)",
    },
    "3.8": {
        "fast_d64_3wg": "the D=64 three-warpgroup form spills (2 STL, 1 LDL; none in the main loop)",
        "fast_d64_3wg_traced": "the traced D=64 three-warpgroup form spills (43 STL, 50 LDL; none in the main loop)",
        "secure_d64_full_3wg": "the secure D=64 three-warpgroup form spills 47 registers (4 on Triton 3.6; none in "
                               "the main loop)",
    },
    "3.9": {
        "fast_d64_3wg": "the D=64 three-warpgroup form spills (21 STL, 41 LDL, one LDL in the main loop)",
        "fast_d64_3wg_traced": "the traced D=64 three-warpgroup form spills (63 STL, 74 LDL)",
        "secure_d64_full_3wg": "ptxas serialises the wgmmas of the secure D=64 three-warpgroup form (C7512, "
                               "insufficient register resources): no MMA overlaps a softmax; 26 STL, 52 LDL",
        "d128_causal": "the D=128 causal form spills (fast 13 STL / 41 LDL, secure 14 / 48; 3 / 4 and 4 / 7 on "
                       "Triton 3.6), one LDL in each main loop",
        "bwd_d64_wide_causal": "the backward's 128-query fused D=64 causal form (the planner's causal D=64 row from "
                               "4096 queries) spills 4 STL / 12 LDL (none on Triton 3.6; 17 / 23 before v39's "
                               "paired rounding; 10 / 18 with v40's widened P^T, which 3.9 does not take)",
    },
}


def register_miss(form: str | None) -> str | None:
    """Why this Triton's toolchain does not fit Gluon kernel form ``form`` into its register budget (see
    REGISTER_MISSES), or None where it is known to fit."""
    import triton

    return REGISTER_MISSES.get(".".join(triton.__version__.split(".")[:2]), {}).get(form)


def expect_register_fit(form: str | None, fits: bool, what: str) -> None:
    """``fits``: whether the compiled form has the property the test pins (``what`` says which). Where it is known
    not to on this Triton (REGISTER_MISSES), the miss must still be there, and the test ends as an expected
    failure; elsewhere the property must hold."""
    import triton

    miss = register_miss(form)
    if miss is None:
        assert fits, what
        return
    assert not fits, (f"{form} now fits ({what}) with triton {triton.__version__}: drop its entry from "
                      f"conftest.REGISTER_MISSES")
    pytest.xfail(f"triton {triton.__version__}: {miss}")


def main_loop_opcodes(sass: str):
    """Opcode counts of the Gluon kernel's main loop body as ptxas scheduled it: from the wait for S_j
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``) to the wait for P_(j-1) V_(j-1) (``... 0x0``), both branches
    (masked and unmasked tiles). The softmax overlaps the P@V only if its exponentials sit in here."""
    import collections
    import re

    ins = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", sass)]
    i = next(k for k, t in enumerate(ins) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in t)
    j = next(k for k in range(i, len(ins)) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in ins[k])
    return collections.Counter(t.split()[1 if t.startswith("@") else 0] for t in ins[i:j])
