"""flashcore as a transformers attention implementation (flashcore.integrations.transformers), on CPU: a tiny
random Llama in fp32 with flashcore's Triton kernels under the interpreter, against the same weights on
transformers' ``sdpa``. Skipped without transformers >= 5 (CI installs the ``transformers`` extra)."""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"needs transformers >= 5, found {transformers.__version__}", allow_module_level=True)

from transformers import AttentionInterface, AutoModelForCausalLM, DynamicCache, LlamaConfig  # noqa: E402
from transformers import masking_utils as mu  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.utils.generic import is_flash_attention_requested  # noqa: E402

import flashcore  # noqa: E402
from conftest import INTERPRET  # noqa: E402
from flashcore.integrations import transformers as fc_hf  # noqa: E402

kernels = pytest.mark.skipif(not INTERPRET, reason="runs flashcore's Triton kernels on CPU (TRITON_INTERPRET=1)")
TOL = 2e-4  # relative, fp32 logits (the two implementations sum in different orders)


@pytest.fixture(scope="module")
def name():
    # the kernels under the interpreter on CPU (on a GPU machine these tests are skipped: test_transformers_gpu.py)
    return fc_hf.register(backend="triton" if INTERPRET else "reference")


@pytest.fixture
def calls(monkeypatch):
    """The flashcore entry points the integration called, with q's shape, during the test."""
    seen = []
    for fn in ("attention", "attention_varlen", "attention_with_kvcache", "kvcache_step"):
        real = getattr(flashcore, fn)

        def spy(*args, _real=real, _fn=fn, **kwargs):
            seen.append((_fn, tuple(args[0].shape)))
            return _real(*args, **kwargs)
        monkeypatch.setattr(flashcore, fn, spy)
    run = flashcore.KVCacheStep.run

    def run_spy(self, q, *args, **kwargs):
        seen.append(("run", tuple(q.shape)))
        return run(self, q, *args, **kwargs)
    monkeypatch.setattr(flashcore.KVCacheStep, "run", run_spy)
    return seen


DECODE = ["kvcache_step", "run", "run"]  # a decode forward pass of the 2-layer models: one step planned, run per layer


def config(**kw):
    # initializer_range 0.5: sharp attention, so a wrong mask or alignment moves the logits well past TOL
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.5,
                bos_token_id=1, eos_token_id=None, pad_token_id=0)
    base.update(kw)
    return LlamaConfig(**base)


def twins(name, cfg=None, cls=AutoModelForCausalLM):
    """(sdpa model, flashcore model) with the same random weights."""
    cfg = cfg or config()
    torch.manual_seed(0)
    ref = cls.from_config(copy.deepcopy(cfg), attn_implementation="sdpa").eval()
    ours = cls.from_config(copy.deepcopy(cfg), attn_implementation=name).eval()
    ours.load_state_dict(ref.state_dict())
    assert ref.config._attn_implementation == "sdpa" and ours.config._attn_implementation == name
    return ref, ours


@pytest.fixture(scope="module")
def models(name):
    return twins(name)


def batch(lengths, total, seed=1, side="left"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (len(lengths), total), generator=g)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for b, n in enumerate(lengths):
        if side == "left":
            mask[b, total - n:] = 1
        else:
            mask[b, :n] = 1
    return ids, mask


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def logits(model, ids, mask=None, **kw):
    with torch.no_grad():
        return model(ids, attention_mask=mask, **kw).logits


