"""transformers generation with flashcore as the attention implementation (flashcore.integrations.transformers)
beside ``sdpa``, in one run on one model: prefill and decode tokens/s.

The model: a random-initialised Llama in bf16 of Llama-3-8B's layer width (hidden 4096, MLP 14336, 32 query /
8 K/V heads, head dim 128, rope theta 500000), 8 layers (``--layers``) and a 32000-token vocabulary (the lm_head
is not what is measured). One set of weights; the implementations switch with ``set_attn_implementation``.
Prompts are random tokens, all ``--prompt`` long (no padding); ``--padded`` also runs a left-padded batch with
prompt lengths spread between 1/4 and all of ``--prompt``.

* prefill: one forward pass of the batch (``use_cache=True, logits_to_keep=1``, what ``generate`` runs first),
  tokens/s = batch x prompt / time;
* decode: ``generate`` of ``--new`` + 1 tokens (greedy, ``min_new_tokens`` so that none stops early) minus
  ``generate`` of 1 token (its prefill and first token), tokens/s = batch x ``--new`` / that difference.
  transformers' DynamicCache concatenates K/V every step (the same cost for every implementation).

Implementations: ``sdpa``, ``fcore`` (the integration's default: one host sync per decode step checks the
padding mask) and ``fcore_nocheck`` (``register(validate_masks=False)``: no host sync in the attention of a
decode step). Each is warmed up first (Triton compiles, flashcore's plans), then measured ``--repeats`` times
(median). The greedy tokens of each implementation are compared with sdpa's (``agree``: the leading tokens
equal in every sequence, out of ``--new``; bf16 ties can make them part earlier).

    python -m flashcore.bench.experiments.hf_generate --out $OUT [--batches 1,32] [--prompt 2048] [--new 256]
        [--cache dynamic|static]

``--cache static``: generate with a StaticCache, whose decode step transformers compiles (CUDA graphs), so the
step's host time (Python, launches) drops out and the kernels' device time is what differs; every generate length
compiles once (in the warm-up or the first repeat, which the median over repeats leaves out).

Writes ``hf_generate.json`` (environment, model, per implementation and batch) and prints a table.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import torch

from ..report import generate_markdown_table
from ..results import collect_environment
from . import parser

IMPLS = ("sdpa", "fcore", "fcore_nocheck")


def _sync_time(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


def make_model(layers: int, vocab: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
                      rope_theta=500000.0, bos_token_id=1, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
    return model.eval(), cfg


def prompts(batch: int, length: int, vocab: int, padded: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padded:  # left padding, real lengths spread over [length/4, length]
        for b in range(batch):
            n = length // 4 + (3 * length // 4) * b // max(batch - 1, 1)
            mask[b, :length - n] = 0
            ids[b, :length - n] = 0
    return ids.cuda(), mask.cuda()


def measure(model, ids, mask, new: int, repeats: int, cache: str = "dynamic") -> dict:
    B, P = ids.shape
    gen = dict(do_sample=False, pad_token_id=0)
    if cache == "static":  # a StaticCache: transformers compiles the decode step (CUDA graphs), so host time drops out
        gen["cache_implementation"] = "static"

    def prefill():
        return model(ids, attention_mask=mask, use_cache=True, logits_to_keep=1)

    def generate(n):
        return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, **gen)

    with torch.no_grad():
        prefill(); generate(24)  # warm-up: compiles, plans (24 steps: every cache-length residue the kernels see)
        pre, one, full, tokens = [], [], [], None
        for _ in range(repeats):
            pre.append(_sync_time(prefill)[0])
            one.append(_sync_time(lambda: generate(1))[0])
            t, out = _sync_time(lambda: generate(new + 1))
            full.append(t)
            tokens = out[:, P + 1:]  # the decode steps' tokens
    prefill_s = statistics.median(pre)
    decode_s = statistics.median(full) - statistics.median(one)
    return {"prefill_s": prefill_s, "prefill_tok_s": B * P / prefill_s, "decode_s": decode_s,
            "decode_tok_s": B * new / decode_s, "decode_ms_per_step": decode_s / new * 1e3,
            "runs_s": {"prefill": pre, "generate_1": one, f"generate_{new + 1}": full},
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}, tokens


def interleaved_rounds(model, ids, mask, impls: dict, new: int, rounds: int, warmup: int = 2):
    """Decode ms per step of several implementations interleaved round by round in one process (for A/Bs whose
    differences are smaller than a host's drift between runs). ``impls`` maps a name to ``(attn_implementation,
    patch)``: ``patch`` None or a context-manager factory active while that implementation generates (a shim of
    the path before a change). Per round and implementation: ``(generate(new + 1) - generate(1)) / new``; the
    first ``warmup`` rounds (compiles, plans, sdpa's cuDNN graphs per key length) are not kept. Returns ({name: ms
    per step per kept round}, {name: the last round's first 16 decoded tokens of each sequence})."""
    import contextlib

    P = ids.shape[1]

    def generate(n):
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=n,
                                  min_new_tokens=n)

    res, tokens = {n: [] for n in impls}, {}
    for r in range(rounds + warmup):
        for name, (impl, patch) in impls.items():
            model.set_attn_implementation(impl)
            with (patch() if patch is not None else contextlib.nullcontext()):
                t1, _ = _sync_time(lambda: generate(1))
                tn, out = _sync_time(lambda: generate(new + 1))
            tokens[name] = out[:, P:P + 16].tolist()
            if r >= warmup:
                res[name].append((tn - t1) / new * 1e3)
    return res, tokens


