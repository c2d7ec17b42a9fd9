"""The correctness gate: float64 reference on slices, and backend declarations (CPU)."""
from __future__ import annotations

import math

import pytest
import torch

import flashcore.reference as ref
from flashcore.bench import backends as B
from flashcore.bench import check
from flashcore.bench.suites import Shape


def _full_reference(inputs):
    s = inputs.shape
    if s.is_varlen:
        cu = inputs.cu_seqlens
        return ref.attention_varlen(inputs.q, inputs.k, inputs.v, cu, cu, s.Sq, s.Sk, causal=s.causal, scale=inputs.scale)
    return ref.attention(inputs.q, inputs.k, inputs.v, causal=s.causal, scale=inputs.scale)


SHAPES = [
    Shape.dense(3, 4, 70, 16),
    Shape.dense(2, 6, 70, 16, causal=True, Hkv=2),
    Shape.dense(2, 4, 70, 16, causal=True, Sk=100),  # Sk > Sq: bottom-right alignment matters
    Shape.dense(1, 4, 90, 16, causal=True, Sk=40),   # Sq > Sk: the first rows see no key
    Shape.packed([30, 0, 45, 7], 4, 16, causal=True, Hkv=2),
    Shape.packed([33, 41], 2, 8),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.key)
def test_windowed_reference_matches_the_full_reference(shape):
    """Small windows force the slicing logic (first/last rows, key extents) to be exercised."""
    inputs = B.make_inputs(shape, torch.float32, "cpu")
    pieces = check.reference_pieces(inputs, window=8)
    assert len(pieces) >= 2
    full = _full_reference(inputs)
    assert check.relative_error(full, pieces) < 1e-12
    ok, err = check.check_output(full.float(), pieces, tolerance=1e-5)
    assert ok and err < 1e-6


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.key)
def test_wrong_outputs_are_caught(shape):
    inputs = B.make_inputs(shape, torch.float32, "cpu")
    pieces = check.reference_pieces(inputs, window=8)
    full = _full_reference(inputs).float()
    if shape.is_varlen:
        # a classic bug: attend across the sequence boundary (ignore cu_seqlens)
        crossed = ref.attention(inputs.q.transpose(0, 1)[None], inputs.k.transpose(0, 1)[None],
                                inputs.v.transpose(0, 1)[None], causal=shape.causal)[0].transpose(0, 1).float()
        assert not check.check_output(crossed, pieces)[0]
    else:
        # a classic bug: the other causal convention (top-left) or no mask at all
        other = ref.attention(inputs.q, inputs.k, inputs.v, causal=not shape.causal).float()
        if shape.Sq != shape.Sk and shape.causal:
            top_left = _top_left_causal(inputs).float()
            assert not check.check_output(top_left, pieces)[0]
        assert not check.check_output(other, pieces)[0]
    last_head = full.clone()
    if shape.is_varlen:
        last_head[..., -1, :] *= 1.5
    else:
        last_head[:, -1] *= 1.5
    assert not check.check_output(last_head, pieces)[0]
    nan = full.clone()
    nan.view(-1)[-1] = float("nan")
    ok, err = check.check_output(nan, pieces)
    assert not ok and math.isinf(err)