def greedy(model, ids, mask, n, **kw):
    """(new tokens [B, n], each step's logits [B, n, V])."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, **kw)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)


def assert_same_generation(ours, ref, ids, mask, n, **kw):
    got, got_logits = greedy(ours, ids, mask, n, **kw)
    want, want_logits = greedy(ref, ids, mask, n, **kw)
    assert torch.equal(got, want)
    assert rel(got_logits, want_logits) < TOL  # every step's logits, not only their argmax


# ------------------------------------------------------------------------------------------- registration

def test_registered_name_is_not_routed_to_transformers_flash_loader(name):
    assert name == fc_hf.NAME == "fcore"
    assert "flash" not in name and not is_flash_attention_requested(requested_attention_implementation=name)
    assert name in AttentionInterface._global_mapping and name in mu.AttentionMaskInterface._global_mapping
    with pytest.raises(ValueError, match="flash"):
        fc_hf.register("flashcore")
    with pytest.raises(ValueError, match="backend"):
        fc_hf.register("fcore_x", backend="cuda")


def test_set_attn_implementation_switches_an_sdpa_model(name):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(), attn_implementation="sdpa").eval()
    ids, mask = batch([7], 7)
    before = logits(model, ids, mask)
    model.set_attn_implementation(name)
    assert model.config._attn_implementation == name
    assert model.model.layers[0].self_attn.config._attn_implementation == name
    assert rel(logits(model, ids, mask), before) < TOL


# --------------------------------------------------------------------------------------- logits vs sdpa

@kernels
def test_logits_batch1(models, calls):
    ref, ours = models
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(2))
    want = logits(ref, ids)
    assert rel(logits(ours, ids), want) < TOL
    assert calls == [("attention", (1, 40, 4, 16))] * 2  # no mask: dense, one call per layer
    calls.clear()
    assert rel(logits(ours, ids, torch.ones_like(ids)), want) < TOL  # an all-ones mask: dense too
    assert [c[0] for c in calls] == ["attention"] * 2


@kernels
@pytest.mark.parametrize("side", ["left", "right"])
def test_logits_padded_batch(models, calls, side):
    """Every row, padding rows included (a left-padding row sees no key: zero in both; a right-padding row sees
    all of its sequence)."""
    ref, ours = models
    ids, mask = batch([30, 23, 9, 1], 30, side=side)
    assert rel(logits(ours, ids, mask), logits(ref, ids, mask)) < TOL
    want = {"left": ["attention_varlen"] * 2, "right": ["attention_varlen"] * 4}[side]
    assert [c[0] for c in calls] == want
    assert calls[0][1] == (30 + 23 + 9 + 1, 4, 16)  # the unpadded tokens


@kernels
def test_logits_chunked_with_cache(models, calls):
    """A left-padded batch fed in chunks through a DynamicCache: 12 tokens, 3 (the decode kernel with several
    queries), 1, then 19 (varlen with a cache)."""
    ref, ours = models
    ids, mask = batch([35, 26, 20], 35, seed=3)
    got = []
    for model in (ref, ours):
        cache, parts = DynamicCache(config=model.config), []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # past_key_values -> cache (5.24; 5.17 knows only the former)
            for lo, hi in ((0, 12), (12, 15), (15, 16), (16, 35)):
                parts.append(logits(model, ids[:, lo:hi], mask[:, :hi], past_key_values=cache, use_cache=True))
        got.append(torch.cat(parts, 1))
    assert rel(got[1], got[0]) < TOL
    assert [c[0] for c in calls] == DECODE * 3 + ["attention_varlen"] * 2


# ---------------------------------------------------------------------------------------- greedy generation

@kernels
def test_greedy_generation_batch1(models, calls):
    ref, ours = models
    ids, mask = batch([21], 21, seed=4)
    assert_same_generation(ours, ref, ids, mask, 8)
    # prefill through the dense kernel, every decode step through the KV-cache kernel
    assert [c[0] for c in calls] == ["attention"] * 2 + DECODE * 7


@kernels
def test_greedy_generation_left_padded_batch(models, calls):
    ref, ours = models
    ids, mask = batch([23, 9, 3, 18], 23, seed=5)
    assert_same_generation(ours, ref, ids, mask, 8)
    assert [c[0] for c in calls] == ["attention_varlen"] * 2 + DECODE * 7
    assert calls[-1][1] == (4, 1, 4, 16)


@kernels
def test_static_cache(models):
    """A StaticCache: keys past the last query are empty slots (the mask function marks them), with a padding
    mask (generation) and without one (a forward pass: prefill, then two decode steps)."""
    ref, ours = models
    ids, mask = batch([19, 6], 19, seed=6)
    assert_same_generation(ours, ref, ids, mask, 5, cache_implementation="static")
    ids, got = torch.randint(3, 128, (1, 21), generator=torch.Generator().manual_seed(6)), []
    for model in (ref, ours):
        cache, parts = transformers.StaticCache(config=model.config, max_cache_len=40), []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            for lo, hi in ((0, 19), (19, 20), (20, 21)):
                parts.append(logits(model, ids[:, lo:hi], None, past_key_values=cache, use_cache=True))
        got.append(torch.cat(parts, 1))
    assert rel(got[1], got[0]) < TOL


# ------------------------------------------------------------- the attention function against transformers' sdpa

class _Module(torch.nn.Module):
    def __init__(self, is_causal=True, groups=2):
        super().__init__()
        self.is_causal, self.num_key_value_groups = is_causal, groups


MASKS = {  # name: (2-D mask rows over positions [0, past + Sq), q_offset, Sq, mask function)
    "left, decode": ([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1]], 6, 1, "causal"),
    "right, decode past the end": ([[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0]], 6, 1, "causal"),
    "empty row, decode": ([[0, 0, 0, 0, 0], [0, 1, 1, 1, 1]], 4, 1, "causal"),
    "left, 3 queries": ([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]], 5, 3, "causal"),
    "right, 3 queries": ([[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0]], 5, 3, "causal"),
    "both sides, prefill": ([[0] * 3 + [1] * 20 + [0] * 2, [1] * 25, [0] * 25], 0, 25, "causal"),
    "right, chunk of 20": ([[1] * 22 + [0] * 3, [0] * 5 + [1] * 20], 5, 20, "causal"),
    "bidirectional, padding": ([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], 0, 6, "bidirectional"),
    "bidirectional, 20": ([[1] * 17 + [0] * 3, [0] * 20], 0, 20, "bidirectional"),
    "bidirectional, all empty": ([[0] * 20, [0] * 20], 0, 20, "bidirectional"),
    "bidirectional, no padding": ([[1] * 20, [1] * 20], 0, 20, "bidirectional"),
}


@kernels
@pytest.mark.parametrize("case", list(MASKS))
def test_attention_function_matches_sdpa(name, calls, case):
    """The attention function with flashcore's mask, against transformers' sdpa function with sdpa's mask built
    from the same arguments: padding on either side, empty sequences, several queries, bidirectional."""
    rows, q_offset, Sq, kind = MASKS[case]
    pad = torch.tensor(rows, dtype=torch.bool)
    B, K = pad.shape
    fn = {"causal": mu.causal_mask_function, "bidirectional": mu.bidirectional_mask_function}[kind]
    args = dict(batch_size=B, q_length=Sq, kv_length=K, q_offset=q_offset, kv_offset=0, mask_function=fn,
                attention_mask=pad, allow_is_causal_skip=False, device="cpu")
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, 4, Sq, 16, generator=g) * 3
    k, v = torch.randn(B, 2, K, 16, generator=g) * 3, torch.randn(B, 2, K, 16, generator=g)
    module = _Module(is_causal=kind == "causal")
    want, _ = sdpa_attention_forward(module, q, k, v, mu.sdpa_mask(**args), scaling=0.3)
    attn = AttentionInterface._global_mapping[name]
    got, weights = attn(module, q, k, v, mu.ALL_MASK_ATTENTION_FUNCTIONS[name](**args), scaling=0.3)
    assert weights is None and got.shape == (B, Sq, 4, 16) and got.is_contiguous()
    assert (got - want).abs().max().item() < 1e-5
    routes = {"bidirectional, all empty": [], "bidirectional, no padding": ["attention"]}  # (dense: no padding)
    assert [c[0] for c in calls] == routes[case] if case in routes else calls and "attention" not in dict(calls)


def _sdpa_and_ours(name, module, q, k, v, sdpa_mask, our_mask, scaling=0.3):
    want, _ = sdpa_attention_forward(module, q, k, v, sdpa_mask, scaling=scaling)
    got, _ = AttentionInterface._global_mapping[name](module, q, k, v, our_mask, scaling=scaling)
    return got, want


@kernels
def test_other_masks_reaching_the_attention_function(name):
    """Masks that did not come from flashcore's mask function: a plain 2-D padding mask (FlashAttention's
    convention: causality from the module), a 4-D bidirectional padding mask, and none at all from a module
    without ``is_causal`` (causal: transformers' default)."""
    g = torch.Generator().manual_seed(10)
    q = torch.randn(2, 4, 20, 16, generator=g) * 3
    k, v = torch.randn(2, 2, 20, 16, generator=g) * 3, torch.randn(2, 2, 20, 16, generator=g)
    pad = torch.ones(2, 20, dtype=torch.bool)
    pad[0, :6] = False
    args = dict(batch_size=2, q_length=20, kv_length=20, attention_mask=pad, allow_is_causal_skip=False)
    got, want = _sdpa_and_ours(name, _Module(), q, k, v, mu.sdpa_mask(**args), pad.long())
    assert (got - want).abs().max().item() < 1e-5
    bidir = mu.sdpa_mask(**args, mask_function=mu.bidirectional_mask_function)
    got, want = _sdpa_and_ours(name, _Module(is_causal=False), q, k, v, bidir, bidir)
    assert (got - want).abs().max().item() < 1e-5
    bare = torch.nn.Module()
    bare.num_key_value_groups = 2
    got, want = _sdpa_and_ours(name, bare, q, k, v, None, None)
    assert (got - want).abs().max().item() < 1e-5


def test_chunked_attention_raises_naming_the_setting():
    cfg = config()
    cfg.attention_chunk_size = 8
    with pytest.raises(NotImplementedError, match=r"config\.attention_chunk_size"):
        fc_hf.mask_function(batch_size=1, q_length=4, kv_length=4, local_size=8, config=cfg)


def test_traced_decode_refuses_what_it_cannot_check():
    q, k, v = (t.transpose(1, 2) for t in _qkv(Sq=20, K=20))
    with pytest.raises(NotImplementedError, match="decode steps only"):
        fc_hf._traced_decode(q, k, v, None, True, None, "reference")
    q, k, v = (t.transpose(1, 2) for t in _qkv(Sq=1, K=20))
    with pytest.raises(ValueError, match="own padding mask"):
        fc_hf._traced_decode(q, k, v, torch.ones(1, 1, 1, 20, dtype=torch.bool), True, None, "reference")


@kernels
def test_unchecked_masks_skip_the_host_check(calls, monkeypatch):
    """register(validate_masks=False): a left-padded generation still equals sdpa's, every decode step runs the
    KV-cache kernel, and no step reads the mask back to the host."""
    ours_name = fc_hf.register("fcore_nocheck", backend="triton", validate_masks=False)
    ref, ours = twins(ours_name)
    ids, mask = batch([23, 9, 3, 18], 23, seed=5)
    want = greedy(ref, ids, mask, 6)
    host = []
    real = fc_hf._host_lengths
    monkeypatch.setattr(fc_hf, "_host_lengths", lambda pm, spec: host.append(spec.host is None) or real(pm, spec))
    got = greedy(ours, ids, mask, 6)
    assert torch.equal(got[0], want[0]) and rel(got[1], want[1]) < TOL
    assert [c[0] for c in calls] == ["attention_varlen"] * 2 + DECODE * 5
    assert host == [True, False]  # the prefill's layers (one sync, for the unpadding); none in the decode steps


@kernels
def test_four_dimensional_causal_padding_mask_is_mapped(models):
    """A 4-D mask (bool, or additive float) that is exactly causal + padding runs; the result equals sdpa's."""
    ref, ours = models
    ids, pad = batch([14, 8], 14, seed=8)
    m4 = mu.sdpa_mask(batch_size=2, q_length=14, kv_length=14, attention_mask=pad.bool(), allow_is_causal_skip=False)
    want = logits(ref, ids, m4)
    assert rel(logits(ours, ids, m4), want) < TOL
    additive = torch.zeros(m4.shape).masked_fill(~m4, torch.finfo(torch.float32).min)
    assert rel(logits(ours, ids, additive), want) < TOL


# ------------------------------------------------------------------------------------- refusals, naming the setting

def test_sliding_window_raises_naming_the_setting(name):
    cfg = transformers.MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=name).eval()
    with pytest.raises(NotImplementedError, match=r"config\.sliding_window"):
        logits(model, torch.randint(3, 128, (1, 12)))
    with pytest.raises(NotImplementedError, match=r"sliding_window=8.*config\.sliding_window"):  # the layer's own check
        fc_hf.attention_forward(_Module(), *_qkv(), None, sliding_window=8)


