"""Known-answer kernels for three SASS-analyser rules that mutation testing found unexercised
(docs/mutation.md, "sass: surviving mutants"); compiled for sm_90a on the CPU.

* a TMA load through a *public* descriptor reads whatever was stored into the tensor: secret data
  written there with an ordinary store comes back secret (``taint.py`` TMA read: ``t or data_t``;
  the mutant ``t and data_t`` still survives: Triton stages the device-side descriptor through the
  one-region shared memory, which the reloaded tile taints, so the descriptor's memory is secret too);
* a TMA store writes the descriptor's tensor, not "unknown memory": a later load from another,
  public tensor stays public (``taint.py`` TMA write: the descriptor memory's provenance);
* ``UBLKPF`` (``cp.async.bulk.prefetch.L2``) is a known address-only instruction: its address is
  checked, it is not an unknown opcode (``isa.py`` ``ADDR_ONLY``).

Each has an adversarial kernel the analyser must flag and a twin, differing in one constexpr, it
must pass.
"""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from flashcore.audit.sass import compile_cubin, disassemble, sass_taint  # noqa: E402
from conftest import nvdisasm_missing  # noqa: E402


_NO_NVDISASM = nvdisasm_missing()
pytestmark = pytest.mark.skipif(_NO_NVDISASM is not None, reason=f"no nvdisasm: {_NO_NVDISASM}")


def _in_fresh_process(body: str, flag: bool) -> None:
    """Run ``body(flag)`` of this module in a fresh process without ``TRITON_INTERPRET``: after the interpreter
    has run kernels in a process, triton 3.9's front end fails to compile these (``'value' object has no
    attribute 'dtype'``; seen in CI's full suite, never in isolation)."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(here), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, here, env.get("PYTHONPATH")) if p)
    code = f"import test_audit_sass_survivors as m; m.{body}({flag!r})"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]


def _check(fn, sig, ce, secret, kind, at=None):
    """Audit with ``secret``: no unknown opcode, and violations of exactly the kind(s) ``kind`` (None:
    clean), one of them at an instruction whose opcode starts with ``at``."""
    kinds = {kind} if isinstance(kind, str) else kind
    rep = sass_taint(fn, sig, ce, secret)
    assert not rep.unknown_opcodes, rep.unknown_opcodes
    if kind is None:
        assert rep.ok, str(rep)
    else:
        assert rep.violations and {v.kind for v in rep.violations} == kinds, str(rep)
        if at is not None:
            assert any(v.opcode.startswith(at) for v in rep.violations), str(rep)
    return rep


@triton.jit
def k_tma_reload(X, W, Z, T, OUT, RELOAD_W: tl.constexpr, BLOCK: tl.constexpr):
    """Store the secret tile X into W with plain stores, then TMA-load W (or the untouched Z) through a
    device-side descriptor built from a public pointer, and use the tile as gather indices."""
    r = tl.arange(0, BLOCK)
    idx = r[:, None] * BLOCK + r[None, :]
    tl.store(W + idx, tl.load(X + idx))
    if RELOAD_W:
        d = tl.make_tensor_descriptor(W, shape=[BLOCK, BLOCK], strides=[BLOCK, 1], block_shape=[BLOCK, BLOCK])
    else:
        d = tl.make_tensor_descriptor(Z, shape=[BLOCK, BLOCK], strides=[BLOCK, 1], block_shape=[BLOCK, BLOCK])
    t = d.load([0, 0])
    tl.store(OUT + idx, tl.load(T + (t & 1023)))


SIG_RELOAD = {"X": "*i32", "W": "*i32", "Z": "*i32", "T": "*i32", "OUT": "*i32", "RELOAD_W": "constexpr",
              "BLOCK": "constexpr"}


@pytest.mark.parametrize("reload_w", [True, False])
def test_tma_load_of_a_tensor_holding_secret_data_is_secret(reload_w):
    _in_fresh_process("_tma_reload", reload_w)


def _tma_reload(reload_w):
    ce = {"RELOAD_W": reload_w, "BLOCK": 32}
    text = disassemble(compile_cubin(k_tma_reload, SIG_RELOAD, ce).cubin)
    assert "UTMALDG" in text
    _check(k_tma_reload, SIG_RELOAD, ce, {"X"}, "address" if reload_w else None)


@triton.jit
def k_tma_store_then_load(X, O, Y, T, OUT, LOAD_O: tl.constexpr, BLOCK: tl.constexpr):
    """TMA-store the secret tile X into O, then gather with an index loaded from O (secret) or from the
    public Y (public: the TMA store wrote O only). The index is a scalar, so it stays in registers (shared
    memory, which stages the TMA store, holds secret data)."""
    r = tl.arange(0, BLOCK)
    idx = r[:, None] * BLOCK + r[None, :]
    od = tl.make_tensor_descriptor(O, shape=[BLOCK, BLOCK], strides=[BLOCK, 1], block_shape=[BLOCK, BLOCK])
    od.store([0, 0], tl.load(X + idx))
    if LOAD_O:
        v = tl.load(O + 5)
    else:
        v = tl.load(Y + 5)
    tl.store(OUT, tl.load(T + (v & 1023)))  # scalars: no shared-memory round trip


SIG_STORE = {"X": "*i32", "O": "*i32", "Y": "*i32", "T": "*i32", "OUT": "*i32", "LOAD_O": "constexpr",
             "BLOCK": "constexpr"}


@pytest.mark.parametrize("load_o", [True, False])
def test_tma_store_writes_only_the_descriptors_tensor(load_o):
    _in_fresh_process("_tma_store", load_o)


def _tma_store(load_o):
    ce = {"LOAD_O": load_o, "BLOCK": 32}
    text = disassemble(compile_cubin(k_tma_store_then_load, SIG_STORE, ce).cubin)
    assert "UTMASTG" in text
    rep = _check(k_tma_store_then_load, SIG_STORE, ce, {"X"}, "address" if load_o else None)
    assert "global:O" in rep.tainted_memory


@triton.jit
def k_bulk_prefetch(X, Y, OUT, SECRET_ADDR: tl.constexpr, BLOCK: tl.constexpr):
    """cp.async.bulk.prefetch.L2 (SASS UBLKPF) of Y at a public offset or at one loaded from the secret X."""
    offs = tl.arange(0, BLOCK)
    if SECRET_ADDR:
        i = (tl.load(X + offs) & 1023) * 4
    else:
        i = offs * 4
    z = tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 64;\n\tmov.u32 $0, 0;", "=r,l",
                                  [Y + i], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(OUT + offs, z)


SIG_PF = {"X": "*i32", "Y": "*i32", "OUT": "*i32", "SECRET_ADDR": "constexpr", "BLOCK": "constexpr"}


@pytest.mark.parametrize("secret_addr", [True, False])
def test_bulk_prefetch_is_a_known_address_only_instruction(secret_addr):
    _in_fresh_process("_bulk_prefetch", secret_addr)


def _bulk_prefetch(secret_addr):
    ce = {"SECRET_ADDR": secret_addr, "BLOCK": 128}
    text = disassemble(compile_cubin(k_bulk_prefetch, SIG_PF, ce).cubin)
    assert "UBLKPF" in text
    # the secret address is also a branch: UBLKPF takes a uniform register, so the compiler loops over the
    # lanes' distinct addresses (R2UR ... BRA.U.ANY), a secret-dependent trip count
    _check(k_bulk_prefetch, SIG_PF, ce, {"X"}, {"address", "branch"} if secret_addr else None, at="UBLKPF")
