"""Does an L2 evict-first hint speed up a streaming read, and does it spare the write-back of a dirty L2 (the bench
harness's flush leaves 50 MB of dirty lines)? docs/perf-notes.md v37. A streaming sum over 16 or 268 MB (the K/V
bytes of decode at B1 4k and B1 64k) after a dirty flush (256 MB ``zero_``) or a clean one (256 MB read), with plain
loads (``num_stages=1``: ``ld.global.L2::cache_hint`` with a ``createpolicy``) of eviction policy normal,
``evict_first`` and ``evict_last``; CUDA events, median of 30, three interleaved rounds. (Triton 3.6 keeps the
policy on plain loads only: its ``cp.async`` lowering drops it, perf-notes v37.)

    python -m flashcore.bench.experiments.evict_probe --out $OUT [--ptx]   # --ptx: the CPU-compiled loads' PTX

Writes ``evict_probe.json``."""
import json
import statistics

import torch
import triton
import triton.language as tl


@triton.jit
def stream_sum(X, OUT, BLOCK: tl.constexpr, ITERS: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, eviction_policy=EVICT).to(tl.float32)
    tl.store(OUT + pid * BLOCK + tl.arange(0, BLOCK), acc)

def main(argv=None) -> int:
    from . import parser, write_json

    ap = parser(__name__, __doc__)
    ap.add_argument("--ptx", action="store_true", help="print the loads' PTX, compiled on the CPU, instead of timing")
    a = ap.parse_args(argv)
    if a.ptx:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        for ev in ("", "evict_first"):
            src = ASTSource(stream_sum, signature={"X": "*bf16", "OUT": "*fp32", "BLOCK": "constexpr", "ITERS": "constexpr", "EVICT": "constexpr"},
                            constexprs={"BLOCK": 2048, "ITERS": 16, "EVICT": ev})
            c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 1})
            ptx = c.asm["ptx"]
            print(repr(ev), "createpolicy", ptx.count("createpolicy"), "cache_hint", ptx.count("cache_hint"),
                  [line.strip() for line in ptx.splitlines() if "ld.global" in line][:1])
        return 0
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
                    us = statistics.median(ts)
                    r = {"mb": mb, "flush": fl, "evict": ev or "normal", "round": rnd, "us": us, "tbs": n * 2 / us / 1e6}
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    write_json(a.out, "evict_probe.json", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