def _qkv(B=1, Sq=4, K=4):
    return torch.randn(B, 4, Sq, 16), torch.randn(B, 2, K, 16), torch.randn(B, 2, K, 16)


@pytest.mark.parametrize("kwargs, setting", [
    (dict(softcap=50.0), r"config\.attn_logit_softcapping"),
    (dict(s_aux=torch.zeros(4)), r"attention sinks.*s_aux"),
    (dict(dropout=0.1), r"config\.attention_dropout"),
    (dict(position_bias=torch.zeros(1, 4, 4, 4)), r"position_bias"),
    (dict(cu_seq_lens_q=torch.tensor([0, 4], dtype=torch.int32)), r"cu_seq_lens_q"),
])
def test_unsupported_features_raise_naming_the_setting(kwargs, setting):
    with pytest.raises(NotImplementedError, match=setting):
        fc_hf.attention_forward(_Module(), *_qkv(), None, **kwargs)


def test_value_head_dim_must_equal_query_head_dim():
    q, k, _ = _qkv()
    with pytest.raises(NotImplementedError, match="head dim"):
        fc_hf.attention_forward(_Module(), q, k, torch.randn(1, 2, 4, 8), None)


def test_training_dropout_raises_through_the_model(name):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(attention_dropout=0.1), attn_implementation=name)
    model.train()
    with torch.no_grad(), pytest.raises(NotImplementedError, match=r"config\.attention_dropout.*model\.eval"):
        model(torch.randint(3, 128, (1, 6)))
    model.eval()  # dropout off outside training: runs
    logits(model, torch.randint(3, 128, (1, 6)))


