"""session 42: the floor under B1 32/8 4k D128 decode: one kernel that only reads the same K and V bytes with the
split kernel's grid (16 splits x 8 K/V heads, 64-key tiles, 4 warps, 3 stages), timed by the suite's timer per call
(rotation, queue pre-filled), beside the shipped decode call."""
import json, os, statistics, time
import torch, triton
import triton.language as tl
import flashcore
from flashcore.bench.timing import Timer

@triton.jit
def read_kv(K, V, O, S, stride_t, stride_h, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    split = tl.program_id(0)
    h = tl.program_id(1)
    chunk = S // SPLITS
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    for n0 in range(split * chunk, split * chunk + chunk, BLOCK_N):
        off = (n0 + offs_n)[:, None] * stride_t + h * stride_h + offs_d[None, :]
        k = tl.load(K + off)
        v = tl.load(V + off)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(O + split * tl.num_programs(1) + h, tl.sum(acc))

dev = "cuda"
S, SETS = 4096, 9
g = torch.Generator(device=dev).manual_seed(int(time.time()) % 2**31)
sets = []
for i in range(SETS):
    q = torch.randn(1, 1, 32, 128, device=dev, generator=g).to(torch.bfloat16)
    k = torch.randn(1, S, 8, 128, device=dev, generator=g).to(torch.bfloat16)
    v = torch.randn(1, S, 8, 128, device=dev, generator=g).to(torch.bfloat16)
    sets.append((q, k, v, torch.full((1,), S, dtype=torch.int32, device=dev)))
o = torch.empty(16 * 8, device=dev)
res = {}
def reader(splits, bn, w, st):
    return [lambda a=a: read_kv[(splits, 8)](a[1], a[2], o, S, a[1].stride(1), a[1].stride(2), SPLITS=splits,
                                               BLOCK_N=bn, D=128, num_warps=w, num_stages=st) for a in sets]
cands = {"read_16x64_w4s3": reader(16, 64, 4, 3), "read_16x128_w8s3": reader(16, 128, 8, 3),
         "read_32x64_w4s3": reader(32, 64, 4, 3), "read_8x64_w4s3": reader(8, 64, 4, 3),
         "decode": [lambda a=a: flashcore.attention_with_kvcache(a[0], a[1], a[2], cache_seqlens=a[3], validate=False)
                    for a in sets],
         "torch_sum_k_v": [lambda a=a: (a[1].sum(), a[2].sum()) for a in sets]}
for n, fns in cands.items():
    for f in fns:
        f()
torch.cuda.synchronize()
timer = Timer()
per = {n: [] for n in cands}
import random
for r in range(5):
    names = list(cands); random.shuffle(names)
    for n in names:
        per[n].append(timer.stats(cands[n], flush=False, rep_ms=60)["median_us"])
out = {n: dict(median=statistics.median(v), runs=v) for n, v in per.items()}
json.dump(dict(S=S, per_call_us=out, torch=torch.__version__, triton=triton.__version__,
               device=torch.cuda.get_device_name()), open(os.path.join(os.environ.get("OUT", "."), "read_floor.json"), "w"), indent=1)
for n, v in out.items():
    print(f"{n:20s} {v['median']:6.2f} us per call  {[round(x, 2) for x in v['runs']]}")
