"""session 45 (perf-notes v61): host time per eager decode call (B=1, 32/8, D 128, bf16, K 2048, transformers'
[B,S,H,D] views of [B,H,S,D] caches, lengths as int32 tensors from the padding mask, validate=False), the GPU kept
busy so only host time counts; medians over rounds of N calls of: attention_with_kvcache (a plan hit), a
KVCacheStep's run over 8 layers' tensors, making a step, the integration's call on layers 1-7 (its step made) and on
layer 0 (a new mask each call: its lengths, its step), sdpa; and the lengths from a padding mask by PyTorch's eight ops
and by the one-launch kernel."""
import json, os, statistics, time, types
import torch
import torch.nn.functional as F
import flashcore
import flashcore.integrations.transformers as fc_hf

dev = "cuda"
B, HQ, HKV, D, K, L = 1, 32, 8, 128, 2048, 8
N, ROUNDS = 400, 7
kc = [torch.randn(B, HKV, K, D, device=dev, dtype=torch.bfloat16) for _ in range(L)]
vc = [torch.randn_like(x) for x in kc]
q4 = [torch.randn(B, HQ, 1, D, device=dev, dtype=torch.bfloat16) for _ in range(L)]
views = [(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) for q, k, v in zip(q4, kc, vc)]
start = torch.zeros(B, dtype=torch.int32, device=dev)
end = torch.full((B,), K, dtype=torch.int32, device=dev)
scale = D ** -0.5
module = types.SimpleNamespace(is_causal=True, training=False)
kw = dict(cache_seqlens=end, cache_leftpad=start, causal=True, scale=scale, validate=False)
i = [0]


def nxt():
    i[0] = (i[0] + 1) % L
    return i[0]


def full():
    return flashcore.attention_with_kvcache(*views[nxt()], **kw)


step = flashcore.kvcache_step(*views[0], **kw)


def run():
    return step.run(*views[nxt()])


def make():
    return flashcore.kvcache_step(*views[0], **kw)


def mask():
    m = torch.ones(B, K, dtype=torch.bool, device=dev)
    m._flashcore = fc_hf._MaskSpec(causal=True, frame=K)
    m._flashcore.ok = True
    return m


shared = mask()


def integ_layers():  # layers 1-7 of a forward pass: the mask's step made by layer 0
    j = nxt()
    return fc_hf.attention_forward(module, q4[j], kc[j], vc[j], shared, scaling=scale)


masks = [mask() for _ in range(N + 4)]
mi = [0]


def integ_first():  # layer 0: a new mask (its lengths, its step)
    mi[0] = (mi[0] + 1) % len(masks)
    m = masks[mi[0]]
    m._flashcore.dev = None
    m._flashcore.extra.clear()
    return fc_hf.attention_forward(module, q4[0], kc[0], vc[0], m, scaling=scale)


def sdpa():
    j = nxt()
    return F.scaled_dot_product_attention(q4[j], kc[j], vc[j], scale=scale, enable_gqa=True)


pm = torch.ones(B, K, dtype=torch.bool, device=dev)


def lengths_torch():  # the integration's lengths before v61: eight PyTorch ops
    pos = torch.arange(K, device=dev, dtype=torch.int32)
    end = torch.where(pm, pos + 1, 0).amax(dim=1).to(torch.int32)
    start = torch.minimum(torch.where(pm, pos, K).amin(dim=1).to(torch.int32), end)
    return start.contiguous(), end.contiguous(), pm.sum(dim=1, dtype=torch.int32)


parts = {"lengths_torch": lengths_torch, "lengths_one_launch": lambda: fc_hf._mask_bounds(pm),
         "attention_with_kvcache": full, "step_run": run, "kvcache_step_make": make, "integration_layers_1_7":
         integ_layers, "integration_layer_0": integ_first, "sdpa": sdpa}
for f in parts.values():
    for _ in range(L + 2):
        f()
torch.cuda.synchronize()
# the same bits: a step's run, the call, the integration
a = flashcore.attention_with_kvcache(*views[3], **kw)
b = step.run(*views[3])
c = fc_hf.attention_forward(module, q4[3], kc[3], vc[3], shared, scaling=scale)[0]
assert torch.equal(a, b) and torch.equal(a, c)
res = {n: [] for n in parts}
for r in range(ROUNDS):
    for n, f in parts.items():
        torch.cuda._sleep(int(1.5e9 * N * 150e-6))
        t0 = time.perf_counter()
        for _ in range(N):
            f()
        res[n].append((time.perf_counter() - t0) / N * 1e6)
        torch.cuda.synchronize()
summary = {n: round(statistics.median(v), 2) for n, v in res.items()}
for n, s in summary.items():
    print(f"{n:24s} {s:7.2f} us  rounds {[round(x, 1) for x in res[n]]}")
json.dump(dict(B=B, K=K, summary=summary, rounds=res, config=str(step.plan.config)),
          open(os.path.join(os.environ.get("OUT", "."), "host_step.json"), "w"), indent=1)