# ------------------------------------------------------------------------------------------------ bad masks

def test_mask_with_a_hole_raises(models):
    _, ours = models
    ids, mask = batch([20], 20)
    mask[0, 5] = 0
    with pytest.raises(ValueError, match="not one run"):
        logits(ours, ids, mask)


def test_generation_after_right_padding_raises(models):
    """Right-padded prompts continued by generation put padding in the middle of the mask: refused (a prefill
    with right padding alone is exact: test_logits_padded_batch)."""
    _, ours = models
    ids, mask = batch([9, 5], 9, side="right")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="one run.*padding_side"):
            greedy(ours, ids, mask, 3)


def test_four_dimensional_mask_that_is_not_causal_padding_raises(models):
    _, ours = models
    ids, pad = batch([12, 12], 12)
    m4 = mu.sdpa_mask(batch_size=2, q_length=12, kv_length=12, attention_mask=pad.bool(), allow_is_causal_skip=False)
    m4 = m4.clone()
    m4[1, 0, 7, 3] = False  # one hole
    with pytest.raises(ValueError, match="neither a causal"):
        logits(ours, ids, m4)
    bias = torch.zeros(m4.shape).masked_fill(~m4, float("-inf"))
    bias[0, 0, 5, 2] = -1.5  # a bias, not a mask
    with pytest.raises(ValueError, match="additive"):
        logits(ours, ids, bias)


