"""Launch configurations, chosen per architecture from public facts only (shape, dtype, flags).

Each architecture gets its own table so a Hopper-specific kernel (Gluon/TMA) can slot in beside
the portable one without touching the others. The tables are measured, not guessed: see
docs/perf-notes.md for the sweeps that chose them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache


def is_hopper(arch) -> bool:
    """sm_90 (H100/H200): the one architecture test of the planner (None: CPU tensors or the interpreter)."""
    return arch is not None and arch[0] == 9


def triton_table(arch: tuple[int, int] | None, **kw) -> Config:
    """The Triton kernel's configuration for this architecture (what runs when the Gluon kernel
    cannot: varlen, secure, ineligible tensors)."""
    if arch is None:
        return INTERPRETER
    return hopper_triton(**kw) if is_hopper(arch) else generic(**kw)


def gluon_ws(head_dim: int, seqlen_q: int = 0, causal: bool = False) -> Config:
    """The warp-specialised Gluon kernel's configuration: 128-key tiles and 64 query rows per consumer
    warpgroup; num_stages is the K ring's depth (V's is the same or shallower, v_stages).

    * Two consumer warpgroups (block_m=128) by default. At D=128 two stages tie or beat three
      (1x32x16384x128: 6835 vs 7256 us; causal 3531 vs 3824); D=64 uses three.
    * Three (block_m=192) at D=64, non-causal, Sq >= 2048 (perf-notes v8.3): more warps to hide the
      softmax chain, at 160 registers each (no spills). Same run: 16x16x2048x64 608 vs 631 us,
      4x32x4096x64 1177 vs 1244, 1x32x16384x64 4462 vs 4849. Not below 2048 query rows (a 192-row
      item pads 1024 rows to 1152, and 2x16x1024x64 ran 36 vs 28 us) nor causal (16x16x2048x64 465 vs
      425 us: causal items are not persistent, and a taller item skips fewer key tiles)."""
    if head_dim == 64 and not causal and seqlen_q >= 2048:
        return Config(block_m=192, block_n=128, num_warps=4, num_stages=3, kernel="gluon_ws")
    return Config(block_m=128, block_n=128, num_warps=4, num_stages=2 if head_dim > 64 else 3, kernel="gluon_ws")


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False  # load q/k/v through host-built TMA descriptors (Hopper; dense, aligned inputs)
    # secure mode only: zero V's padding in a pre-pass (True) or with a select on every V tile in
    # the attention loop (False); see kernels/secure/prepass.py for why the pre-pass is the default
    v_prepass: bool = True
    # which kernel runs: "triton" (kernels/triton/fwd.py, every arch) or "gluon_ws" (kernels/sm90/fwd.py:
    # warp-specialised, TMA + wgmma; sm_90 fast path, bf16/fp16, D in {64, 128}, TMA-aligned inputs).
    # For gluon_ws, block_m is a work item's rows (block_m // 64 consumer warpgroups of 64 rows: 2 or 3) and
    # num_stages the depth of the K/V ring.
    kernel: str = "triton"
    # register cap per thread passed to ptxas (None: ptxas decides). Capping a 256-thread program at
    # 128 registers lets two programs share an SM, so one's softmax overlaps the other's MMAs.
    maxnreg: int | None = None


def config_name(cfg: Config | None) -> str:
    """A config's name in sweeps and scripts (``auto`` for the planner's choice); parse_config_name inverts it."""
    if cfg is None:
        return "auto"
    if cfg.kernel != "triton":
        return f"{cfg.kernel}_{cfg.block_m}x{cfg.block_n}s{cfg.num_stages}"
    return (f"{cfg.block_m}x{cfg.block_n}w{cfg.num_warps}s{cfg.num_stages}{'' if cfg.v_prepass else '_inloop'}"
            f"{'_tma' if cfg.tma else ''}{f'_r{cfg.maxnreg}' if cfg.maxnreg else ''}")


def parse_config_name(text: str) -> Config | None:
    """The config a :func:`config_name` names (``gluon_ws_s<N>``: the two-warpgroup Gluon config with N stages)."""
    import re

    if text == "auto":
        return None
    if text.startswith("gluon_ws_s"):
        return Config(128, 128, 4, int(text[len("gluon_ws_s"):]), kernel="gluon_ws")
    m = re.fullmatch(r"gluon_ws_(\d+)x(\d+)s(\d+)", text)
    if m is not None:
        return Config(*(int(x) for x in m.groups()[:2]), 4, int(m.group(3)), kernel="gluon_ws")
    m = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)(_inloop)?(_tma)?(?:_r(\d+))?", text)
    if m is None:
        raise ValueError(f"cannot parse a config name from {text!r}")
    bm, bn, w, st, inloop, tma, r = m.groups()
    return Config(int(bm), int(bn), int(w), int(st), tma=bool(tma), v_prepass=not inloop,
                  maxnreg=int(r) if r else None)


# The interpreter runs each program in numpy: small tiles keep CI fast, and BLOCK_M != BLOCK_N
# exercises the causal stage split.
INTERPRETER = Config(block_m=32, block_n=16, num_warps=4, num_stages=1)


def block_d(head_dim: int) -> int:
    """Head dims that are not a power of two run in the next power-of-two tile (masked)."""
    return max(16, 1 << (head_dim - 1).bit_length())


# Triton versions whose toolchain does not fit the secure D=64 three-warpgroup form in its registers: ptxas 13.4
# (Triton 3.9) serialises its wgmmas (C7512; tests/conftest.REGISTER_MISSES). Measured on one H100, 2026-11-26,
# triton 3.9.0, same run, do_bench medians (bench/results/triton-versions/wg-count-triton-3.9.0.json), secure at
# true length = S_max, two consumer warpgroups against three: 16x16x2048x64 746 vs 817 us, 4x32x4096x64 1384 vs
# 1527, 1x32x16384x64 5148 vs 5548; the fast path's three-warpgroup form ties or wins there (643 vs 651, 1285 vs
# 1282, 4826 vs 5121) and keeps it. Triton 3.7 and 3.8 were not timed on a GPU: they keep three.
SECURE_D64_TWO_WG = ("3.9",)


@lru_cache(maxsize=None)
def triton_minor() -> str:
    """The installed Triton's "major.minor": the toolchain (ptxas) a register budget was measured with."""
    import triton

    return ".".join(triton.__version__.split(".")[:2])


