"""flashcore.kvcache_step: one decode step planned once, run per layer (CPU; the interpreter for the kernels).

On CPU tensors every run takes attention_with_kvcache's full path (the bound launches are GPU-only:
tests/test_kvcache_gpu.py checks those bit for bit against calls); here: the step binds the right metadata and
options on every backend, checks its arguments when made, and checks a run's tensors that differ from the
planned ones."""
import zlib

import pytest
import torch

import flashcore
from flashcore import reference as R
from conftest import rel_err

kernel = pytest.mark.interp


@pytest.fixture
def gen(request):
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _layers(n, B, S, Hq, Hkv, D, Sq, gen, dtype=torch.float32):
    """n layers' (q, k_cache, v_cache) with the same shapes and different values."""
    return [(torch.randn(B, Sq, Hq, D, generator=gen).to(dtype), torch.randn(B, S, Hkv, D, generator=gen).to(dtype),
             torch.randn(B, S, Hkv, D, generator=gen).to(dtype)) for _ in range(n)]


@kernel
@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("case", ["plain", "leftpad_causal_sq3", "paged_splits", "append", "lse_noncausal"])
def test_step_runs_give_each_layer_the_calls_result(backend, case, gen):
    """Every layer's run equals attention_with_kvcache with the step's metadata and options on that layer's tensors
    (the caches too, when new tokens are appended), and the float64 reference within tolerance."""
    B, S, Hq, Hkv, D = 3, 64, 4, 2, 32
    Sq = 3 if case in ("leftpad_causal_sq3", "append") else 1
    layers = _layers(3, B, S, Hq, Hkv, D, Sq, gen)
    kw = dict(cache_seqlens=torch.tensor([0, 17, 40], dtype=torch.int32), causal=case != "lse_noncausal")
    if case == "leftpad_causal_sq3":
        kw["cache_leftpad"] = torch.tensor([0, 5, 39], dtype=torch.int32)
    if case == "paged_splits":
        kw["num_splits"] = 3
        kw["page_table"] = torch.randperm(B * 4, generator=gen)[:B * 4].view(B, 4).int()
        layers = [(q, kc.reshape(B * 4, 16, Hkv, D), vc.reshape(B * 4, 16, Hkv, D)) for q, kc, vc in layers]
    if case == "lse_noncausal":
        kw["return_lse"] = True
    new = [dict(k=torch.randn(B, Sq, Hkv, D, generator=gen), v=torch.randn(B, Sq, Hkv, D, generator=gen))
           if case == "append" else {} for _ in layers]
    q0, k0, v0 = layers[0]
    step = flashcore.kvcache_step(q0, k0.clone(), v0.clone(), backend=backend, **new[0], **kw)
    for (q, kc, vc), kv in zip(layers, new):
        kc_run, vc_run, kc_call, vc_call = kc.clone(), vc.clone(), kc.clone(), vc.clone()
        got = step.run(q, kc_run, vc_run, **kv)
        want = flashcore.attention_with_kvcache(q, kc_call, vc_call, backend=backend, **kv, **kw)
        if kw.get("return_lse"):
            assert isinstance(got, tuple) and torch.equal(got[1], want[1])
            got, want = got[0], want[0]
        assert torch.equal(got, want)
        assert torch.equal(kc_run, kc_call) and torch.equal(vc_run, vc_call)
        ref = R.attention_with_kvcache(q, kc.clone(), vc.clone(), **kv, **{n: x for n, x in kw.items()
                                                                            if n != "num_splits"})
        ref = ref[0] if isinstance(ref, tuple) else ref
        assert rel_err(got, ref) < 1e-5


def test_step_checks_its_arguments_when_made(gen):
    (q, kc, vc), = _layers(1, 2, 32, 4, 2, 16, 1, gen)
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashcore.kvcache_step(q, kc, vc, cache_seqlens=torch.tensor([3, 33], dtype=torch.int32))
    with pytest.raises(TypeError, match="cache_leftpad"):
        flashcore.kvcache_step(q, kc, vc, cache_seqlens=torch.tensor([3, 4], dtype=torch.int32),
                               cache_leftpad=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="k_cache"):
        flashcore.kvcache_step(q, kc[..., :8], vc, cache_seqlens=5)


def test_a_run_whose_tensors_differ_is_checked_in_full(gen):
    """A run with tensors other than the planned ones' facts takes the full path: checked (the error names the
    argument), or computed for those tensors when they are valid."""
    (q, kc, vc), = _layers(1, 2, 32, 4, 2, 16, 1, gen)
    lens = torch.tensor([3, 30], dtype=torch.int32)
    step = flashcore.kvcache_step(q, kc, vc, cache_seqlens=lens)
    with pytest.raises(ValueError, match="q"):
        step.run(q[..., :8], kc, vc)
    with pytest.raises(ValueError, match="v_cache"):
        step.run(q, kc, vc[:, :16])
    q2 = torch.randn(2, 2, 4, 16, generator=gen)  # two new tokens per sequence instead of one
    assert torch.equal(step.run(q2, kc, vc), flashcore.attention_with_kvcache(q2, kc, vc, cache_seqlens=lens))
    lens.fill_(32)  # the bound lengths are read at each run
    assert torch.equal(step.run(q, kc, vc), flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=32))


def test_no_gradient_is_dropped_by_a_step(gen):
    """attention_with_kvcache has no backward: a step refuses inputs that want a gradient, when made and when run."""
    (q, kc, vc), = _layers(1, 2, 32, 4, 2, 16, 1, gen)
    with pytest.raises(RuntimeError, match="q requires grad"):
        flashcore.kvcache_step(q.requires_grad_(), kc, vc, cache_seqlens=5)
    step = flashcore.kvcache_step(q.detach(), kc, vc, cache_seqlens=5)
    with pytest.raises(RuntimeError, match="q requires grad"):
        step.run(q, kc, vc)
    with torch.no_grad():
        assert torch.equal(step.run(q, kc, vc), flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=5))