def test_packed_sequences_mask_pattern_raises(models):
    """position_ids restarting inside a row (packed sequences) make transformers build another mask pattern."""
    _, ours = models
    ids = torch.randint(3, 128, (1, 8))
    with pytest.raises(ValueError, match="packed sequences"):
        logits(ours, ids, None, position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]]), use_cache=False)


@kernels
def test_compiled_decode_step(models):
    """A decode step traced by torch.compile (fullgraph; transformers compiles decode steps of generate with a
    static cache on CUDA): the traced path gives sdpa's logits on a left-padded batch."""
    ref, ours = models
    ids, mask = batch([20, 13], 20, seed=9)
    step_mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
    position = step_mask.sum(1, keepdim=True) - 1
    got = []
    for model, compiled in ((ref, False), (ours, True)):
        cache = transformers.StaticCache(config=model.config, max_cache_len=32)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            first = model(ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            torch._dynamo.reset()
            forward = torch.compile(model.forward, backend="eager", fullgraph=True) if compiled else model.forward
            got.append(forward(first, attention_mask=step_mask, past_key_values=cache, use_cache=True,
                               position_ids=position).logits)
    assert rel(got[1], got[0]) < TOL


@kernels
@pytest.mark.parametrize("seq, padded", [(24, False), (9, False), (24, True)], ids=["prefill", "short", "padded"])
def test_training_gradients_match_sdpa(name, calls, seq, padded):
    """A training step through the integration: every parameter's gradient equals sdpa's. Short sequences (<= 16
    tokens, which inference runs on the KV-cache kernel) and padded batches take the differentiable routes."""
    ref, ours = twins(name)
    ids = torch.randint(2, 128, (2, seq), generator=torch.Generator().manual_seed(seq))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, -7:] = 0  # right padding in the second sequence
    grads = []
    for model in (ref, ours):
        model.train()
        out = model(input_ids=ids, attention_mask=mask if padded else None, labels=ids)
        out.loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for n in grads[0]:
        err = ((grads[1][n] - grads[0][n]).norm() / grads[0][n].norm().clamp_min(1e-12)).item()
        assert err < 1e-4, f"{n}: {err:.2e}"
    assert calls and all(fn not in ("attention_with_kvcache", "kvcache_step", "run") for fn, _ in calls)


