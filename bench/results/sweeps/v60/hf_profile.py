"""session 44 (perf-notes v60): where a transformers decode step's host time goes, flashcore against sdpa.
The hf_generate model (8 Llama-8B-wide layers, bf16, random weights), B=1 (env B), prompt 1024, greedy: every
implementation warmed up on the same lengths first (so sdpa's cuDNN graphs per key length are built), then
generate(65) timed 3 times each (interleaved), then cProfile of one generate(65) per implementation."""
import cProfile, io, json, os, pstats, statistics, time
import torch
from flashcore.bench.experiments.hf_generate import make_model, prompts
import flashcore.integrations.transformers as fc_hf

B = int(os.environ.get("B", 1))
P, NEW = int(os.environ.get("P", 1024)), int(os.environ.get("NEW", 64))
model, cfg = make_model(8, 32000)
name = fc_hf.register(validate_masks=False)
ids, mask = prompts(B, P, 32000, False)
gen = dict(do_sample=False, pad_token_id=0, max_new_tokens=NEW + 1, min_new_tokens=NEW + 1)
impls = ["sdpa", name]


def run():
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, **gen)


toks = {}
for impl in impls:  # warm-up twice: compiles, plans, cuDNN graphs for every length of the run
    model.set_attn_implementation(impl)
    run(); toks[impl] = run()[:, P:]
print("greedy tokens equal:", bool(torch.equal(toks["sdpa"], toks[name])))
times = {i: [] for i in impls}
for r in range(3):
    for impl in impls:
        model.set_attn_implementation(impl)
        torch.cuda.synchronize()
        t = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times[impl].append((time.perf_counter() - t) / (NEW + 1) * 1e3)
for impl in impls:
    print(f"{impl:6s} ms per generated token (incl. prefill share): {[round(x, 3) for x in times[impl]]}")
profiles = {}
for impl in impls:
    model.set_attn_implementation(impl)
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    run()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("cumtime").print_stats(r"flashcore|sdpa_attention|scaled_dot|attention_forward|modeling_llama", 30)
    st.sort_stats("tottime").print_stats(25)
    profiles[impl] = s.getvalue()
    print(f"===== {impl}")
    print("\n".join(l[:200] for l in s.getvalue().splitlines() if l.strip())[:9000])
json.dump(dict(B=B, P=P, NEW=NEW, ms_per_token=times, profiles=profiles),
          open(os.path.join(os.environ.get("OUT", "."), f"hf_profile_B{B}.json"), "w"), indent=1)
