"""The script that produced l2-evict-probe-v37-h100.json (docs/perf-notes.md v37), kept beside its results: a
standalone probe, not part of the library (its kernel is no flashcore kernel). Does an L2 evict-first hint on
streaming reads speed them up, and spare the write-back of a dirty L2 (the bench harness's flush leaves 50 MB of
dirty lines)? A streaming sum over 16 or 268 MB after a dirty flush (256 MB zero_) or a clean one (256 MB read),
plain loads with eviction_policy '', 'evict_first', 'evict_last' (num_stages=1: ld.global.L2::cache_hint with a
createpolicy; Triton 3.6's cp.async lowering drops the policy). Run on a GPU: OUT=dir python3 l2-evict-probe-v37.py;
`python3 l2-evict-probe-v37.py ptx` prints the loads' PTX, compiled on the CPU."""
import json, os, sys, statistics, torch, triton, triton.language as tl

@triton.jit
def stream_sum(X, OUT, BLOCK: tl.constexpr, ITERS: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, eviction_policy=EVICT).to(tl.float32)
    tl.store(OUT + pid * BLOCK + tl.arange(0, BLOCK), acc)

def main():
    if len(sys.argv) > 1 and sys.argv[1] == "ptx":
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        for ev in ("", "evict_first"):
            src = ASTSource(stream_sum, signature={"X": "*bf16", "OUT": "*fp32", "BLOCK": "constexpr", "ITERS": "constexpr", "EVICT": "constexpr"},
                            constexprs={"BLOCK": 2048, "ITERS": 16, "EVICT": ev})
            c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 1})
            ptx = c.asm["ptx"]
            print(repr(ev), "createpolicy", ptx.count("createpolicy"), "cache_hint", ptx.count("cache_hint"),
                  [l.strip() for l in ptx.splitlines() if "ld.global" in l][:1])
        return
    dev = "cuda"
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=dev)
    rows = []
    for mb in (16, 268):
        n = mb * 2**20 // 2
        BLOCK, ITERS = 2048, 16
        n = (n // (BLOCK * ITERS)) * BLOCK * ITERS
        x = torch.randn(n, device=dev, dtype=torch.bfloat16)
        out = torch.empty(n // ITERS, device=dev, dtype=torch.float32)
        grid = (n // (BLOCK * ITERS),)
        for ev in ("", "evict_first", "evict_last"):
            stream_sum[grid](x, out, BLOCK=BLOCK, ITERS=ITERS, EVICT=ev, num_warps=4, num_stages=1)
        torch.cuda.synchronize()
        for rnd in range(3):
            for fl in ("dirty", "clean"):
                for ev in ("", "evict_first", "evict_last"):
                    ts = []
                    for _ in range(30):
                        if fl == "dirty":
                            flush.zero_()
                        else:
                            flush.sum()
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        stream_sum[grid](x, out, BLOCK=BLOCK, ITERS=ITERS, EVICT=ev, num_warps=4, num_stages=1)
                        e.record()
                        e.synchronize()
                        ts.append(s.elapsed_time(e) * 1e3)
                    r = dict(mb=mb, flush=fl, evict=ev or "normal", round=rnd, us=statistics.median(ts),
                             tbs=n * 2 / statistics.median(ts) / 1e6)
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "evict_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)

if __name__ == "__main__":
    main()
