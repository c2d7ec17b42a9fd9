"""Clock and power of a GPU at training load (docs/perf-notes.md v37): each backend's forward+backward run back to
back for ``--seconds`` after a second of warm-up, while ``nvidia-smi`` samples the SM clock, the power draw, the
temperature and the active clock limit every 50 ms; steps per second beside them. An H100 at this load runs at
its power cap (700 W), which is why the training bench's ``--sustained`` windows warm each backend up first.

    python -m flashcore.bench.experiments.train_power --out $OUT

Writes ``train_power.json``; prints one JSON row per window."""
from __future__ import annotations

import json
import subprocess
import time

import torch
import torch.nn.functional as F

import flashcore

from . import parser, write_json

SHAPES = [(1, 32, 16384, 128, True), (4, 32, 4096, 128, False)]  # B, H, S, D, causal (bshd, bf16)


def _sampler() -> subprocess.Popen:
    return subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,"
                             "clocks_throttle_reasons.active", "--format=csv,noheader,nounits", "-lms", "50"],
                            stdout=subprocess.PIPE, text=True)


def window(name: str, fn, q, k, v, do, seconds: float) -> dict:
    """One backend's window: warm-up, then ``seconds`` of steps with the sampler running."""
    def step():
        for t in (q, k, v):
            t.grad = None
        fn().backward(do)

    step()
    torch.cuda.synchronize()
    end = time.time() + 1.0
    while time.time() < end:
        step()
    torch.cuda.synchronize()
    p = _sampler()
    time.sleep(0.2)
    n, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        step()
        n += 1
    torch.cuda.synchronize()
    dt = time.time() - t0
    p.terminate()
    samples = [line.split(", ") for line in p.communicate()[0].strip().splitlines() if line.count(",") >= 4]
    clk, pw = [float(s[1]) for s in samples], [float(s[2]) for s in samples]
    return {"backend": name, "step_ms": round(dt / n * 1e3, 3), "n": n, "samples": len(samples),
            "sm_clock_mhz_mean": round(sum(clk) / max(len(clk), 1), 1), "sm_clock_min": min(clk or [0]),
            "sm_clock_max": max(clk or [0]), "power_w_mean": round(sum(pw) / max(len(pw), 1), 1),
            "temp_c_max": max([float(s[3]) for s in samples] or [0]),
            "throttle_reasons": sorted({s[4] for s in samples})}


def backends(q, k, v, causal: bool) -> tuple:
    """(name, forward) pairs on [B, S, H, D] tensors, in the order the windows run (flashcore first and last)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fc():
        return flashcore.attention(q, k, v, causal=causal, layout="bshd")

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal).transpose(1, 2)

    return ("flashcore", fc), ("sdpa-cudnn", cudnn), ("flashcore", fc)


def main(argv=None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args(argv)
    rows = []
    for B, H, S, D, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(5)
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
                   for _ in range(3))
        do = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        for name, fn in backends(q, k, v, causal):
            r = {"shape": [B, H, S, D, causal], **window(name, fn, q, k, v, do, a.seconds)}
            rows.append(r)
            print(json.dumps(r), flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()
    write_json(a.out, "train_power.json", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
