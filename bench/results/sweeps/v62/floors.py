"""session 46 (perf-notes v62): what a kernel that only reads the same bytes costs in the decode suite's timer, beside
flashcore's decode call, same run. Issue 22's B1 bars (4k <= 12 us per call; FP8 >= 1.8x the bf16 cache) are per-call
times in that timer (bench.timing.Timer: CUDA events around each call, the queue pre-filled; a 256 MB zeroed buffer
before each call when one input set exceeds the L2, else input sets rotated). A pure read of 16.8 MB (B1 4k's K and
V), 134 MB (B1 64k FP8) and 268 MB (B1 64k bf16) bounds from below what any decode kernel can take in it.

Per size: a Triton stream (grid-stride, several grids and blocks; the fastest is kept) and torch.sum. Per-call
times under two L2 states for the sizes above the L2: the suite's (the flush buffer zeroed: its dirty lines are
written back while the timed call runs) and a clean one (the zeroing followed by a read of 2x L2 of another
buffer, untimed, so the timed call evicts only clean lines). CUDA-graph replays (20 calls, cycling input sets).
Also: an empty kernel and two back to back (what the timer adds per call and per launch).

Writes $OUT/floors.json; prints a table."""
import json, math, os, statistics, sys

import torch
import triton
import triton.language as tl

import flashcore
from flashcore.bench import timing