def gluon_secure(head_dim: int, seqlen_q: int = 0, causal: bool = False) -> Config:
    """The Gluon kernel in secure mode (kernels.sm90.fwd.attn_fwd_hopper_kernel with SECURE): the fast path's own
    configuration, since v11 its loop is the fast one (no key mask; perf-notes v11): three consumer
    warpgroups at D=64 non-causal from 2048 query rows (main kernel 0.97-0.98x of the fast path there,
    against 0.91x with two), except on the toolchains of SECURE_D64_TWO_WG (two there). K/V always come from a
    pre-pass (the kernel has no in-loop select)."""
    cfg = gluon_ws(head_dim, seqlen_q, causal)
    if cfg.block_m == 192 and triton_minor() in SECURE_D64_TWO_WG:
        return replace(cfg, block_m=128)
    return cfg


def hopper(head_dim: int, dtype_bytes: int, causal: bool, secure: bool, seqlen_q: int, seqlen_k: int,
           batch_heads: int = 1, secret_diagonal: bool = False) -> Config:
    """H100/H200: the warp-specialised Gluon kernel where it is measured faster, else the Triton
    kernel's table. Measured 2026-11-21 (docs/perf-notes.md, v4, v7 and v8):

    * D=128, 16-bit: Gluon is faster on the GPU at every size tried (do_bench, L2 flushed: 1x8x512
      15.2 vs 16.0 us, 1x16x1024 23.1 vs 26.0, 2x16x1024 37.7 vs 47.8, up to 4x32x4096 ~1750 vs
      ~2270). Its extra host cost (four TMA descriptors encoded per call, ~10 us) is gone since v8
      keeps the encoded descriptors per buffer set, so the threshold is now the smallest size
      measured (1x8x512x512, 2^21); below it (decode-like Sq of a few rows) nothing was measured.
    * D=64, 16-bit: the persistent kernel (v7) is faster from B*Hq*Sq*Sk >= 2^25 on (2x16x1024 28.3
      vs 31.9 us, 1x32x1024 28.8 vs 32.0, 16x16x2048 610 vs 652; from Sq >= 2048 with three consumer
      warpgroups, see gluon_ws); below that the Triton kernel's 64-row programs beat its two-warpgroup
      layout (1x16x1024 18.1 vs 19.1, 1x8x512 10.9 vs 13.4), and since v14 the one-warpgroup layout beats
      both up to 2^26 (last bullet). Before v14 causal D=64 stayed on the Triton kernel: with causal work persistent
      over balanced pairs of row tiles (v8.4) the Gluon kernel won on an H200 (16x16x2048x64 372 vs
      386 us) but on the H100 it ties or trails (same run: 4x32x4096x64 691 vs 687, 16x16x2048x64 396
      vs 381, 4x16x1024x64 48.8 vs 44.9; ahead only at 4x16x2048x64, 111 vs 115).
    * Secure mode, since v11 (perf-notes): the Gluon kernel in secure form (gluon_secure) from the same
      sizes, causal D=64 included (there it ran at 0.94x of the fast path against the secure Triton
      kernel's 0.76x). Its loop is the fast one; a K/V pre-pass takes the secret lengths.
    * D=64, 16-bit, fast path, small problems (perf-notes v14): the Gluon kernel with one consumer warpgroup
      and two programs per SM (gluon_one_wg) from 1x8x512 up to below 4x16x1024 (non-causal), and causal from
      1x16x1024 up to below 16x16x2048; measured same-run, e.g. 1x16x1024x64 0.99-1.02 vs 0.96-1.01x SDPA
      (Triton), 4x16x1024x64 causal 1.03-1.06 vs 0.83-0.86x. Larger problems keep their kernels (at 4x16x1024x64 two warpgroups
      sharing the K/V ring win, 0.98 vs 0.96x; causal 4x32x4096x64 Triton 0.95 vs 0.91x).
    * Secure mode, same D=64 ranges (issue 25 §3; perf-notes v23): the one-warpgroup layout in secure form (its
      K/V pre-pass as for two warpgroups), instead of the secure Triton kernel (below 2^25) or two warpgroups.
      Measured on one H200, 2026-11-26 (experiments.secure_ab, same run, secure / fast throughput at true length
      = S_max): 1x8x512x64 0.69 vs 0.65 (Triton), 1x16x1024x64 0.76 vs 0.71, causal 1x16x1024x64 0.82 vs 0.61,
      causal 4x16x1024x64 0.87 vs 0.77 (two warpgroups); at 4x16x1024x64 non-causal, outside the range, two
      warpgroups keep it (0.77 vs 0.74).
    The caller still falls back to the Triton kernel when the inputs are not TMA-addressable. Secure causal
    attention with a secret diagonal (explicit query lengths) runs the Gluon kernel's SECRET_DIAG form since v36,
    every key tile visited (1.05-1.60x the secure Triton kernel it ran on before, H100). It does the non-causal work,
    so it takes the non-causal one-warpgroup range (``secret_diagonal``), and above it the causal layout (two
    consumer warpgroups: the masked step on every tile, never the three-warpgroup form's 160 registers). Measured
    on one H100 (perf-notes v36.1, secure / fast causal, same run), D=64: 1x8x512
    one warpgroup 11.0 us (0.96) against the secure Triton kernel's 15.1 (0.70); 1x16x1024 one 21.9 against two 22.3;
    4x16x1024 two 64.7 against one 66.8; 2x16x2048 two 112.0 against one 125.9; 16x16x2048 two 808."""
    work = batch_heads * seqlen_q * seqlen_k
    lo, hi = ONE_WG_WORK[bool(causal) and not secret_diagonal]
    # (decode-like query blocks, Sq < 128, were not measured on it: they keep the older rule below)
    if dtype_bytes == 2 and head_dim == 64 and lo <= work < hi and seqlen_q >= 128:
        return gluon_one_wg()
    if dtype_bytes == 2 and head_dim in GLUON_MIN_WORK and work >= GLUON_MIN_WORK[head_dim]:
        if secure:
            return gluon_secure(head_dim, seqlen_q, causal)
        if not (head_dim == 64 and causal):
            return gluon_ws(head_dim, seqlen_q, causal)
    return hopper_triton(head_dim, dtype_bytes, causal, secure, seqlen_q, seqlen_k, batch_heads)


