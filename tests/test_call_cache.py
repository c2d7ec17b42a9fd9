"""api.attention's per-signature replay (the plan cache, plan.cache.PLANS): a repeat call with the same metadata
skips validation and planning, so it must still read the *new* tensors, still check what depends
on values, and never be taken by a call whose metadata differs."""
import pytest
import torch

import flashcore
from flashcore.plan.cache import PLANS
from conftest import rel_err

pytestmark = pytest.mark.interp


def _qkv(seed, B=2, H=2, S=24, D=16, dtype=torch.float16, layout="bhsd"):
    gen = torch.Generator().manual_seed(seed)
    shape = (B, H, S, D) if layout == "bhsd" else (B, S, H, D)
    return tuple(torch.randn(*shape, generator=gen).to(dtype) for _ in range(3))


def _entries():
    return len(PLANS)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_replay_reads_the_new_tensors(layout):
    q, k, v = _qkv(1, layout=layout)
    first = flashcore.attention(q, k, v, layout=layout, causal=True, backend="triton")
    n = _entries()
    for seed in (2, 3):
        q2, k2, v2 = _qkv(seed, layout=layout)
        out, lse = flashcore.attention(q2, k2, v2, layout=layout, causal=True, backend="triton", return_lse=True)
        assert _entries() == n + 1  # return_lse is part of the signature: one new entry, then a hit
        ref = flashcore.reference.attention(q2, k2, v2, layout=layout, causal=True)
        assert rel_err(out, ref) < 2e-3
        assert not torch.equal(out, first)
    again = flashcore.attention(q, k, v, layout=layout, causal=True, backend="triton")
    assert torch.equal(again, first) and _entries() == n + 1


def test_replay_writes_the_callers_out_buffer():
    q, k, v = _qkv(4)
    for seed in (5, 6):
        out = torch.full_like(q, float("nan"))
        q2, k2, v2 = _qkv(seed)
        res = flashcore.attention(q2, k2, v2, backend="triton", out=out)
        assert res is out and not torch.isnan(out).any()
        assert rel_err(out, flashcore.reference.attention(q2, k2, v2)) < 2e-3


def test_replay_still_checks_secure_lengths():
    q, k, v = _qkv(7)
    ok = torch.tensor([24, 3], dtype=torch.int32)
    flashcore.attention(q, k, v, backend="triton", secure=True, seqlens_k=ok)
    n = _entries()
    with pytest.raises(ValueError, match="seqlens"):
        flashcore.attention(q, k, v, backend="triton", secure=True, seqlens_k=torch.tensor([25, 3], dtype=torch.int32))
    assert _entries() == n  # same signature: the failure came from the replay's value check


def test_different_metadata_never_replays():
    q, k, v = _qkv(8)
    flashcore.attention(q, k, v, backend="triton")
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        flashcore.attention(q, k.to(torch.int32), v, backend="triton")
    with pytest.raises(ValueError, match="share one dtype"):
        flashcore.attention(q, k.float(), v, backend="triton")
    with pytest.raises(ValueError, match="unit stride"):
        flashcore.attention(q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v, backend="triton")
    with pytest.raises(TypeError, match="scale"):
        flashcore.attention(q, k, v, backend="triton", scale=[0.5])  # unhashable: full path names it
    # a strided view with the same shape is a different signature and must give its own answer
    big = _qkv(9, S=48)
    qs, ks, vs = (t[:, :, ::2] for t in big)
    out = flashcore.attention(qs, ks, vs, backend="triton")
    assert rel_err(out, flashcore.reference.attention(qs, ks, vs)) < 2e-3


def test_scale_and_causal_are_part_of_the_signature():
    q, k, v = _qkv(10)
    a = flashcore.attention(q, k, v, backend="triton")
    b = flashcore.attention(q, k, v, backend="triton", scale=0.05)
    c = flashcore.attention(q, k, v, backend="triton", causal=True)
    assert rel_err(b, flashcore.reference.attention(q, k, v, scale=0.05)) < 2e-3
    assert rel_err(c, flashcore.reference.attention(q, k, v, causal=True)) < 2e-3
    assert not torch.equal(a, b) and not torch.equal(a, c)


def test_calls_inside_a_compiled_graphs_op_keep_no_buffer():
    """flashcore's torch.library ops run inside runtime.inside_compiled_graph (perf-notes v60): there no workspace,
    lengths tensor or key-position table is kept for a later call (a compiled graph's CUDA graphs refuse allocations
    that outlive the op). The mark is per thread, nests, and is undone on leaving, exceptions included; CPU tensors
    never keep buffers."""
    import threading

    from flashcore import ops
    from flashcore.runtime import in_compiled_graph, inside_compiled_graph, keeps_buffers

    assert not keeps_buffers(torch.device("cpu"))
    assert not in_compiled_graph()
    seen = []
    with inside_compiled_graph():
        assert in_compiled_graph()
        with inside_compiled_graph():
            assert in_compiled_graph()
        assert in_compiled_graph()  # the inner exit restores the outer mark
        t = threading.Thread(target=lambda: seen.append(in_compiled_graph()))
        t.start()
        t.join()
    assert seen == [False]  # another thread is not marked
    assert not in_compiled_graph()
    with pytest.raises(RuntimeError):
        with inside_compiled_graph():
            raise RuntimeError("boom")
    assert not in_compiled_graph()
    # the decode op's body runs marked (its eager twin, kvcache_call, is what it wraps)
    src = open(ops.__file__).read()
    body = src[src.index("def _kvcache_op("):src.index("@_kvcache_op.register_fake")]
    assert "with inside_compiled_graph():" in body
