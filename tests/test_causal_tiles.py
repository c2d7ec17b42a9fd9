"""Causal masking at tile boundaries (interpreter, fp32, against the float64 reference).

The Triton kernel splits each row tile's key loop into an unmasked stage (key tiles wholly below the
diagonal of the tile's first row) and a masked stage (tiles on the diagonal or past the end of the
keys). Where those stages meet depends on ``(Sk - Sq) mod BLOCK_N`` and, through the row tiles, on
``BLOCK_M``: an off-by-one there is exact for most shapes and wrong for a few residues. So these tests
sweep every residue of ``Sk - Sq`` modulo the tile sizes the planner actually selects (read from the
plan, not assumed), with the bottom-right causal alignment, for ``Sk > Sq`` and ``Sk < Sq``.
"""
import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st

import flashcore
from conftest import INTERPRET, rel_err

pytestmark = pytest.mark.interp
warnings.filterwarnings("ignore", category=RuntimeWarning)

TOL = 1e-5  # fp32: IEEE products on the interpreter path
ROW_TOL = 1e-4  # per query row (a row's rel err is ~1e-6 when right)
D = 16


def _plan_tiles(Sq: int, Sk: int, Hq: int = 1, Hkv: int = 1, d: int = D) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the plan the interpreter selects for this causal fp32 problem."""
    q = torch.empty(1, Hq, Sq, d)
    k = torch.empty(1, Hkv, Sk, d)
    plan = flashcore.plan_attention(q, k, k, causal=True, backend="triton", return_lse=True)
    assert plan is not None and plan.selection.kernel == "triton_fwd", plan and plan.selection.explain()
    return plan.selection.config.block_m, plan.selection.config.block_n


def _default_tiles() -> tuple[int, int]:
    if INTERPRET:
        return _plan_tiles(70, 70)
    from flashcore.plan.tables import INTERPRETER  # collected without the interpreter: the tests are skipped
    return INTERPRETER.block_m, INTERPRETER.block_n


BLOCK_M, BLOCK_N = _default_tiles()
PERIOD = math.lcm(BLOCK_M, BLOCK_N)  # every residue mod BLOCK_N and mod BLOCK_M


def _run(Sq, Sk, Hq=1, Hkv=1, d=D, B=1, seed=0, scale_qk=1.0):
    gen = torch.Generator().manual_seed(seed)
    # unit scores: a key that leaks into a row (or goes missing) carries a weight of ~1/(keys seen), not ~0
    q = torch.randn(B, Hq, Sq, d, generator=gen) * scale_qk
    k = torch.randn(B, Hkv, Sk, d, generator=gen) * scale_qk
    v = torch.randn(B, Hkv, Sk, d, generator=gen)
    out = torch.full_like(q, float("nan"))  # poisoned: every row must be written
    res, lse = flashcore.attention(q, k, v, causal=True, return_lse=True, backend="triton", out=out)
    ref, ref_lse = flashcore.reference.attention(q, k, v, causal=True, return_lse=True)
    return res, lse, ref, ref_lse


def _errors(Sq, Sk, **kw) -> list[str]:
    """What is wrong with one causal call (empty: nothing)."""
    out, lse, ref, ref_lse = _run(Sq, Sk, **kw)
    bad = []
    if torch.isnan(out).any():
        bad.append("NaN in the output")
    else:
        e = rel_err(out, ref)
        if e >= TOL:
            bad.append(f"rel err {e:.2e}")
        # row by row: one key leaking into one row (a tile boundary one off) barely moves the global norm
        row_err = (out.double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
        worst = row_err.max().item()
        if worst >= ROW_TOL:
            bad.append(f"{int((row_err >= ROW_TOL).sum())} rows wrong, worst row rel err {worst:.2e}")
    seen = torch.isfinite(ref_lse)
    if not torch.equal(torch.isfinite(lse), seen):
        bad.append("lse finite where the reference's is not (or the reverse)")
    elif not torch.allclose(lse[seen].double(), ref_lse[seen], atol=1e-4, rtol=1e-5):
        bad.append("lse differs")
    if not bool((out[~seen] == 0).all()):  # rows that see no key (Sq > Sk): exact zeros
        bad.append("rows that see no key are not zero")
    return [f"Sq={Sq} Sk={Sk} (Sk-Sq)%{BLOCK_N}={(Sk - Sq) % BLOCK_N}: {b}" for b in bad]


def test_tile_sizes_come_from_the_plan_and_are_consistent():
    # the residues below are only a sweep if every shape swept runs with the same tiles
    assert BLOCK_M % BLOCK_N == 0 or BLOCK_N % BLOCK_M == 0, (BLOCK_M, BLOCK_N)
    for Sq, Sk in ((2 * PERIOD + 5, 2 * PERIOD + 5 + PERIOD - 1), (2 * PERIOD + 5, 1), (1, 2 * PERIOD)):
        assert _plan_tiles(Sq, Sk) == (BLOCK_M, BLOCK_N)


@pytest.mark.parametrize("longer", ["keys", "queries"])
def test_every_residue_of_the_diagonal_offset(longer):
    """Sk - Sq takes every residue modulo lcm(BLOCK_M, BLOCK_N), with Sk > Sq and with Sk < Sq. Sq spans
    two full row tiles and a partial one, so the diagonal crosses tiles at every offset."""
    Sq = 2 * BLOCK_M + 5
    if longer == "queries":
        Sq += PERIOD  # room for Sk = Sq - PERIOD .. Sq - 1
    failures = []
    for r in range(PERIOD):
        Sk = Sq + r if longer == "keys" else Sq - (PERIOD - r)
        assert Sk >= 1 and (Sk - Sq) % PERIOD == r
        failures += _errors(Sq, Sk, seed=r)
    assert not failures, "\n".join(failures)


def test_every_residue_with_query_length_a_tile_multiple():
    """The same sweep with Sq a multiple of BLOCK_M (no partial row tile) and GQA."""
    Sq = 2 * BLOCK_M
    failures = []
    for r in range(PERIOD):
        Sk = Sq - PERIOD + r if r else Sq + PERIOD
        assert Sk >= 1 and (Sk - Sq) % PERIOD == r
        failures += _errors(Sq, Sk, Hq=2, Hkv=1, seed=100 + r)
    assert not failures, "\n".join(failures)


# fixed examples: every residue of Sk - Sq modulo BLOCK_N, once with Sk > Sq and once with Sk < Sq, at
# row lengths that are and are not tile multiples; the generated examples add shapes beyond these
_EXAMPLES = []
for _r in range(BLOCK_N):
    _EXAMPLES.append((BLOCK_M + 3 + _r % 3, BLOCK_M + 3 + _r % 3 + _r + (BLOCK_N if _r == 0 else 0)))
    _EXAMPLES.append((BLOCK_M + BLOCK_N + 7, BLOCK_M + BLOCK_N + 7 - (BLOCK_N - _r)))


def _with_examples(f):
    for Sq, Sk in _EXAMPLES:
        f = example(Sq=Sq, Sk=Sk, groups=(1, 1), d=D, seed=Sq * 1000 + Sk)(f)
    return f


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@_with_examples
@given(Sq=st.integers(1, 3 * BLOCK_M + 1), Sk=st.integers(1, 3 * BLOCK_M + 1),
       groups=st.sampled_from([(1, 1), (2, 1), (4, 2)]), d=st.sampled_from([8, 16, 40]),
       seed=st.integers(0, 2**31 - 1))
def test_property_causal_cross_attention(Sq, Sk, groups, d, seed):
    if Sq == Sk:
        Sk += 1
    Hq, Hkv = groups
    errs = _errors(Sq, Sk, Hq=Hq, Hkv=Hkv, d=d, seed=seed)
    assert not errs, "\n".join(errs)
