"""Memory-path control for the decode timing gate: a streaming read of a KV-cache-sized buffer (the bytes B8 x 4096 x
8 heads x 128 x bf16 x K,V = 134 MB) whose second half is zeros (class A) or random bf16 (class B), everything else
equal. The kernel loads every 16-byte chunk and ORs the words into one value per program (integer ops only: no
floating-point unit, no tensor core). CUDA-graph replays, classes in random order, Welch t over the per-call times."""
import json, os, sys, time
import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def read_or_kernel(X, OUT, n_per_prog, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * n_per_prog
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(0, n_per_prog, BLOCK):
        acc = acc | tl.load(X + base + i + tl.arange(0, BLOCK))
    tl.store(OUT + pid, tl.max(acc, 0))


def main():
    dev = "cuda"
    n_words = 134_217_728 // 4  # int32 words
    progs = 132 * 8
    n_words = (n_words // (progs * 1024)) * progs * 1024
    per = n_words // progs
    pool = 8
    g = torch.Generator(device=dev).manual_seed(3)
    bufs = []
    for i in range(2 * pool):
        x = torch.randn(n_words * 2, device=dev, generator=g).to(torch.bfloat16).view(torch.int32)
        bufs.append(x)
    out = torch.empty(progs, dtype=torch.int32, device=dev)

    def fill(x, cls):
        h = x.numel() // 2
        if cls == 0:
            x[h:].zero_()
        else:
            x[h:].copy_(torch.randn(h * 2, device=dev, generator=g).to(torch.bfloat16).view(torch.int32))

    graphs = []
    for x in bufs:
        read_or_kernel[(progs,)](x, out, per, BLOCK=1024, num_warps=8)
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            read_or_kernel[(progs,)](x, out, per, BLOCK=1024, num_warps=8)
        graphs.append(gr)
    rng = np.random.default_rng(0)
    times = {0: [], 1: []}
    n_pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    batch = 64
    t0 = time.time()
    done = 0
    while done < n_pairs:
        # deal the slots to the classes at random, rewrite their second halves
        perm = rng.permutation(2 * pool)
        cls_of = {int(s): (0 if j < pool else 1) for j, s in enumerate(perm)}
        for s, c in cls_of.items():
            fill(bufs[s], c)
        torch.cuda.synchronize()
        evs = []
        for _ in range(batch):
            a = int(rng.choice(perm[:pool])); b = int(rng.choice(perm[pool:]))
            order = [(a, 0), (b, 1)] if rng.random() < 0.5 else [(b, 1), (a, 0)]
            for s, c in order:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record(); graphs[s].replay(); e1.record()
                evs.append((c, e0, e1))
        torch.cuda.synchronize()
        for c, e0, e1 in evs:
            times[c].append(e0.elapsed_time(e1) * 1e6)  # ns
        done += batch
    a, b = np.array(times[0]), np.array(times[1])
    lo, hi = np.percentile(np.concatenate([a, b]), [1, 99])
    a2, b2 = a[(a > lo) & (a < hi)], b[(b > lo) & (b < hi)]
    t = (a2.mean() - b2.mean()) / np.sqrt(a2.var(ddof=1) / a2.size + b2.var(ddof=1) / b2.size)
    res = dict(what="streaming read, second half zeros (A) vs random (B)", bytes=n_words * 4, pairs=int(a.size),
               a_median_ns=float(np.median(a)), b_median_ns=float(np.median(b)),
               mean_diff_ns=float(a2.mean() - b2.mean()), welch_t=float(t), wall_s=time.time() - t0,
               gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "read-control.json"), "w"), indent=1)
    print(json.dumps(res, indent=1))


main()
