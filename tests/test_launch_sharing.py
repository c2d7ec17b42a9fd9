"""Compiled kernels shared across plans (``runtime.launcher._LAUNCHED``) and the plan cache's bound.

A new plan's first launch skips Triton's argument binding when a launch of the same class ran before. That is
only sound if two arguments of one class always get the same specialisation from Triton's launcher: checked here
against the installed Triton's own specialisation function, over values chosen to sit on every boundary it
draws (1, multiples of 16, the int32/int64/uint64 edges, tensor alignment)."""
import pytest
import torch

from flashcore.plan.cache import PlanCache
from flashcore.runtime import launcher
from flashcore.runtime.launcher import KernelStep, _arg_class

INTS = [0, 1, 2, 15, 16, 17, 31, 32, 48, 4096, 4097, 2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 16, 2 ** 40,
        2 ** 63 - 16, 2 ** 63, 2 ** 63 + 16, -1, -16, -17, -2 ** 31, -2 ** 31 - 16]


def _tensors():
    base = torch.empty(64, dtype=torch.float16)
    return [base, base[1:], base[8:], torch.empty(8, dtype=torch.bfloat16), torch.empty(8, dtype=torch.float32)[3:],
            torch.empty(8, dtype=torch.int32)]


def _triton_specialisation(a):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    return native_specialize_impl(CUDABackend, a, False, True, True)


def test_one_launch_class_is_one_triton_specialisation():
    values = INTS + [True, False, 0.5, 1.0, None] + _tensors()
    for a in values:
        for b in values:
            if type(a) is type(b) and _arg_class(a) == _arg_class(b):
                assert _triton_specialisation(a) == _triton_specialisation(b), (a, b)


def test_launch_class_separates_what_triton_separates():
    # the boundaries Triton draws must be boundaries of the class (a coarser class would share a wrong kernel)
    assert _arg_class(16) != _arg_class(17) and _arg_class(1) != _arg_class(2) and _arg_class(0) != _arg_class(1)
    assert _arg_class(2 ** 31 - 16) != _arg_class(2 ** 31) and _arg_class(2 ** 63 - 16) != _arg_class(2 ** 63)
    t = torch.empty(16, dtype=torch.float16)
    assert _arg_class(t) != _arg_class(t[1:]) and _arg_class(t) != _arg_class(t.to(torch.bfloat16))
    with pytest.raises(TypeError):
        _arg_class(object())  # an unknown kind of argument is never shared


def _step(scalars, constexprs=None, fn="kernel"):
    return KernelStep(fn, (1, 1), (None,) + tuple(scalars), 1, constexprs or {"BLOCK": 16}, 4, 2)


def test_launch_classes_of_steps(monkeypatch):
    monkeypatch.setattr(launcher, "interpreting", lambda: False)
    gpu = torch.device("cuda", 0)
    t = torch.empty(16, dtype=torch.float16)
    cls = lambda step, dev=gpu: step._launch_class((t,), dev)  # noqa: E731
    assert cls(_step((32, 0.5))) == cls(_step((48, 0.25)))  # a longer cache: same divisibility, same kernel
    assert cls(_step((32, 0.5))) != cls(_step((33, 0.5)))
    assert cls(_step((32, 0.5))) != cls(_step((32, 0.5), {"BLOCK": 32}))
    assert cls(_step((32, 0.5))) != cls(_step((32, 0.5), fn="other"))
    assert cls(_step((32, 0.5))) != cls(_step((32, 0.5)), torch.device("cuda", 1))
    assert cls(_step((32, 0.5)), torch.device("cpu")) is None
    assert _step((32, object()))._launch_class((t,), gpu) is None


def test_plan_cache_keeps_the_newest_plans_when_full():
    cache = PlanCache(limit=3)
    for i in range(5):
        assert cache.put(i, f"plan{i}") == f"plan{i}"
    assert len(cache) == 3
    assert [cache.get(i) for i in range(5)] == [None, None, "plan2", "plan3", "plan4"]
    assert cache.get_or_build(9, lambda: "plan9") == "plan9" and cache.get(9) == "plan9" and len(cache) == 3


def test_plan_keys_follow_the_knobs_in_the_environment(monkeypatch):
    from flashcore.plan import knobs

    monkeypatch.delenv(knobs.HOPPER_KERNEL_ENV, raising=False)
    before = knobs.snapshot()
    for value in ("triton", "gluon_ws"):
        monkeypatch.setenv(knobs.HOPPER_KERNEL_ENV, value)
        assert knobs.snapshot() != before and knobs.snapshot() == knobs.snapshot()
    monkeypatch.delenv(knobs.HOPPER_KERNEL_ENV)
    assert knobs.snapshot() == before
    monkeypatch.setenv(knobs.SECURE_PAD_ENV, "fill_q")
    assert knobs.snapshot() != before