@kernels
@pytest.mark.parametrize("B,K", [(1, 1), (3, 7), (4, 37), (2, 5000)])
def test_mask_bounds_in_one_launch_match_pytorchs(B, K):
    """The first and one-past-last True position and the count of each row, in one launch (the integration's
    lengths of a forward pass): rows empty, full, one position, random, and a mask sliced out of a wider one."""
    g = torch.Generator().manual_seed(B * 7919 + K)
    wide = torch.rand(B, K + 5, generator=g) < 0.5
    pm = wide[:, 3:K + 3]
    pm[0] = False
    if B > 1:
        pm[1] = True
    if B > 2:
        pm[2] = False
        pm[2, K // 2] = True
    start, end, count = fc_hf._mask_bounds(pm)
    pos = torch.arange(K)
    want_end = torch.where(pm, pos + 1, 0).amax(1)
    want_start = torch.minimum(torch.where(pm, pos, K).amin(1), want_end)
    assert start.dtype == end.dtype == count.dtype == torch.int32
    assert torch.equal(start.long(), want_start) and torch.equal(end.long(), want_end)
    assert torch.equal(count.long(), pm.sum(1))


@kernels
@pytest.mark.parametrize("masked", [False, True], ids=["no mask", "padding mask"])
def test_decode_layers_of_two_kinds_each_plan_their_own_step(name, calls, masked):
    """A decode forward pass whose layers alternate between two kinds (other head dims here; other head counts,
    dtypes or devices alike): one step is planned per kind and every layer runs its kind's step (before session 46
    the first kind's step served both, so the other kind's layers took the full path on every call, and a layer on
    another GPU failed on its lengths' device), and each layer's output equals sdpa's."""
    g = torch.Generator().manual_seed(11)
    B, K = 2, 24
    pad = torch.ones(B, K, dtype=torch.bool)
    pad[0, :5] = False
    args = dict(batch_size=B, q_length=1, kv_length=K, q_offset=K - 1, kv_offset=0,
                mask_function=mu.causal_mask_function, attention_mask=pad if masked else None,
                allow_is_causal_skip=False, device="cpu")
    ours = mu.ALL_MASK_ATTENTION_FUNCTIONS[name](**args)
    theirs = mu.sdpa_mask(**dict(args, attention_mask=pad if masked else torch.ones(B, K, dtype=torch.bool)))
    module = _Module(is_causal=True)
    fc_hf._STEPS.__dict__.clear()
    for layer in range(4):
        D = (16, 32)[layer % 2]
        q = torch.randn(B, 4, 1, D, generator=g)
        k, v = torch.randn(B, 2, K, D, generator=g), torch.randn(B, 2, K, D, generator=g)
        got, want = _sdpa_and_ours(name, module, q, k, v, theirs, ours)
        assert (got - want).abs().max().item() < 1e-5
    assert [c[0] for c in calls] == ["kvcache_step", "run", "kvcache_step", "run", "run", "run"]
