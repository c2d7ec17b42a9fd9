"""The backward pass's launch configurations (``kernels/triton/bwd.py``), chosen from public facts only.

``block_m1 x block_n1``: the dK/dV kernel's query tile (walked) and key tile (held with its dK/dV
accumulators); ``block_m2 x block_n2``: the dQ kernel's query tile (held) and key tile (walked). The
Hopper rows are measured (docs/perf-notes.md, v19, v29, v33); the generic row is a safe guess for other GPUs."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .tables import is_hopper


@dataclass(frozen=True)
class BwdConfig:
    block_m1: int
    block_n1: int
    num_warps1: int
    num_stages1: int
    block_m2: int
    block_n2: int
    num_warps2: int
    num_stages2: int
    # dQ added into an fp32 buffer inside the dK/dV kernel (five products per tile pair instead of seven, but the
    # order of the additions varies): never with deterministic=True. With a Gluon form (below) the Gluon kernel adds
    # it by the copy engine's reduce-add, and where that kernel cannot serve the views the dQ kernel runs instead;
    # without one, the Triton dK/dV kernel adds it with per-thread atomics (slower everywhere measured, v19)
    atomic_dq: bool = False
    # dK/dV on the Hopper Gluon kernel (kernels/sm90/bwd.py) where the views suit it, with (query tile, key tile,
    # warps, Q/dO ring depth); None, or views it cannot address (varlen, a zero stride): the Triton kernel above
    gluon_dkdv: tuple[int, int, int, int] | None = None
    # deterministic=True's fused dQ (v41): the Gluon form's reduce-adds in a fixed order of key tiles, each program
    # waiting for its turn at every query tile (kernels.sm90.bwd._dq_turn), so the fp32 sums are the same in every
    # run. Where the Gluon fused form cannot run it (GQA, views it cannot address), the dQ kernel runs instead
    ordered_dq: bool = False


# The Gluon dK/dV kernel's forms on Hopper (v29; H100 sweeps in bench/results/sweeps/bwd-v29-*): (query tile, key
# tile, warps, Q/dO ring depth). D=128: two consumer warpgroups of 64 keys, a two-slot ring (6.51 against the Triton
# kernel's 6.99 ms at 4x32x4096, 1.96 against 2.28 at 2x32/8x4096 causal; three slots 6.69). D=64: one warpgroup,
# two programs per SM, three slots (0.87 against 0.99 ms at 8x16x2048, 1.89 against 2.14 at 4x32x4096 causal;
# two warpgroups 1.02 / 2.21). None spills (sm_90a, compiled on the CPU).
GLUON_DKDV = {128: (64, 128, 8, 2), 64: (64, 64, 4, 3)}

# D=64's fused form (v39, H200, same-run A/Bs, bench/results/sweeps/bwd-v39-wide-d64-*-h200.json): 128-query steps
# on two consumer warpgroups (launch.sm90_bwd.WIDE_STEP), dQ added by the copy engine, with GQA a program per K/V
# head. Against the dQ-kernel form above: 0.91-0.95x the time non-causal (8x16x2048, 4x32x4096), 0.87 with GQA
# (8x16/2x2048); causal 0.90 at 1x16x16384 and 0.95 at 2x16/8x8192, a tie at 4096 (0.95-1.04 over three runs) and
# 1.05-1.10 at 2048 (short programs). v40's widened P^T (WIDE_STEP's widen_asm, causal 2.4-5.3% faster) moved 4096 to
# 0.92 (4x32x4096x64 causal, 1832 against 1991 us) and 2048 to 1.02 (8x16x2048x64 causal, 579 against 566): causal
# takes it from WIDE_CAUSAL_MIN_SEQLEN queries (bench/results/sweeps/bwd-v40-widen-ab-h200.json)
WIDE_D64 = (128, 128, 8, 2)
WIDE_CAUSAL_MIN_SEQLEN = 4096

# deterministic=True at D=128 on Hopper: the ordered fused form (v41, H200, same-run A/Bs against the default's speed,
# bench/results/sweeps/bwd-v41-ordered-*-h200.json): non-causal 0.96-0.99 (the dQ kernel: 0.84-0.88), causal 0.98 at
# 4x32x4096 (0.86-0.87) but 0.79-0.90 at 1x32x16384 (0.89-0.90; its longest programs go last, and its times spread
# 12.8-14.9 ms in one run): causal takes it up to ORDERED_CAUSAL_MAX_SEQLEN queries. ORDERED_DQ off: the dQ kernel
ORDERED_DQ = True
ORDERED_CAUSAL_MAX_SEQLEN = 8192

# Small tiles keep the interpreter fast; m != n exercises the causal stage split in both kernels.
INTERPRETER = BwdConfig(16, 32, 4, 1, 32, 16, 4, 1)


def backward_config(arch, *, head_dim: int, dtype_name: str, causal: bool, deterministic: bool,
                    seqlen_q: int = 0) -> BwdConfig:
    """The configuration for these facts (``arch``: compute capability, None for CPU tensors/interpreter;
    ``seqlen_q``: the query length, or the varlen maximum; 0 if unknown)."""
    if arch is None:
        cfg = INTERPRETER
    elif dtype_name == "fp32":  # no tensor-core format at 16 bits: half the tile, or the registers spill
        cfg = BwdConfig(32, 64, 4, 1, 64, 32, 4, 1)
    elif is_hopper(arch):
        cfg = _hopper(head_dim, causal, seqlen_q)
    elif head_dim > 128:
        cfg = BwdConfig(32, 64, 4, 1, 64, 32, 4, 1)
    else:
        cfg = BwdConfig(32, 64, 4, 2, 64, 32, 4, 2)
    if deterministic and cfg.atomic_dq:
        if (head_dim == 128 and cfg.gluon_dkdv == GLUON_DKDV[128] and ORDERED_DQ
                and (not causal or seqlen_q <= ORDERED_CAUSAL_MAX_SEQLEN)):
            cfg = replace(cfg, ordered_dq=True)
        else:  # (the Gluon kernel's form without dQ in it: the head dim's own)
            cfg = replace(cfg, atomic_dq=False, gluon_dkdv=GLUON_DKDV.get(head_dim) if cfg.gluon_dkdv else None)
    return cfg


def _hopper(head_dim: int, causal: bool, seqlen_q: int) -> BwdConfig:
    """Sweeps v19.0-v19.2 (H100, bf16, bench/results/sweeps/bwd-v19-h100.json): D=64 wants narrow query tiles and
    four warps (8x16x2048: 295 TF against 263 at 64x128w8s2, 344-351 since v19.2; 4x32x4096 causal 312 against
    228); D=128 wants eight warps and a deeper pipeline (4x32x4096: 372 TF, causal 350, against 357/318 at s2).
    The Triton kernel's fp32 atomics for dQ lost everywhere (320 against 357 TF at D=128); the Gluon kernel's reduce-add
    wins at D=128 (v33, below). D=256: v26."""
    if head_dim <= 64:
        if head_dim == 64 and (not causal or seqlen_q >= WIDE_CAUSAL_MIN_SEQLEN):
            return BwdConfig(32, 128, 4, 3, 64, 64, 4, 3, atomic_dq=True, gluon_dkdv=WIDE_D64)
        return BwdConfig(32, 128, 4, 3, 64, 64, 4, 3, gluon_dkdv=GLUON_DKDV.get(head_dim))
    if head_dim <= 128:
        # v33 (H200, same-run A/B, bench/results/sweeps/bwd-v33-h200.json): dQ inside the Gluon kernel at D=128,
        # 5693-5838 against 6429-6659 us at 4x32x4096, 3149-3171 against 3594-3653 causal, 11.0-11.4 against
        # 12.6-12.8 ms at 1x32x16384 causal (the dQ-kernel form with its shared-memory operands); with GQA one
        # program per query head, dK/dV added up in fp32 (v33.7): 11.9 against 13.4-13.6 ms at 2x64/8x8192 causal,
        # 3331-3354 against 3686-3726 us at 4x32/8x4096 causal, 1666-1667 against 1671-1729 at 2x32/8x4096 causal.
        # D=64 loses (1075 against 865 us at 8x16x2048, two warpgroups; one: 1465): the dQ kernel there.
        return BwdConfig(64, 128, 8, 4, 128, 64, 8, 4, atomic_dq=head_dim == 128,
                         gluon_dkdv=GLUON_DKDV.get(head_dim))
    # D=256 (sweep v26, H200, bf16, bench/results/sweeps/bwd-v26-d256-h200.json): 4x16x4096x256 164 TF against 114
    # (non-causal) and 67 (causal) for v19's guess, 32x64w4s1-64x32w4s1, which spilled 2.4 KB per thread in dK/dV
    # (sm_90a, compiled on the CPU; this one has 10 STL and 14 LDL in dK/dV, none in dQ)
    return BwdConfig(32, 64, 8, 2, 64, 64, 8, 2)


def bwd_config_name(cfg: BwdConfig | None) -> str:
    """``64x128w8s2-128x64w8s2`` (+ ``-atomic``): the name sweeps and benchmarks use; ``auto`` for None."""
    if cfg is None:
        return "auto"
    c = cfg
    return (f"{c.block_m1}x{c.block_n1}w{c.num_warps1}s{c.num_stages1}-{c.block_m2}x{c.block_n2}w{c.num_warps2}"
            f"s{c.num_stages2}{'-atomic' if c.atomic_dq else ''}{'-ordered' if c.ordered_dq else ''}"
            f"{'-gluon%dx%dw%ds%d' % c.gluon_dkdv if c.gluon_dkdv else ''}")


def parse_bwd_config_name(text: str) -> BwdConfig | None:
    if text == "auto":
        return None
    m = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)-(\d+)x(\d+)w(\d+)s(\d+)(-atomic)?(-ordered)?"
                     r"(?:-gluon(\d+)x(\d+)w(\d+)s(\d+))?", text)
    if m is None:
        raise ValueError(f"cannot parse a backward config name from {text!r}")
    g = m.groups()
    return BwdConfig(*(int(x) for x in g[:8]), atomic_dq=bool(g[8]), ordered_dq=bool(g[9]),
                     gluon_dkdv=tuple(int(x) for x in g[10:]) if g[10] else None)