@triton.jit
def _stream_read(X, OUT, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(pid * BLOCK, n, step):
        acc ^= tl.load(X + start + offs, mask=start + offs < n, other=0)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


@triton.jit
def _empty(OUT):
    tl.store(OUT + tl.program_id(0), 1)


class CleanTimer(timing.Timer):
    """The suite's flush, then a read of 2x L2 of another buffer (untimed): the timed call starts with a cold,
    clean L2."""

    def __init__(self, l2_bytes):
        super().__init__()
        self.evict = torch.ones(2 * l2_bytes // 4, dtype=torch.int32, device=self.device)
        self.sink = torch.empty((), dtype=torch.int64, device=self.device)

    def flush(self):
        self.flush_buffer.zero_()
        self.evict.sum()


def med_us(samples_ms):
    return 1000.0 * statistics.median(samples_ms)


def main():
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = props.L2_cache_size
    sms = props.multi_processor_count
    timer = timing.Timer()
    clean = CleanTimer(l2)
    res = {"device": props.name, "l2_bytes": l2, "sm_count": sms, "torch": torch.__version__,
           "triton": triton.__version__, "git_sha": os.environ.get("FLASHCORE_GIT_SHA", "unknown"), "rows": []}

    sink = torch.zeros(4096, dtype=torch.int32, device=dev)
    e1 = lambda: _empty[(1,)](sink)

    def e2():
        _empty[(1,)](sink)
        _empty[(1,)](sink)

    for name, fn in (("empty kernel", e1), ("two empty kernels", e2)):
        t = med_us(timer.measure([fn], flush=False, rep_ms=40))
        res["rows"].append({"what": name, "per_call_us": t, "graph_us": timing.cuda_graph_us(fn)})

    sizes = {"B1 4k bf16 K+V": 2 * 4096 * 8 * 128 * 2, "B1 64k fp8 K+V": 2 * 65536 * 8 * 128,
             "B1 64k bf16 K+V": 2 * 65536 * 8 * 128 * 2}
    for label, nbytes in sizes.items():
        flush = nbytes > l2
        n_sets = 1 if flush else timing.rotation_sets(nbytes, l2)
        bufs = [torch.randint(-2 ** 30, 2 ** 30, (nbytes // 4,), dtype=torch.int32, device=dev) for _ in range(n_sets)]
        outs = torch.empty(8192, dtype=torch.int32, device=dev)
        best = None
        for grid_mult in (1, 2, 4, 8):
            for block in (1024, 2048, 4096):
                for warps in (4, 8):
                    grid = sms * grid_mult
                    if grid * block > nbytes // 4:
                        continue
                    fns = [lambda b=b, g=grid, blk=block, w=warps: _stream_read[(g,)](b, outs, b.numel(), BLOCK=blk,
                                                                                        num_warps=w, num_stages=3)
                           for b in bufs]
                    t = med_us(timer.measure(fns, flush=flush, rep_ms=30))
                    if best is None or t < best[0]:
                        best = (t, grid, block, warps, fns)
        t, grid, block, warps, fns = best
        t = med_us(timer.measure(fns, flush=flush, rep_ms=100))
        row = {"what": f"stream read {label}", "bytes": nbytes, "sets": n_sets, "flush": flush,
               "config": dict(grid=grid, block=block, warps=warps), "per_call_us": t,
               "graph_us": timing.cuda_graph_us(fns)}
        if flush:
            row["per_call_clean_us"] = med_us(clean.measure(fns, flush=True, rep_ms=100))
        res["rows"].append(row)
        bf = [b.view(torch.bfloat16) for b in bufs]
        fsum = [lambda x=x: x.sum(dtype=torch.float32) for x in bf]
        row = {"what": f"torch.sum {label}", "bytes": nbytes, "per_call_us": med_us(timer.measure(fsum, flush=flush,
                                                                                                      rep_ms=100))}
        res["rows"].append(row)
        del bufs, bf, fns, fsum
        torch.cuda.empty_cache()

    # flashcore's decode call at the same bytes (contiguous caches, full length), same timer and run
    g = torch.Generator(device=dev).manual_seed(int.from_bytes(os.urandom(4), "little"))
    for label, S, fp8 in (("B1 4k bf16", 4096, False), ("B1 64k fp8", 65536, True), ("B1 64k bf16", 65536, False)):
        nbytes = 2 * S * 8 * 128 * (1 if fp8 else 2)
        flush = nbytes > l2
        n_sets = 1 if flush else timing.rotation_sets(nbytes, l2)
        sets = []
        for _ in range(n_sets):
            q = torch.randn(1, 1, 32, 128, device=dev, dtype=torch.bfloat16, generator=g)
            k = torch.randn(1, S, 8, 128, device=dev, dtype=torch.bfloat16, generator=g)
            v = torch.randn(1, S, 8, 128, device=dev, dtype=torch.bfloat16, generator=g)
            kw = {}
            if fp8:
                k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
                kw = dict(k_descale=torch.ones(1, 8, device=dev), v_descale=torch.ones(1, 8, device=dev))
            lens = torch.full((1,), S, dtype=torch.int32, device=dev)
            sets.append((q, k, v, lens, kw))
        q, k, v, lens, kw = sets[0]
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).double(), k.to(torch.bfloat16).transpose(1, 2).double(),
            v.to(torch.bfloat16).transpose(1, 2).double(), enable_gqa=True).transpose(1, 2)
        got = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, **kw)
        rel = float((got.double() - ref).norm() / ref.norm())
        fns = [lambda s=s: flashcore.attention_with_kvcache(s[0], s[1], s[2], cache_seqlens=s[3], validate=False,
                                                           **s[4]) for s in sets]
        row = {"what": f"flashcore decode {label}", "bytes": nbytes, "sets": n_sets, "flush": flush, "rel_err": rel,
               "per_call_us": med_us(timer.measure(fns, flush=flush, rep_ms=100)), "graph_us": timing.cuda_graph_us(fns)}
        if flush:
            row["per_call_clean_us"] = med_us(clean.measure(fns, flush=True, rep_ms=100))
        res["rows"].append(row)
        del sets, fns
        torch.cuda.empty_cache()

    with open(os.path.join(out_dir, "floors.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'what':40s} {'per call':>9s} {'clean':>9s} {'graph':>9s}")
    for r in res["rows"]:
        c = r.get("per_call_clean_us")
        gr = r.get("graph_us")
        print(f"{r['what']:40s} {r['per_call_us']:9.2f} {c if c is None else round(c, 2)!s:>9s} "
              f"{gr if gr is None else round(gr, 2)!s:>9s} {r.get('config', '')} {r.get('rel_err', '')}")


if __name__ == "__main__":
    sys.exit(main())
