"""session 44: generate with a static cache (transformers compiles the decode step, CUDA graphs) called several
times with different lengths on one model, per implementation: which one trips cudagraph trees' pool check."""
import os, sys, traceback
import torch
from flashcore.bench.experiments.hf_generate import make_model, prompts
import flashcore.integrations.transformers as fc_hf

impl = sys.argv[1]
if os.environ.get("HISTORY") == "1":
    import torch._inductor.config as ic
    ic.triton.cudagraph_trees_history_recording = True
layers = int(os.environ.get("LAYERS", 2))
model, cfg = make_model(layers, 32000)
name = fc_hf.register("fcore_nocheck", validate_masks=False) if impl != "sdpa" else "sdpa"
model.set_attn_implementation(name)
ids, mask = prompts(1, int(os.environ.get("P", 256)), 32000, False)
for n in (24, 1, 33, 33):
    try:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=0, cache_implementation="static")
        torch.cuda.synchronize()
        print(impl, "generate", n, "ok", tuple(out.shape), flush=True)
    except Exception as e:
        print(impl, "generate", n, "FAILED:", type(e).__name__, str(e)[-6000:], flush=True)
        tb = traceback.format_exc().splitlines()
        print("\n".join(l for l in tb if "flashcore" in l or "transformers" in l)[:3000])
        break
