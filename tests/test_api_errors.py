"""Bad input gets a ValueError/TypeError naming the argument, before any kernel runs, on every backend."""
import os

import pytest
import torch

import flashcore

# Every check belongs to the one validation layer that every backend passes through: each bad input is
# tried on each backend ("triton" runs the kernels under the interpreter on CPU).
BACKENDS = ["reference", "auto"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else [])


def t(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


GOOD = dict(q=t(1, 4, 16, 64), k=t(1, 2, 16, 64), v=t(1, 2, 16, 64))


def call(**kw):
    args = dict(GOOD)
    args.update(kw)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    args.setdefault("backend", "reference")
    return flashcore.attention(q, k, v, **args)


def every_backend(test):
    return pytest.mark.parametrize("backend", BACKENDS)(test)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(k=t(1, 2, 16, 64, dtype=torch.float32)), ValueError, "dtype"),
    (dict(q=t(1, 4, 16, 64).to(torch.int32)), TypeError, "q must be float16"),
    (dict(v=torch.randint(0, 3, (1, 2, 16, 64))), TypeError, "v must be float16"),
    (dict(q="not a tensor"), TypeError, "q must be a torch.Tensor"),
    (dict(k=t(1, 2, 16, 32), v=t(1, 2, 16, 32)), ValueError, "head dim"),
    (dict(q=t(1, 3, 16, 64)), ValueError, "multiple of the number of k/v heads"),
    (dict(q=t(1, 4, 16, 12), k=t(1, 2, 16, 12), v=t(1, 2, 16, 12)), ValueError, "head dim 12"),
    (dict(q=t(1, 4, 16, 264), k=t(1, 2, 16, 264), v=t(1, 2, 16, 264)), ValueError, "head dim 264"),
    (dict(q=t(4, 16, 64)), ValueError, "q must be 4-D"),
    (dict(q=t(1, 4, 16, 128)[..., ::2]), ValueError, "unit stride"),
    (dict(k=t(1, 2, 16, 64), v=t(1, 2, 17, 64)), ValueError, "same shape"),
    (dict(q=t(2, 4, 16, 64)), ValueError, "batch"),
    (dict(layout="sbhd"), ValueError, "layout"),
    (dict(backend="cuda"), ValueError, "backend"),
    (dict(scale=-1.0), ValueError, "scale"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(scale="x"), TypeError, "scale"),
    (dict(secure=True), ValueError, "seqlens_k"),
    (dict(seqlens_k=torch.ones(1, dtype=torch.int32)), ValueError, "secure=True"),
    (dict(secure=True, seqlens_k=torch.ones(1, dtype=torch.int64)), TypeError, "seqlens_k must be int32"),
    (dict(secure=True, seqlens_k=torch.ones(2, dtype=torch.int32)), ValueError, r"seqlens_k must have shape \[B\]"),
    (dict(secure=True, seqlens_k=[16]), TypeError, "seqlens_k"),
    (dict(out=torch.empty(1, 4, 16, 32, dtype=torch.float16)), ValueError, "out must match"),
    (dict(secure=True, seqlens_k=torch.tensor([17], dtype=torch.int32)), ValueError, r"seqlens_k in \[0, 16\]"),
    (dict(secure=True, seqlens_k=torch.tensor([-1], dtype=torch.int32)), ValueError, r"seqlens_k in \[0, 16\]"),
    (dict(causal="yes"), TypeError, "causal must be a bool"),
    (dict(causal=1), TypeError, "causal must be a bool"),
    (dict(secure="no", seqlens_k=torch.ones(1, dtype=torch.int32)), ValueError, "secure must be a bool or .strict."),
    (dict(secure=2, seqlens_k=torch.ones(1, dtype=torch.int32)), TypeError, "secure must be a bool or .strict."),
    (dict(return_lse=None), TypeError, "return_lse must be a bool"),
    (dict(validate_seqlens=0), TypeError, "validate_seqlens must be a bool"),
    (dict(scale=torch.tensor(0.1)), TypeError, "scale must be a real number"),
    (dict(scale=__import__("fractions").Fraction(1, 10)), TypeError, "scale=Fraction.*exactly"),
    (dict(scale=True), TypeError, "scale must be a real number"),
    (dict(q=t(2, 4, 16, 64), k=t(2, 2, 16, 64), v=t(2, 2, 16, 64), secure=True,
          seqlens_k=torch.ones(4, dtype=torch.int32)[::2]), ValueError, "seqlens_k must be contiguous"),
])
@every_backend
def test_dense_bad_input(kw, exc, match, backend):
    with pytest.raises(exc, match=match):
        call(**{"backend": backend, **kw})