def _top_left_causal(inputs):
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * inputs.scale
    Sq, Sk = s.shape[-2:]
    s = s.masked_fill(torch.ones(Sq, Sk, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def test_row_windows_and_key_extent():
    assert check.row_windows(10, 8) == [(0, 10)]
    assert check.row_windows(100, 8) == [(0, 8), (92, 100)]
    assert check.key_extent(8, 100, 100, True) == 8
    assert check.key_extent(8, 100, 150, True) == 58
    assert check.key_extent(8, 100, 40, True) == -52  # every row of the window sees no key
    assert check.key_extent(8, 100, 40, False) == 40


def test_describe_mismatch():
    inputs = B.make_inputs(Shape.dense(1, 2, 8, 16), torch.float32, "cpu")
    assert check.describe_mismatch(torch.zeros(1, 2, 8, 16), inputs) is None
    assert "expected (1, 2, 8, 16)" in check.describe_mismatch(torch.zeros(1, 8, 2, 16), inputs)
    assert "not a tensor" in check.describe_mismatch((torch.zeros(1),), inputs)


# ---------------------------------------------------------------- declarations
REG = B.make_registry()


def _status(name, shape, dtype=torch.bfloat16):
    return REG[name].check_shape(shape, dtype)


def test_backends_declare_their_limits():
    dense = Shape.dense(1, 8, 512, 64)
    cross = Shape.dense(1, 8, 512, 64, causal=True, Sk=1024)
    varlen = Shape.packed([100, 200], 8, 64)
    assert all(_status(n, dense)[0] == "ok" for n in B.BACKEND_NAMES)
    # bottom-right causal with Sq != Sk: SDPA's is_causal means top-left
    for name in ("sdpa-default", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math"):
        assert _status(name, cross) == ("unsupported", REG[name].support.check(cross, torch.bfloat16)[1])
        assert "Sq != Sk" in _status(name, cross)[1]
    for name in ("flashcore", "flashcore-secure", "flex", "fa4", "unfused"):
        assert _status(name, cross)[0] == "ok"
    assert {n for n in B.BACKEND_NAMES if _status(n, varlen)[0] == "ok"} == {"flashcore", "flex", "fa4"}
    assert _status("fa4", Shape.dense(1, 8, 512, 80))[0] == "unsupported"
    assert _status("sdpa-flash", dense, torch.float32)[0] == "unsupported"
    assert _status("flashcore", dense, torch.float32)[0] == "ok"


def test_policy_skips_math_for_long_sequences_and_unfused_for_huge_scores():
    assert _status("sdpa-math", Shape.dense(1, 32, 8192, 128))[0] == "ok"
    status, why = _status("sdpa-math", Shape.dense(1, 32, 16384, 128))
    assert status == "skipped" and "8192" in why
    assert B.make_registry(None)["sdpa-math"].check_shape(Shape.dense(1, 32, 16384, 128), torch.bfloat16)[0] == "ok"
    assert _status("unfused", Shape.dense(4, 32, 4096, 128))[0] == "ok"  # 4 GiB of scores
    status, why = _status("unfused", Shape.dense(1, 32, 16384, 128))  # 16 GiB of scores
    assert status == "skipped" and "GiB" in why
    ok, why = REG["unfused"].supports(Shape.dense(1, 16, 32768, 128))
    assert not ok and why


def test_availability_without_gpu_says_why():
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    for name, backend in REG.items():
        ok, why = backend.available()
        assert not ok and why, name


def test_parse_backend_names():
    assert B.parse_backend_names(None) == list(B.BACKEND_NAMES)
    assert B.parse_backend_names(["flashcore,fa4", "sdpa-flash", "fa4"]) == ["flashcore", "fa4", "sdpa-flash"]
    with pytest.raises(ValueError, match="unknown backend 'cudnn'"):
        B.parse_backend_names(["cudnn"])


def test_inputs_for_secure_mode_and_varlen():
    dense = B.make_inputs(Shape.dense(2, 4, 10, 8, Sk=12, Hkv=2), torch.float16, "cpu")
    assert dense.q.shape == (2, 4, 10, 8) and dense.k.shape == (2, 2, 12, 8) and dense.q.dtype == torch.float16
    assert dense.seqlens_q.tolist() == [10, 10] and dense.seqlens_k.tolist() == [12, 12]
    assert dense.seqlens_k.dtype == torch.int32
    packed = B.make_inputs(Shape.packed([3, 0, 5], 4, 8), torch.float32, "cpu")
    assert packed.q.shape == (8, 4, 8) and packed.cu_seqlens.tolist() == [0, 3, 3, 8]
    assert packed.cu_seqlens.dtype == torch.int32
    other = B.make_inputs(Shape.dense(2, 4, 10, 8), torch.float16, "cpu", seed=1)
    assert not torch.equal(other.q, B.make_inputs(Shape.dense(2, 4, 10, 8), torch.float16, "cpu").q)
