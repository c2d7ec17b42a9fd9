"""flashcore as a transformers attention implementation on a GPU: random Llama, Qwen2 and Mistral models (GQA
32/8 heads, head dim 128, bf16) against the same weights on ``sdpa``. Skipped without CUDA or transformers >= 5.

    python3 -m pytest -q tests/test_transformers_gpu.py

* logits: flashcore's error against an fp32 copy of the same model stays within 2x (+2e-3) of sdpa's own bf16
  error (both printed), and within 3e-2 of sdpa's logits;
* greedy generation (batch 1; a left-padded batch of 8 with different prompt lengths): the first 32 tokens
  equal sdpa's, or a sequence departs at a near tie: the top-2 gap of sdpa's logits at the first differing
  token is at most ``TIE`` and the two logit vectors at that step agree within bf16 noise;
* the same with a static cache, whose decode steps transformers compiles (the integration's traced path);
* a Mistral with ``sliding_window`` set raises, naming ``config.sliding_window``."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"needs transformers >= 5, found {transformers.__version__}", allow_module_level=True)

from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config  # noqa: E402

import flashcore  # noqa: E402
from flashcore.integrations import transformers as fc_hf  # noqa: E402

pytestmark = pytest.mark.gpu

NEW_TOKENS = 32
PROMPTS = [37, 100, 5, 64, 128, 17, 90, 1]  # the left-padded batch of 8: real tokens per prompt
TIE = 0.0625  # logit units: 4 bf16 ulps of a logit in [2, 4)
SHAPE = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=32,
             num_key_value_heads=8, head_dim=128, max_position_embeddings=4096, bos_token_id=1, eos_token_id=None,
             pad_token_id=0)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SHAPE),
    "qwen2": lambda: Qwen2Config(**SHAPE),  # use_sliding_window=False: sliding_window None
    "mistral": lambda: MistralConfig(**SHAPE, sliding_window=None),
}


@pytest.fixture(scope="module")
def name():
    return fc_hf.register()


@pytest.fixture
def calls(monkeypatch):
    seen = []
    for fn in ("attention", "attention_varlen", "attention_with_kvcache", "kvcache_step"):
        real = getattr(flashcore, fn)

        def spy(*args, _real=real, _fn=fn, **kwargs):
            seen.append(_fn)
            return _real(*args, **kwargs)
        monkeypatch.setattr(flashcore, fn, spy)
    run = flashcore.KVCacheStep.run

    def run_spy(self, *args, **kwargs):
        seen.append("run")
        return run(self, *args, **kwargs)
    monkeypatch.setattr(flashcore.KVCacheStep, "run", run_spy)
    return seen


@pytest.fixture(scope="module", params=list(CONFIGS))
def models(request, name):
    """(sdpa bf16, flashcore bf16, sdpa fp32 copy of the same bf16 weights) of one architecture."""
    cfg = CONFIGS[request.param]()
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="sdpa", dtype=torch.bfloat16)
    ref = ref.cuda().eval()
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=name, dtype=torch.bfloat16)
    ours = ours.cuda().eval()
    ours.load_state_dict(ref.state_dict())
    truth = copy.deepcopy(ref).float().eval()
    assert ours.config._attn_implementation == name and ref.config._attn_implementation == "sdpa"
    yield request.param, ref, ours, truth
    del ref, ours, truth
    torch.cuda.empty_cache()


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = max(lengths)
    ids = torch.randint(3, SHAPE["vocab_size"], (len(lengths), total), generator=g)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, total - n:] = 1
        ids[b, :total - n] = SHAPE["pad_token_id"]
    return ids.cuda(), mask.cuda()


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("lengths", [[300], PROMPTS], ids=["batch1", "padded8"])
def test_logits_within_bf16_noise(models, calls, lengths):
    arch, ref, ours, truth = models
    ids, mask = prompts(lengths)
    with torch.no_grad():
        want = truth(ids, attention_mask=mask).logits
        got_sdpa = ref(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    real = mask.bool()  # padding rows: unspecified in sdpa's fused kernels
    err_sdpa, err = rel(got_sdpa[real], want[real]), rel(got[real], want[real])
    print(f"{arch} {len(lengths)}x{max(lengths)}: rel err vs fp32: sdpa {err_sdpa:.2e}, flashcore {err:.2e}")
    assert err <= 2 * err_sdpa + 2e-3, (err, err_sdpa)
    assert rel(got[real], got_sdpa[real]) < 3e-2
    want_calls = {1: "attention", 8: "attention_varlen"}[len(lengths)]
    assert calls == [want_calls] * SHAPE["num_hidden_layers"]


def generate(model, ids, mask, **kw):
    kw = dict(dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS), **kw)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, **kw)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1).float()  # [B, T], [B, T, V]


@pytest.mark.parametrize("lengths", [[300], PROMPTS], ids=["batch1", "padded8"])
def test_greedy_generation_equals_sdpa_or_departs_at_a_tie(models, calls, lengths):
    arch, ref, ours, _ = models
    ids, mask = prompts(lengths, seed=1)
    want, want_logits = generate(ref, ids, mask)
    got, got_logits = generate(ours, ids, mask)
    decode = calls[SHAPE["num_hidden_layers"]:]
    # every decode step on the KV-cache kernel: one step planned per forward pass, run by every layer
    assert set(decode) == {"kvcache_step", "run"}
    assert decode.count("run") == SHAPE["num_hidden_layers"] * decode.count("kvcache_step") > 0
    same_or_tied(arch, lengths, want, want_logits, got, got_logits)


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_static_cache_generation_compiled(models):
    """A static cache: transformers compiles the decode step on CUDA (torch.compile, mode "reduce-overhead":
    CUDA graphs), which runs the integration's traced decode path; sdpa runs eagerly as the reference."""
    arch, ref, ours, _ = models
    ids, mask = prompts(PROMPTS, seed=2)
    want, want_logits = generate(ref, ids, mask, cache_implementation="static", disable_compile=True)
    got, got_logits = generate(ours, ids, mask, cache_implementation="static")
    assert hasattr(ours, "_compiled_call"), "transformers did not compile the decode step"
    same_or_tied(arch + " static compiled", PROMPTS, want, want_logits, got, got_logits)