@every_backend
def test_out_overlapping_an_input_is_refused(backend):
    q, k, v = (x.clone() for x in (GOOD["q"], GOOD["k"], GOOD["v"]))
    with pytest.raises(ValueError, match="out must not overlap q"):
        flashcore.attention(q, k, v, out=q, backend=backend)
    kv = t(1, 4, 16, 64)  # out aliases the storage of k and v (a different view of the same memory)
    with pytest.raises(ValueError, match="out must not overlap k"):
        flashcore.attention(t(1, 4, 16, 64), kv[:, :2], kv[:, 2:], out=kv, backend=backend)


@every_backend
def test_numpy_scalars_are_accepted(backend):
    np = pytest.importorskip("numpy")
    q, k, v = (x.float() for x in (GOOD["q"], GOOD["k"], GOOD["v"]))
    got = flashcore.attention(q, k, v, scale=np.float32(0.1), causal=np.bool_(True), backend=backend)
    want = flashcore.attention(q, k, v, scale=float(np.float32(0.1)), causal=True, backend=backend)
    assert torch.equal(got, want)
    qv, kv = t(10, 4, 32, dtype=torch.float32), t(12, 2, 32, dtype=torch.float32)
    cu_q, cu_k = torch.tensor([0, 4, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    got = flashcore.attention_varlen(qv, kv, kv, cu_q, cu_k, np.int64(6), np.int32(7), scale=np.float64(0.2),
                                     backend=backend)
    want = flashcore.attention_varlen(qv, kv, kv, cu_q, cu_k, 6, 7, scale=0.2, backend=backend)
    assert torch.equal(got, want)


def test_secure_needs_seqlens_q_when_lengths_differ():
    q = t(1, 2, 8, 64)
    k = t(1, 2, 16, 64)
    with pytest.raises(ValueError, match="seqlens_q"):
        flashcore.attention(q, k, k, secure=True, seqlens_k=torch.tensor([3], dtype=torch.int32), backend="reference")


@pytest.mark.interp
def test_secure_out_of_range_lengths_raise():
    q = t(2, 2, 16, 32)
    for bad in ([17, 3], [-1, 3]):
        with pytest.raises(ValueError, match="seqlens"):
            flashcore.attention(q, q, q, secure=True, seqlens_k=torch.tensor(bad, dtype=torch.int32), backend="triton")


def test_triton_backend_on_cpu_without_interpreter_is_explained(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        call(backend="triton")


@pytest.mark.interp
def test_switching_the_interpreter_off_reaches_a_warm_call(monkeypatch):
    """A call whose plan was made under the interpreter is refused, not served from that plan, once it is off."""
    q = t(1, 2, 16, 32)
    flashcore.attention(q, q, q, backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        flashcore.attention(q, q, q, backend="triton")


def _varlen(backend="reference", **kw):
    q, k = t(10, 4, 32), t(12, 2, 32)
    args = dict(q=q, k=k, v=k.clone(), cu_seqlens_q=torch.tensor([0, 4, 10], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 5, 12], dtype=torch.int32), max_seqlen_q=6, max_seqlen_k=7)
    args.update(kw)
    return flashcore.attention_varlen(**args, backend=backend)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(cu_seqlens_q=torch.tensor([0, 6, 4], dtype=torch.int32)), ValueError, "non-decreasing"),
    (dict(cu_seqlens_q=torch.tensor([1, 4, 10], dtype=torch.int32)), ValueError, "start at 0"),
    (dict(cu_seqlens_k=torch.tensor([0, 5, 13], dtype=torch.int32)), ValueError, "only 12 tokens"),
    (dict(max_seqlen_q=5), ValueError, "max_seqlen_q=5 is smaller"),
    (dict(max_seqlen_k=-1), ValueError, "max_seqlen_k"),
    (dict(cu_seqlens_q=torch.tensor([0, 4, 10], dtype=torch.int64)), TypeError, "cu_seqlens_q must be int32"),
    (dict(cu_seqlens_k=torch.tensor([0, 12], dtype=torch.int32)), ValueError, "N\\+1 entries"),
    (dict(q=t(10, 4, 1, 32)), ValueError, "q must be 3-D"),
    (dict(q=t(10, 3, 32)), ValueError, "multiple of the number of k/v heads"),
    (dict(q=t(10, 4, 32, dtype=torch.float32)), ValueError, "dtype"),
    (dict(causal="yes"), TypeError, "causal must be a bool"),
    (dict(return_lse=1), TypeError, "return_lse must be a bool"),
    (dict(max_seqlen_q=6.5), ValueError, "max_seqlen_q must be a whole number"),
    (dict(max_seqlen_q="6"), TypeError, "max_seqlen_q must be an int"),
    (dict(max_seqlen_k=True), TypeError, "max_seqlen_k must be an int"),
    (dict(cu_seqlens_q=torch.tensor([0, 0, 4, 0, 10, 0], dtype=torch.int32)[::2]), ValueError,
     "cu_seqlens_q must be contiguous"),
    # out=: the varlen entry point checks it as the dense one does (mutation survivors 325/326 of _checks.py)
    (dict(out=t(10, 4, 16)), ValueError, "out must match q's shape"),
    (dict(out=t(10, 4, 32, dtype=torch.float32)), ValueError, "out must match q's shape/dtype"),
])
@every_backend
def test_varlen_bad_input(kw, exc, match, backend):
    with pytest.raises(exc, match=match):
        _varlen(backend=backend, **kw)


