"""session 44 (perf-notes v60): host time inside transformers' attention and mask functions per call, flashcore
(register(validate_masks=False)) against sdpa, during generate on the hf_generate model (8 Llama-8B-wide layers,
bf16, random weights). Each registered function wrapped by a perf_counter timer; implementations interleaved, 3
rounds after two warm-ups on the same lengths. Also the step time with torch.cuda.synchronize at the end only."""
import json, os, statistics, time
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from flashcore.bench.experiments.hf_generate import make_model, prompts
import flashcore.integrations.transformers as fc_hf

B = int(os.environ.get("B", 1))
P, NEW = int(os.environ.get("P", 2048)), int(os.environ.get("NEW", 128))
model, cfg = make_model(8, 32000)
name = fc_hf.register(validate_masks=False)
acc = {}


def wrap(registry, key, label):
    f = registry._global_mapping[key]

    def timed(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        acc.setdefault(label, []).append(time.perf_counter() - t)
        return r
    registry._global_mapping[key] = timed


wrap(AttentionInterface, "sdpa", "sdpa_attn")
wrap(AttentionInterface, name, "fcore_attn")
for key, label in (("sdpa", "sdpa_mask"), (name, "fcore_mask")):
    try:
        wrap(AttentionMaskInterface, key, label)
    except KeyError:
        print("no mask function registered under", key)
ids, mask = prompts(B, P, 32000, False)
gen = dict(do_sample=False, pad_token_id=0, max_new_tokens=NEW + 1, min_new_tokens=NEW + 1)
impls = ["sdpa", name]


def run():
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, **gen)


for impl in impls:
    model.set_attn_implementation(impl)
    run(); run()
res = {i: dict(step_ms=[], attn_us=[], mask_us=[], attn_calls=[]) for i in impls}
for r in range(3):
    for impl in impls:
        model.set_attn_implementation(impl)
        acc.clear()
        torch.cuda.synchronize()
        t = time.perf_counter()
        run()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        pre = "sdpa" if impl == "sdpa" else "fcore"
        at = acc.get(pre + "_attn", [])
        mk = acc.get(pre + "_mask", [])
        res[impl]["step_ms"].append(dt / (NEW + 1) * 1e3)
        res[impl]["attn_us"].append(statistics.median(at[8:]) * 1e6 if len(at) > 8 else None)  # decode calls
        res[impl]["attn_calls"].append(len(at))
        res[impl]["attn_total_ms_per_step"] = sum(at) / (NEW + 1) * 1e3
        res[impl]["mask_us"].append(statistics.median(mk) * 1e6 if mk else None)
for impl in impls:
    print(impl, {k: ([round(x, 1) if x else x for x in v] if isinstance(v, list) else round(v, 3)) for k, v in res[impl].items()})
json.dump(dict(B=B, P=P, NEW=NEW, res=res), open(os.path.join(os.environ.get("OUT", "."), f"hf_timing_B{B}.json"), "w"))
