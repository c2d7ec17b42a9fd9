"""Correctness against the float64 reference, on slices cheap enough for any shape.

A full float64 reference of a 32k-token shape would need tens of GiB, so the check compares a
few pieces of the output: the first and last batch, the first and last query head (which also
exercises the GQA head mapping), and the first and last ``window`` query rows. Causal masks
are bottom-right aligned, so a window of rows ``[r0, r1)`` with keys ``[0, r1 + Sk - Sq)`` has
exactly the visibility it has in the full problem: the reference on the slice is exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .backends import Inputs

Tensor = torch.Tensor
DEFAULT_WINDOW = 256
DEFAULT_TOLERANCE = 2e-2  # relative error ||out - ref|| / ||ref|| for fp16/bf16


@dataclass
class Piece:
    """A slice of the canonical output and its float64 reference (``[heads, rows, D]``)."""

    select: Callable[[Tensor], Tensor]
    ref: Tensor


def _reference_fn():
    try:
        from flashcore.reference import attention
    except Exception:  # pragma: no cover - flashcore.reference is part of the package
        return _local_reference
    return attention


def _local_reference(q, k, v, *, causal, scale):
    """Minimal float64 reference (same semantics), used only if flashcore.reference is missing."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    Sq, Sk = s.shape[-2:]
    if causal:
        i = torch.arange(Sq, device=s.device).view(-1, 1)
        j = torch.arange(Sk, device=s.device).view(1, -1)
        s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows that see no key → zeros
    return torch.matmul(p, v)


def row_windows(n_rows: int, window: int) -> list:
    """The query-row ranges to check: all rows if few, else the first and the last ``window``."""
    if n_rows <= 2 * window:
        return [(0, n_rows)]
    return [(0, window), (n_rows - window, n_rows)]


def key_extent(r1: int, Sq: int, Sk: int, causal: bool) -> int:
    """Keys a causal window ending at row ``r1`` can see (its reference is exact on ``[0, extent)``)."""
    return min(Sk, r1 + Sk - Sq) if causal else Sk


def _window_reference(q, k, v, heads, kv_heads, r0, r1, causal, scale, ref_fn) -> Tensor:
    """q ``[Sq, Hq, D]``-like views already cut to one sequence: returns ``[heads, rows, D]`` float64."""
    Sq, Sk = q.shape[0], k.shape[0]
    extent = key_extent(r1, Sq, Sk, causal)
    if extent <= 0:  # every row of the window sees no key
        return torch.zeros(len(heads), r1 - r0, q.shape[-1], dtype=torch.float64, device=q.device)
    qs = q[r0:r1][:, heads].transpose(0, 1).unsqueeze(0).contiguous()
    ks = k[:extent][:, kv_heads].transpose(0, 1).unsqueeze(0).contiguous()
    vs = v[:extent][:, kv_heads].transpose(0, 1).unsqueeze(0).contiguous()
    return ref_fn(qs, ks, vs, causal=causal, scale=scale)[0].to(torch.float64)


def reference_pieces(inputs: Inputs, window: int = DEFAULT_WINDOW, ref_fn=None) -> list:
    """Float64 reference pieces for ``inputs`` (computed once per shape, shared by all backends)."""
    ref_fn = ref_fn or _reference_fn()
    s = inputs.shape
    heads = sorted({0, s.Hq - 1})
    group = s.Hq // s.Hkv
    kv_heads = [h // group for h in heads]
    pieces = []
    with torch.no_grad():
        for start, length, index in _sequences(inputs):
            # Each sequence as [S, H, D] views (the reference slices rows and heads from these).
            q, k, v = index(inputs.q), index(inputs.k), index(inputs.v)
            for r0, r1 in row_windows(length, window):
                ref = _window_reference(q, k, v, heads, kv_heads, r0, r1, s.causal, inputs.scale, ref_fn)
                pieces.append(Piece(_selector(index, heads, r0, r1), ref))
    return pieces


def _sequences(inputs: Inputs):
    """(start, length, index) for the sequences to check; ``index(t)`` → that sequence as [S, H, D]."""
    s = inputs.shape
    if s.is_varlen:
        starts = [0]
        for n in s.varlen:
            starts.append(starts[-1] + n)
        nonempty = [i for i, n in enumerate(s.varlen) if n > 0]
        for i in sorted({nonempty[0], nonempty[-1]}):
            a, n = starts[i], s.varlen[i]
            yield a, n, (lambda t, a=a, n=n: t[a:a + n])
    else:
        for b in sorted({0, s.B - 1}):
            yield b, s.Sq, (lambda t, b=b: t[b].transpose(0, 1))


def _selector(index, heads, r0, r1):
    def select(out: Tensor) -> Tensor:
        return index(out)[r0:r1][:, heads].transpose(0, 1)

    return select


def relative_error(out: Tensor, pieces: list) -> float:
    """||out − ref|| / ||ref|| over all pieces (inf if the output has NaN/Inf there)."""
    num = 0.0
    den = 0.0
    with torch.no_grad():
        for piece in pieces:
            got = piece.select(out).to(torch.float64)
            if got.shape != piece.ref.shape:
                raise ValueError(f"output slice has shape {tuple(got.shape)}, expected {tuple(piece.ref.shape)}")
            if not bool(torch.isfinite(got).all()):
                return math.inf
            num += float(torch.sum((got - piece.ref) ** 2))
            den += float(torch.sum(piece.ref ** 2))
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def check_output(out: Tensor, pieces: list, tolerance: float = DEFAULT_TOLERANCE) -> tuple:
    """(ok, rel_err). ``ok`` is False for NaN/Inf or an error above ``tolerance``."""
    err = relative_error(out, pieces)
    return (math.isfinite(err) and err <= tolerance), err


def expected_canonical_shape(inputs: Inputs) -> tuple:
    s = inputs.shape
    if s.is_varlen:
        return (s.total_tokens, s.Hq, s.D)
    return (s.B, s.Hq, s.Sq, s.D)


def describe_mismatch(out: Optional[Tensor], inputs: Inputs) -> Optional[str]:
    """A reason string when the output is not a tensor of the expected canonical shape."""
    if not isinstance(out, Tensor):
        return f"returned {type(out).__name__}, not a tensor"
    want = expected_canonical_shape(inputs)
    if tuple(out.shape) != want:
        return f"output shape {tuple(out.shape)}, expected {want}"
    return None
