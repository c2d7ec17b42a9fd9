"""Launch configurations, chosen per architecture from public facts only (shape, dtype, flags).

Each architecture gets its own table so a Hopper-specific kernel (Gluon/TMA) can slot in beside
the portable one without touching the others. The tables are measured, not guessed: see
docs/perf-notes.md for the sweeps that chose them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False  # load q/k/v through host-built TMA descriptors (Hopper; dense, aligned inputs)
    # secure mode only: zero V's padding in a pre-pass (True) or with a select on every V tile in
    # the attention loop (False); see kernels/secure_prepass.py for why the pre-pass is the default
    v_prepass: bool = True


# The interpreter runs each program in numpy: small tiles keep CI fast, and BLOCK_M != BLOCK_N
# exercises the causal stage split.
INTERPRETER = Config(block_m=32, block_n=16, num_warps=4, num_stages=1)


def block_d(head_dim: int) -> int:
    """Head dims that are not a power of two run in the next power-of-two tile (masked)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def hopper(head_dim: int, dtype_bytes: int, causal: bool, secure: bool, seqlen_q: int, seqlen_k: int) -> Config:
    """Measured on H100 (sweeps of 2026-11-21, docs/perf-notes.md): 128x64 tiles with 8 warps and
    3 stages win or tie everywhere on the fast path; the secure path (all blocks masked, V
    sanitised through registers) prefers 64x64/4 warps at D=64 and 128x128/8 warps at D=128.
    TMA descriptors measured no better than cp.async pointers here, so they stay off."""
    bd = block_d(head_dim)
    if dtype_bytes == 4:  # fp32 runs the IEEE (non tensor-core) path: keep register tiles small
        return Config(64, 32, 4, 2) if bd <= 64 else Config(32, 32, 4, 2)
    if bd <= 128:
        return Config(128, 64, 8, 3)
    return Config(64, 64, 4, 2)


def generic(head_dim: int, dtype_bytes: int, causal: bool, secure: bool, seqlen_q: int, seqlen_k: int) -> Config:
    """Pre-Hopper CUDA GPUs (sm_80/86/89): modest tiles that fit their shared memory."""
    bd = block_d(head_dim)
    if dtype_bytes == 4:
        return Config(32, 32, 4, 2)
    if bd <= 64:
        return Config(128, 64, 4, 2)
    if bd <= 128:
        return Config(64, 64, 4, 2)
    return Config(32, 32, 4, 1)


def choose(arch: tuple[int, int] | None, **kw) -> Config:
    if arch is None:
        return INTERPRETER
    if arch[0] == 9:
        return hopper(**kw)
    return generic(**kw)
