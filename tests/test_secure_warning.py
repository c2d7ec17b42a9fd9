"""secure=True where no constant-time gate covers what runs (the float64 reference, the CPU interpreter, a GPU the
gates never audited) says so with a NotConstantTimeWarning, on every entry point, instead of silently running
something that is not constant-time (issue 25). Invalid calls still raise first."""
import os
import warnings

import pytest
import torch

import flashcore
from flashcore import NotConstantTimeWarning
from flashcore import _checks as C

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
ROUTES = ["reference"] + (["triton"] if INTERP else [])


@pytest.mark.parametrize("backend", ROUTES)
def test_secure_dense_off_the_audited_kernels_warns(backend):
    q = torch.randn(1, 2, 16, 32)
    lens = torch.tensor([9], dtype=torch.int32)
    where = "reference" if backend == "reference" else "interpreter"
    with pytest.warns(NotConstantTimeWarning, match=f"secure=True ran on the .*{where}.*not constant-time") as seen:
        flashcore.attention(q, q, q, secure=True, seqlens_k=lens, backend=backend)
    assert seen[0].filename == __file__  # the warning names the caller's line, not flashcore's


@pytest.mark.parametrize("backend", ROUTES)
def test_secure_kvcache_off_the_audited_kernels_warns(backend):
    q = torch.randn(2, 1, 4, 32)
    cache = torch.randn(2, 64, 2, 32)
    with pytest.warns(NotConstantTimeWarning, match="not constant-time") as seen:
        flashcore.attention_with_kvcache(q, cache, cache.clone(), cache_seqlens=17, secure=True, backend=backend)
    assert [w.filename for w in seen if w.category is NotConstantTimeWarning] == [__file__]


def test_fast_mode_does_not_warn_and_bad_secure_input_raises_before_warning():
    q = torch.randn(1, 2, 16, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotConstantTimeWarning)
        flashcore.attention(q, q, q, backend="reference")
        with pytest.raises(ValueError, match="seqlens_k"):
            flashcore.attention(q, q, q, secure=True, backend="reference")


def test_audited_gpus_are_silent_and_others_are_named(monkeypatch):
    """The architecture test itself, without a GPU: sm_90 is audited; an sm_80 GPU is named in the warning."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(C, "interpreting", lambda: False)
    monkeypatch.setattr(C, "device_arch", lambda device: (9, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotConstantTimeWarning)
        C.warn_not_constant_time(True, cuda)
    monkeypatch.setattr(C, "device_arch", lambda device: (8, 0))
    with pytest.warns(NotConstantTimeWarning, match="sm_80 GPU, whose machine code the constant-time gates never"):
        C.warn_not_constant_time(True, cuda)


def test_triton_debug_builds_are_named(monkeypatch):
    """On an audited GPU, Triton's debug mode (its builds branch on values: asserts, overflow checks) warns."""
    from triton import knobs

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(C, "interpreting", lambda: False)
    monkeypatch.setattr(C, "device_arch", lambda device: (9, 0))
    monkeypatch.setattr(knobs.runtime, "debug", True)
    with pytest.warns(NotConstantTimeWarning, match="Triton builds in its debug mode"):
        C.warn_not_constant_time(True, cuda)


@pytest.mark.skipif(not INTERP, reason="the kernel route on CPU needs the interpreter (plans are cached there)")
def test_secure_warns_on_every_call_not_only_on_the_plans_first():
    """A repeat call takes the cached plan and skips the checks that warn; it warns all the same (an audit of the
    plan-cache hits, session 46: the second secure call, and a step planned after a call, were silent)."""
    q = torch.randn(1, 2, 16, 32)
    lens = torch.tensor([9], dtype=torch.int32)
    qk, cache = torch.randn(2, 1, 4, 32), torch.randn(2, 64, 2, 32)
    calls = [lambda: flashcore.attention(q, q, q, secure=True, seqlens_k=lens, backend="triton"),
             lambda: flashcore.attention_with_kvcache(qk, cache, cache.clone(), cache_seqlens=17, secure=True,
                                                      backend="triton")]
    step = [None]

    def step_run():
        if step[0] is None:
            step[0] = flashcore.kvcache_step(qk, cache, cache.clone(), cache_seqlens=17, secure=True, backend="triton")
        return step[0].run(qk, cache, cache.clone())

    for fn in (*calls, step_run):
        for _ in range(3):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                fn()
            assert [w.category for w in seen].count(NotConstantTimeWarning) >= 1


def test_triton_debug_mode_is_part_of_every_plan_key(monkeypatch):
    """Turning Triton's debug mode on or off reaches a new plan (whose kernels are built as the mode says, and whose
    first call warns), not the plan built under the other mode: the mode is in the knobs' snapshot every plan key
    holds, and in the launcher's key for sharing compiled kernels."""
    from triton import knobs

    from flashcore.plan.knobs import snapshot

    monkeypatch.setattr(knobs.runtime, "debug", False)
    off = snapshot()
    monkeypatch.setattr(knobs.runtime, "debug", True)
    assert snapshot() != off