# B*Hq*Sq*Sk from which the Gluon kernel runs, per head dim it supports
GLUON_MIN_WORK = {128: 1 << 21, 64: 1 << 25}
# D=64 fast path: the B*Hq*Sq*Sk range [lo, hi) of the one-warpgroup Gluon layout, by causal
ONE_WG_WORK = {False: (1 << 21, 1 << 26), True: (1 << 24, 1 << 30)}


# secure mode, causal, on the Gluon kernel: V's padding written by the loader warpgroup below this B*Hq*Sq*Sk
SECURE_IN_KERNEL_PADDING_WORK = 1 << 28


def secure_padding_in_kernel(cfg: Config, work: int, secret_diagonal: bool = False) -> bool:
    """Secure mode, causal, on the Gluon kernel: whether the loader warpgroup writes V's padding
    (kernels/sm90/secure_pad.py) instead of the V pre-pass, by the problem's B*Hq*Sq*Sk (perf-notes v34; H100,
    secure / fast in one run): below 2^28 it wins (1x16x1024x64 0.92 against 0.80, 4x16x1024x64 0.93 against 0.84,
    1x16x2048x64 0.92 against 0.88, 2x16x2048x128 0.88 against 0.80), from 2^30 it loses or ties (16x16x2048x64
    0.89 against 0.92, 4x32x4096x64 0.89 against 0.96, 2x32x4096x128 0.88 against 0.89): there the pre-pass's cost
    is amortised and the loader's rewrite of every tile is not.

    ``secret_diagonal`` (causal with a secret diagonal, perf-notes v36: every key tile visited, so the loader rewrites
    twice the tiles of the public-diagonal form): the one-warpgroup layout only. Measured on one H100, secure at
    true length = S_max, the V pre-pass against the loader (same run): two consumer warpgroups, D=128, 3x6x1536
    60.0 against 62.9 us, 2x16x2048 146.6 against 156.7, 4x32x4096 2029 against 2123, 1x32x8192 1948 against 2095;
    one warpgroup, D=64, 1x16x1024 23.8 against 22.0, 4x16x1024 68.1 against 67.0."""
    if secret_diagonal and cfg.block_m > 64:
        return False
    return cfg.kernel == "gluon_ws" and work < SECURE_IN_KERNEL_PADDING_WORK