@pytest.mark.parametrize("lengths", [PROMPTS, [1500]], ids=["padded8", "batch1x1500"])
@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_static_cache_generation_compiled_at_several_lengths(models, lengths):
    """generate with a static cache called again with new lengths on the same model: each new cache length
    recompiles the decode step, the third with dynamic shapes (a symbolic cache length), where the integration's
    lengths from the padding mask once made Inductor emit a reduction it could not compile (perf-notes v60; the
    long prompt a looped reduction, and a cache long enough for split-KV). Each call's tokens as sdpa's (eager, the
    same static cache) or departing at a logit tie."""
    arch, ref, ours, _ = models
    ids, mask = prompts(lengths, seed=3)
    for n in (6, 1, 9, 12):
        want, want_logits = generate(ref, ids, mask, cache_implementation="static", disable_compile=True,
                                     max_new_tokens=n, min_new_tokens=n)
        got, got_logits = generate(ours, ids, mask, cache_implementation="static", max_new_tokens=n,
                                   min_new_tokens=n)
        assert got.shape == want.shape == (len(lengths), n)
        same_or_tied(f"{arch} static compiled, {n} new tokens", lengths, want, want_logits, got, got_logits)


def same_or_tied(arch, lengths, want, want_logits, got, got_logits):
    report = []
    for b in range(len(lengths)):
        diff = (got[b] != want[b]).nonzero()
        if len(diff) == 0:
            continue
        t = int(diff[0])  # the same prefix up to here: the two logit vectors of step t are comparable
        top2 = want_logits[b, t].topk(2).values
        gap = float(top2[0] - top2[1])
        step_err = rel(got_logits[b, t], want_logits[b, t])
        report.append(f"seq {b} departs at token {t}: sdpa top-2 gap {gap:.4f}, step logits rel err {step_err:.1e}")
        assert gap <= TIE and step_err < 3e-2, report[-1]
    print(f"{arch} {len(lengths)} prompt(s): {len(lengths) - len(report)} equal for {NEW_TOKENS} tokens; "
          + ("; ".join(report) or "no departures"))


def test_sliding_window_raises_naming_the_setting(name):
    cfg = MistralConfig(**{**SHAPE, "num_hidden_layers": 1}, sliding_window=64)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=name, dtype=torch.bfloat16).cuda().eval()
    ids, mask = prompts([100])
    with torch.no_grad(), pytest.raises(NotImplementedError, match=r"config\.sliding_window"):
        model(ids, attention_mask=mask)
