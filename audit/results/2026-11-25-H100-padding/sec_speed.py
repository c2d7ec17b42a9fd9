"""secure (this config) vs fast at D=64 non-causal shapes: CUDA-graph timing, one JSON line per shape."""
import json, os, sys
from dataclasses import replace
sys.path.insert(0, "src")
import torch, triton
from flashcore.plan import tables
variant = sys.argv[1]
if variant == "secure3wg":
    tables.gluon_secure = lambda hd, s=0, c=False: tables.gluon_ws(hd, s, c)
import flashcore
from flashcore import ops
res = []
for B, H, S, D in [(1, 16, 2048, 64), (1, 16, 1024, 64), (16, 16, 2048, 64), (4, 32, 4096, 64), (1, 32, 16384, 64)]:
    g = torch.Generator(device="cuda").manual_seed(B * 7 + S)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    if variant == "fast":
        fn = lambda: flashcore.attention(q, k, v, out=out)
        ref_fn = fn
    else:
        fn = lambda: flashcore.attention(q, k, v, secure=True, seqlens_k=lens, out=out)
    fn(); torch.cuda.synchronize()
    blk = None
    if variant != "fast":
        p = ops.dense_plan(q, k, v, None, lens, False, D ** -0.5, False, True, False)
        blk = p.main.step.constexprs.get("NUM_WG")
    ms = triton.testing.do_bench_cudagraph(fn, rep=300)
    res.append(dict(variant=variant, shape=[B, H, S, D], us=ms * 1e3, num_wg=blk))
    print(json.dumps(res[-1]), flush=True)
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), f"speed_{variant}.json"), "w"))
