"""Launch configurations, chosen per architecture from public facts only (shape, dtype, flags).

Each architecture gets its own table so a Hopper-specific kernel (Gluon/TMA) can slot in beside
the portable one without touching the others. The tables are measured, not guessed: see
docs/perf-notes.md for the sweeps that chose them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

# Audit/debug knob: force the secure mode's V zeroing to one variant ("prepass" | "in_loop"), so the
# GPU audit gates can cover both at small shapes; "auto" (unset) lets the tables below decide.
SECURE_V_ZEROING_ENV = "FLASHCORE_SECURE_V_ZEROING"
SECURE_V_ZEROING_MODES = ("auto", "prepass", "in_loop")


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


def hopper(head_dim: int, dtype_bytes: int, causal: bool, secure: bool, seqlen_q: int, seqlen_k: int,
           batch_heads: int = 1) -> Config:
    """Measured on H100 (sweeps of 2026-11-21, docs/perf-notes.md; ``batch_heads`` = B * Hq).

    * Fast path: 128x64 tiles, 8 warps, 3 stages win or tie on every large shape. When the grid of
      128-row tiles would not fill the GPU twice over (<= 256 tiles), 64-row tiles with 4 warps
      halve each program's serial chain: 1x8x512x64 10.7 vs 13.2 us, 1x16x1024x64 18.4 vs 20.2.
    * Secure path at D=128 non-causal: 128x128 tiles (2466 vs 2554 us on 4x32x4096x128; 9680 vs
      10345 on 1x32x16384x128). Causal keeps 128x64 (128x128 spills with the public-diagonal split).
    * Secure V zeroing: the pre-pass for large problems; for small ones (< 2^23 elements of V-sized
      work) the in-loop select, which saves a launch where launch latency dominates.
    TMA descriptors measured no better than cp.async pointers here, so they stay off."""
    bd = block_d(head_dim)
    if dtype_bytes == 4:  # fp32 runs the IEEE (non tensor-core) path: keep register tiles small
        return Config(64, 32, 4, 2) if bd <= 64 else Config(32, 32, 4, 2)
    small = batch_heads * seqlen_k * bd < (1 << 23)
    if bd <= 64:
        if not secure and batch_heads * -(-seqlen_q // 128) <= 256:
            return Config(64, 128, 4, 3)
        return Config(128, 64, 8, 3, v_prepass=not small)
    if bd <= 128:
        if secure and not causal:
            return Config(128, 128, 8, 3, v_prepass=not small)
        return Config(128, 64, 8, 3, v_prepass=not small)
    return Config(64, 64, 4, 2, v_prepass=not small)


def generic(head_dim: int, dtype_bytes: int, causal: bool, secure: bool, seqlen_q: int, seqlen_k: int,
            batch_heads: int = 1) -> Config:
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
        cfg = INTERPRETER
    elif arch[0] == 9:
        cfg = hopper(**kw)
    else:
        cfg = generic(**kw)
    if kw.get("secure"):
        mode = os.environ.get(SECURE_V_ZEROING_ENV, "auto")
        if mode not in SECURE_V_ZEROING_MODES:
            raise ValueError(f"{SECURE_V_ZEROING_ENV} must be one of {SECURE_V_ZEROING_MODES}, got {mode!r}")
        if mode != "auto":
            cfg = replace(cfg, v_prepass=mode == "prepass")
    return cfg
