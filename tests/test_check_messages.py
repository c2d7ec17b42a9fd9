"""The validation layer names the argument that is wrong (and accepts the edge cases it documents).

Found by mutation testing of ``flashcore._checks``: a check whose argument names were shuffled, whose
batch check was weakened so that another check raised with a message about something else, or whose
type check on ``max_seqlen`` was disabled, passed every other test (they match a word of the message,
or the error came from a later check)."""
import pytest
import torch

import flashcore


def t(*shape, dtype=torch.float16, device="cpu"):
    return torch.randn(*shape).to(dtype).to(device)


def _raises(exc, fn):
    with pytest.raises(exc) as info:
        fn()
    return str(info.value)


@pytest.mark.parametrize("odd", ["q", "k", "v"])
def test_dense_mismatched_dtype_and_device_name_the_odd_tensor(odd):
    def args(attr_value):
        a = dict(q=t(1, 4, 16, 64), k=t(1, 2, 16, 64), v=t(1, 2, 16, 64))
        a[odd] = attr_value(a[odd])
        return a

    a = args(lambda x: x.float())
    msg = _raises(ValueError, lambda: flashcore.attention(a["q"], a["k"], a["v"], backend="reference"))
    assert f"{odd}.dtype=torch.float32" in msg, msg
    assert all(f"{n}.dtype=torch.float16" in msg for n in "qkv" if n != odd), msg
    a = args(lambda x: x.to("meta"))
    msg = _raises(ValueError, lambda: flashcore.attention(a["q"], a["k"], a["v"], backend="reference"))
    assert f"{odd}.device=meta" in msg, msg


@pytest.mark.parametrize("odd", ["q", "k", "v"])
def test_varlen_mismatched_dtype_and_device_name_the_odd_tensor(odd):
    cu_q, cu_k = torch.tensor([0, 4, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)

    def call(a):
        return flashcore.attention_varlen(a["q"], a["k"], a["v"], cu_q, cu_k, 6, 7, backend="reference")

    base = dict(q=t(10, 4, 32), k=t(12, 2, 32), v=t(12, 2, 32))
    msg = _raises(ValueError, lambda: call(dict(base, **{odd: base[odd].float()})))
    assert f"{odd}.dtype=torch.float32" in msg, msg
    msg = _raises(ValueError, lambda: call(dict(base, **{odd: base[odd].to("meta")})))
    assert f"{odd}.device=meta" in msg, msg


@pytest.mark.parametrize("which", ["k", "v", "kv"])
def test_batch_mismatch_is_reported_as_such(which):
    q = t(1, 4, 16, 64)
    k = t(2 if "k" in which else 1, 2, 16, 64)
    v = t(2 if "v" in which else 1, 2, 16, 64)
    msg = _raises(ValueError, lambda: flashcore.attention(q, k, v, backend="reference"))
    assert "batch" in msg, msg


def _varlen(**kw):
    q, k = t(10, 4, 32), t(12, 2, 32)
    args = dict(q=q, k=k, v=k.clone(), cu_seqlens_q=torch.tensor([0, 4, 10], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 5, 12], dtype=torch.int32), max_seqlen_q=6, max_seqlen_k=7)
    args.update(kw)
    return flashcore.attention_varlen(**args, backend="reference")


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_must_be_tensors(name):
    msg = _raises(TypeError, lambda: _varlen(**{name: [0, 4, 10] if name.endswith("q") else [0, 5, 12]}))
    assert name in msg, msg


@pytest.mark.parametrize("name", ["max_seqlen_q", "max_seqlen_k"])
@pytest.mark.parametrize("bad", [7.5, True, "7", None])
def test_max_seqlen_must_be_a_non_negative_int(name, bad):
    msg = _raises((TypeError, ValueError), lambda: _varlen(**{name: bad}))
    assert name in msg, msg


def test_all_sequences_empty_with_max_seqlen_zero_is_valid():
    q, k = t(0, 4, 32), t(0, 2, 32)
    cu = torch.zeros(3, dtype=torch.int32)
    out, lse = flashcore.attention_varlen(q, k, k.clone(), cu, cu, 0, 0, backend="reference", return_lse=True)
    assert out.shape == (0, 4, 32) and lse.shape == (4, 0)
    # and an empty query side beside non-empty keys
    k = t(12, 2, 32)
    out = flashcore.attention_varlen(q, k, k.clone(), cu, torch.tensor([0, 5, 12], dtype=torch.int32), 0, 7,
                                     backend="reference")
    assert out.shape == (0, 4, 32)