# secure mode on the Gluon kernel: launched as the programmatic dependent of its pre-pass below this B*Hq*Sq*Sk
SECURE_PDL_WORK = 1 << 28


def secure_prepass_pdl(work: int) -> bool:
    """Secure mode on the Gluon kernel after a pre-pass: whether the kernel launches as the pre-pass's programmatic
    dependent (``launch.sm90_fwd.follows_prepass_pdl``), by the problem's B*Hq*Sq*Sk (perf-notes v44; H200, secure
    at true length = S_max, same run, with and without): below 2^28 it wins, the launch and set-up overlapping the
    pre-pass (1x8x512x64 12.9 -> 11.1 us, 1x16x1024x64 21.0 -> 19.5, 4x16x1024x64 57.3 -> 54.7); from 2^30 it ties
    or loses (16x16x2048x64 632.6 against 633.8, 4x32x4096x128 1942 against 1946 (noisy), and causal 16x16x2048x64,
    the V pre-pass, 393.5 against 405.4, in every round)."""
    return work < SECURE_PDL_WORK


# secure chunked prefill: the V pre-pass from this many loader clears per V tile (query heads per K/V head times
# 128-row work items per head)
SECURE_PREFILL_V_PREPASS_CLEARS = 16


def secure_prefill_v_prepass(causal: bool, group: int, seqlen_q: int) -> bool:
    """Secure chunked prefill on the Gluon kernel (``plan.prefill``): whether V's rows past each secret key length
    are cleaned by the V pre-pass (one read and write of the cache's V, shared by the query heads of a K/V head)
    instead of by the loader warpgroup in every V tile of every work item, which clears each tile ``group *
    ceil(Sq / 128)`` times. Measured on one H200 (perf-notes v46, secure / fast at full length, same run, loader ->
    pre-pass): causal, 32/8 heads D 128 (16 clears and more): 4x512 against 8k 0.72 -> 0.84, 1x512 against 8k 0.75
    -> 0.80, 4x512 against 2k 0.83 -> 0.90, 8x1024 against 16k 0.73 -> 0.88; causal 16/16 heads D 64, 4x512 against
    8k (4 clears) 0.79 -> 0.75; non-causal 32/8 D 128, 4x512 against 8k, a tie (0.77 -> 0.76), so the loader stays
    there. A paged cache: the pre-pass gathers its pages into a contiguous copy (the kernel then reads K by page, V by
    tile); the same rule, measured in perf-notes v46 part 3."""
    clears = group * -(-seqlen_q // 128)
    return causal and clears >= SECURE_PREFILL_V_PREPASS_CLEARS


def gluon_one_wg() -> Config:
    """The Gluon kernel with one 64-row consumer warpgroup per program and two programs per SM (D=64):
    twice the programs of the two-warpgroup layout for small problems, with each one's softmax still
    overlapping its own MMAs. Two ring stages: in the same runs they matched or beat three (1x16x1024x64
    0.99-1.04 vs 0.96-0.99x SDPA), and leave more of the SM's shared memory to L1."""
    return Config(block_m=64, block_n=128, num_warps=4, num_stages=2, kernel="gluon_ws")


def hopper_triton(head_dim: int, dtype_bytes: int, causal: bool, secure: bool, seqlen_q: int, seqlen_k: int,
                  batch_heads: int = 1) -> Config:
    """The portable Triton kernel on Hopper, measured on H100 (sweeps of 2026-11-21,
    docs/perf-notes.md; ``batch_heads`` = B * Hq).

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


# --- the sm_90 Gluon kernel's shared-memory budget (its configs must fit; select() rejects the rest) ---
RING_BYTES = 200 * 1024  # of the 227 KiB an H100 block may use; the rest is headroom for barriers
# One consumer warpgroup: two programs share an SM (228 KiB, 1 KiB of it reserved per block), each with
# Q and its rings in at most this much (barriers take ~130 bytes more).
RING_BYTES_HALF_SM = 112 * 1024


def ring_limit(block_m: int) -> int:
    return RING_BYTES_HALF_SM if block_m == 64 else RING_BYTES


def smem_bytes(k_stages: int, v_stages_: int, block_m: int, block_n: int, head_dim: int) -> int:
    """Shared memory of Q (double-buffered: two work items of ``block_m`` rows) and the K/V rings,
    16-bit tiles; must stay within RING_BYTES."""
    return (2 * block_m + (k_stages + v_stages_) * block_n) * head_dim * 2


def v_stages(k_stages: int, block_m: int, block_n: int, head_dim: int) -> int:
    """V ring depth: as deep as the K ring if shared memory allows, else the deepest that fits (at
    least 1)."""
    limit = ring_limit(block_m)
    fits = [v for v in range(1, k_stages + 1) if smem_bytes(k_stages, v, block_m, block_n, head_dim) <= limit]
    return max(fits) if fits else 1


def gluon_config_error(cfg: Config, head_dim: int) -> str | None:
    """Why the sm_90 Gluon kernel cannot run ``cfg`` at this head dim (None: it can)."""
    ring = smem_bytes(cfg.num_stages, v_stages(cfg.num_stages, cfg.block_m, cfg.block_n, head_dim), cfg.block_m,
                      cfg.block_n, head_dim)
    if (cfg.block_m not in (64, 128, 192) or (cfg.block_m in (64, 192) and head_dim != 64)
            or cfg.block_n not in (64, 128) or cfg.num_stages < 1 or ring > ring_limit(cfg.block_m)):
        return (f"gluon_ws config {cfg} unsupported: block_m must be 128 (two 64-row warpgroups) or, "
                f"at D=64, 64 (one) or 192 (three), block_n 64 or 128, and the K/V rings must fit "
                f"{ring_limit(cfg.block_m)} bytes of shared memory")
    return None