def ab_setup():
    """The interleaved A/B scripts' common start (bench/results/sweeps/v61, v62): B, P, NEW, ROUNDS from the
    environment (1, 2048, 128, 5), the 8-layer model, flashcore registered as "fcore" and "fcore_nocheck"
    (validate_masks=False), and the prompts (no padding; transformers 5.17 passes the all-ones mask on)."""
    import types

    from ...integrations import transformers as fc_hf

    env = os.environ
    ab = types.SimpleNamespace(B=int(env.get("B", 1)), P=int(env.get("P", 2048)), NEW=int(env.get("NEW", 128)),
                               ROUNDS=int(env.get("ROUNDS", 5)))
    ab.model, _ = make_model(8, 32000)
    ab.check, ab.nocheck = fc_hf.register("fcore"), fc_hf.register("fcore_nocheck", validate_masks=False)
    ab.ids, ab.mask = prompts(ab.B, ab.P, 32000, False)
    return ab


def ab_report(ab, res: dict, tokens: dict) -> None:
    """Print the medians (and each one's ratio to sdpa's) and write ``$OUT/hf_ab_B{B}.json``."""
    summary = {n: round(statistics.median(v), 3) for n, v in res.items()}
    for n in res:
        print(f"B{ab.B} {n:22s} {summary[n]:7.3f} ms/step  x sdpa {summary['sdpa'] / summary[n]:.3f}  rounds "
              f"{[round(x, 3) for x in res[n]]}")
    with open(os.path.join(os.environ.get("OUT", "."), f"hf_ab_B{ab.B}.json"), "w") as f:
        json.dump(dict(B=ab.B, P=ab.P, NEW=ab.NEW, ROUNDS=ab.ROUNDS, summary=summary, rounds=res, tokens=tokens,
                       git=os.environ.get("FLASHCORE_GIT_SHA")), f, indent=1)


def agree(tokens, ref) -> int:
    """Leading tokens equal in every sequence."""
    same = (tokens == ref).all(dim=0).tolist()
    return next((i for i, s in enumerate(same) if not s), len(same))


def main(argv=None):
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default 1,32)")
    ap.add_argument("--prompt", type=int, default=2048, help="prompt length in tokens (default 2048)")
    ap.add_argument("--new", type=int, default=256, help="decode steps measured (default 256)")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (default 8)")
    ap.add_argument("--vocab", type=int, default=32000, help="vocabulary size (default 32000)")
    ap.add_argument("--repeats", type=int, default=3, help="measured runs per point, median (default 3)")
    ap.add_argument("--padded", action="store_true", help="also a left-padded batch (varlen prefill)")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--cache", choices=("dynamic", "static"), default="dynamic",
                    help="generate's KV cache: dynamic (transformers' default, eager decode steps) or static "
                         "(transformers compiles the decode step; the first generate of each shape compiles)")
    a = ap.parse_args(argv)

    import transformers

    from ...integrations import transformers as fc_hf
    if not torch.cuda.is_available():
        raise SystemExit("hf_generate needs a CUDA device")
    names = {"sdpa": "sdpa", "fcore": fc_hf.register(),
             "fcore_nocheck": fc_hf.register("fcore_nocheck", validate_masks=False)}
    impls = [i for i in a.impls.split(",") if i]
    if "sdpa" in impls:
        impls = ["sdpa"] + [i for i in impls if i != "sdpa"]  # sdpa first: the others' tokens are compared with it
    model, cfg = make_model(a.layers, a.vocab)
    points = [(int(b), False) for b in a.batches.split(",")] + (
        [(max(int(b) for b in a.batches.split(",")), True)] if a.padded else [])
    rows = []
    for B, padded in points:
        ids, mask = prompts(B, a.prompt, a.vocab, padded)
        ref_tokens = None
        for impl in impls:
            model.set_attn_implementation(names[impl])
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            row, tokens = measure(model, ids, mask, a.new, a.repeats, a.cache)
            row.update(impl=impl, batch=B, prompt=a.prompt, padded=padded, new_tokens=a.new, cache=a.cache,
                       wall_s=time.perf_counter() - t0)
            if impl == "sdpa":
                ref_tokens = tokens
            elif ref_tokens is not None:
                row["agree"] = agree(tokens, ref_tokens)
            rows.append(row)
            print(f"  {impl:>14} batch {B:>3}{' padded' if padded else ''}: prefill {row['prefill_tok_s']:>9.0f} tok/s, "
                  f"decode {row['decode_tok_s']:>8.0f} tok/s ({row['wall_s']:.0f} s)", flush=True)
    doc = {"env": collect_environment(), "transformers": transformers.__version__,
           "model": {"arch": "llama", "layers": a.layers, "hidden": 4096, "intermediate": 14336, "heads": [32, 8],
                     "head_dim": 128, "vocab": a.vocab, "dtype": "bfloat16", "params": sum(
                         p.numel() for p in model.parameters())},
           "prompt": a.prompt, "new_tokens": a.new, "repeats": a.repeats, "cache": a.cache, "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "hf_generate.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print("\n" + generate_markdown_table(doc))  # the README's table of this run
    print(f"\n({a.layers}-layer Llama, 4096 hidden, 32/8 heads x 128, bf16, prompt {a.prompt}, {a.new} new tokens, "
          f"{a.cache} cache; "
          f"JSON: {os.path.join(a.out, 'hf_generate.json')})")


if __name__ == "__main__":
    main()