@pytest.mark.interp
def test_varlen_bad_cu_seqlens_checked_on_triton_path_too():
    with pytest.raises(ValueError, match="smaller than a real sequence length"):
        q, k = t(10, 4, 32), t(12, 2, 32)
        flashcore.attention_varlen(q, k, k, torch.tensor([0, 4, 10], dtype=torch.int32),
                                   torch.tensor([0, 5, 12], dtype=torch.int32), 5, 7, backend="triton")


@every_backend
def test_varlen_out_overlapping_k_is_refused(backend):
    """The overlap check names k too, not only q (mutation survivor 325 of _checks.py dropped k from it)."""
    k = t(24, 2, 32)
    q = t(10, 4, 32)
    out = k.view(-1)[: q.numel()].view(q.shape)  # shares k's memory
    with pytest.raises(ValueError, match="out must not overlap k"):
        flashcore.attention_varlen(q, k, k.clone(), torch.tensor([0, 4, 10], dtype=torch.int32),
                                   torch.tensor([0, 5, 12], dtype=torch.int32), 6, 7, out=out, backend=backend)


@pytest.mark.parametrize("bad", [[-1, 3], [17, 3]])
@pytest.mark.parametrize("side", ["q", "k"])
def test_secure_lengths_out_of_range_on_one_side_only_raise(bad, side):
    """One side out of range is enough (mutation survivor 131: the two sides' test joined by `&`)."""
    q, k = t(2, 2, 16, 32), t(2, 2, 16, 32)
    good = torch.tensor([16, 3], dtype=torch.int32)
    lens = torch.tensor(bad, dtype=torch.int32)
    kw = dict(seqlens_q=lens, seqlens_k=good) if side == "q" else dict(seqlens_q=good, seqlens_k=lens)
    with pytest.raises(ValueError, match="must lie in"):
        flashcore.attention(q, k, k, secure=True, backend="reference", **kw)


@pytest.mark.parametrize("shape_q,shape_k", [((1, 2, 0, 32), (1, 2, 8, 32)), ((1, 2, 8, 32), (1, 2, 0, 32)),
                                             ((0, 2, 8, 32), (0, 2, 8, 32))])
@every_backend
def test_one_empty_dimension_is_refused(shape_q, shape_k, backend):
    """Any one of B, Sq, Sk zero is refused (mutation survivor 251: the test joined by `and`)."""
    q, k = t(*shape_q), t(*shape_k)
    with pytest.raises(ValueError, match="must be >= 1"):
        flashcore.attention(q, k, k.clone(), backend=backend)


@pytest.mark.interp
def test_varlen_k_alone_requiring_grad_with_out_is_refused_on_the_kernel_route():
    """k alone wanting a gradient counts too (mutation survivor 325 of _checks.py dropped k from the check): with
    out= (which cannot carry the gradient) the call is refused, naming k."""
    q, k = t(10, 4, 32), t(12, 2, 32).requires_grad_(True)
    with pytest.raises(RuntimeError, match="^k requires grad, but out= is given"):
        flashcore.attention_varlen(q, k, k.detach().clone(), torch.tensor([0, 4, 10], dtype=torch.int32),
                                   torch.tensor([0, 5, 12], dtype=torch.int32), 6, 7, backend="triton",
                                   out=torch.empty_like(q))


@every_backend
def test_out_overlapping_an_input_is_refused_after_a_call_with_the_same_facts(backend):
    """A repeat call (a plan-cache hit: its key holds out's alignment, not its address) checks out's memory against
    q, k and v as a first call does (a warm call with out=q wrote into q while it was read, review of session 46)."""
    q, k, v = (x.clone() for x in (GOOD["q"], GOOD["k"], GOOD["v"]))
    flashcore.attention(q, k, v, out=torch.empty_like(q), backend=backend)  # the same facts, a separate out
    with pytest.raises(ValueError, match="out must not overlap q"):
        flashcore.attention(q, k, v, out=q, backend=backend)
