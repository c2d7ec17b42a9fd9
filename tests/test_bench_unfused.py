"""The unfused baseline's Triton softmax, run by the Triton interpreter on CPU.

TRITON_INTERPRET must be set before triton is imported, so the checks run in a subprocess
(setting it here would leak into every other test module of the session). The interpreter's
bf16 is unreliable, so the checks use fp32 and fp16.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

CHECKS = textwrap.dedent(r"""
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from flashcore.bench.unfused import softmax_rows, unfused_attention
    import flashcore.reference as ref

    torch.manual_seed(0)

    def expected(s, q_len, causal, offset, scale):
        rows, n = s.shape
        pos = torch.arange(rows) % q_len
        keep = (torch.arange(n)[None, :] <= pos[:, None] + offset) if causal else torch.ones(rows, n, dtype=torch.bool)
        x = torch.where(keep, s.double() * scale, torch.tensor(float("-inf"), dtype=torch.float64))
        return torch.softmax(x, -1).nan_to_num(0.0)  # a row that sees no key is all zeros

    cases = [  # rows, q_len, n_cols, causal, causal_offset, block_n (None: single pass), dtype
        (6, 3, 37, False, 0, None, torch.float32),
        (6, 3, 37, True, 0, None, torch.float32),
        (10, 5, 37, True, 0, 16, torch.float32),      # two-pass path, odd width
        (8, 4, 1000, True, 500, 128, torch.float32),  # causal with Sk > Sq
        (7, 7, 5, True, -3, None, torch.float32),     # Sq > Sk: first rows see no key
        (4, 2, 33, False, 0, 16, torch.float16),
        (3, 3, 1, False, 0, None, torch.float32),
    ]
    for rows, q_len, n, causal, offset, block_n, dtype in cases:
        s = (torch.randn(rows, n) * 4).to(dtype)
        got = softmax_rows(s, q_len=q_len, causal=causal, causal_offset=offset, scale=0.7, block_n=block_n)
        want = expected(s, q_len, causal, offset, 0.7)
        err = (got.double() - want).abs().max().item()
        tol = 2e-3 if dtype == torch.float16 else 1e-6
        assert got.dtype == dtype and got.shape == s.shape
        assert err < tol, (rows, n, causal, offset, block_n, dtype, err)
        if causal:  # masked entries are exact zeros, rows sum to 1 (or 0 when nothing is visible)
            assert torch.all(got[want == 0] == 0)
        sums = got.double().sum(-1)
        assert torch.all(((sums - 1).abs() < 1e-2) | (sums == 0)), sums

    # the same buffer in and out (the baseline overwrites the scores with the probabilities)
    s = torch.randn(6, 50)
    want = expected(s, 3, True, 10, 0.5)
    got = softmax_rows(s, q_len=3, causal=True, causal_offset=10, scale=0.5, out=s, block_n=16)
    assert got.data_ptr() == s.data_ptr() and (got.double() - want).abs().max().item() < 1e-6

    # the whole three-kernel baseline against the float64 reference: GQA, causal Sq != Sk
    for (B, Hq, Hkv, Sq, Sk, D, causal) in [(2, 4, 2, 19, 23, 16, True), (1, 3, 3, 9, 9, 8, False),
                                            (1, 2, 1, 12, 5, 16, True)]:
        q = torch.randn(B, Hq, Sq, D)
        k = torch.randn(B, Hkv, Sk, D)
        v = torch.randn(B, Hkv, Sk, D)
        out = unfused_attention(q, k, v, causal=causal, block_n=16)
        r = ref.attention(q, k, v, causal=causal)
        err = ((out.double() - r).norm() / r.norm()).item()
        assert out.shape == (B, Hq, Sq, D) and err < 1e-5, (B, Hq, Hkv, Sq, Sk, causal, err)
    print("UNFUSED-OK")
""")


def test_triton_softmax_and_unfused_attention_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CHECKS], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "UNFUSED-OK" in proc.stdout
