"""Config sweep on the GPU: every candidate tile config on the ANCHORS shapes, beside SDPA in the
same run. Writes JSON to --out and prints a table. Used to choose kernels/configs.py."""
import argparse, json, os, sys, time, subprocess
import torch, triton
from triton.testing import do_bench
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import flashcore
from flashcore import ops
from flashcore.kernels.configs import Config

SHAPES = [  # B, H, S, D, causal
    (1, 8, 512, 64, False), (1, 16, 1024, 64, False), (4, 16, 1024, 64, False), (16, 16, 2048, 64, False),
    (4, 32, 4096, 64, False), (4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
    (1, 32, 16384, 128, False), (1, 32, 16384, 128, True),
]
def _both(cfgs):
    return [Config(*c, tma=t) for c in cfgs for t in (False, True)]


CANDS = {
    64: _both([(128, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)]),
    128: _both([(128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)]),
}


def flops(B, H, S, D, causal):
    return 4 * B * H * S * S * D / (2 if causal else 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--secure", action="store_true")
    a = ap.parse_args()
    rows = []
    for (B, H, S, D, causal) in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(B * 1000 + S + D)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        res = {"shape": [B, H, S, D, causal]}
        res["sdpa_default"] = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), return_mode="median")
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            res["sdpa_flash"] = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), return_mode="median")
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        for cfg in CANDS[D]:
            for secure in ((False, True) if (a.secure and S >= 4096) else (False,)):
                key = f"{'sec' if secure else 'fc'}_{cfg.block_m}x{cfg.block_n}_w{cfg.num_warps}_s{cfg.num_stages}{'_tma' if cfg.tma else ''}"
                fn = lambda: ops._dense_impl(q, k, v, lens if secure else None, lens if secure else None, causal, D ** -0.5,
                                             False, secure, False, None, cfg)[0]
                try:
                    out = fn()
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    if not err < 2e-2:
                        res[key] = f"WRONG {err:.3g}"; continue
                    res[key] = do_bench(fn, return_mode="median")
                except Exception as e:  # noqa: BLE001 - a config that does not fit is data, not a crash
                    res[key] = f"FAIL {type(e).__name__}: {str(e)[:80]}"
        rows.append(res)
        best = min((v_, k_) for k_, v_ in res.items() if k_.startswith("fc_") and isinstance(v_, float))
        line = f"{B}x{H}x{S}x{D}{' causal' if causal else ''}: sdpa {res['sdpa_default']*1e3:.1f}us flash {res['sdpa_flash']*1e3:.1f}us | best fc {best[1]} {best[0]*1e3:.1f}us ratio {res['sdpa_default']/best[0]:.3f}"
        secs = [(v_, k_) for k_, v_ in res.items() if k_.startswith("sec_") and isinstance(v_, float)]
        if secs:
            sb = min(secs); line += f" | best sec {sb[1]} {sb[0]*1e3:.1f}us ({best[0]/sb[0]:.3f} of fast)"
        print(line, flush=True)
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               sha=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
               date=time.strftime("%Y-%m-%d %H:%M:%S"))
    json.dump({"env": env, "rows": rows}, open(os.path.join(a.out, "sweep.json"), "w"), indent=1)
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
