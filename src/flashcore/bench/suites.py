"""Benchmark shapes: the built-in suites and the JSON suite-file format.

A shape is one attention problem. Dense shapes are ``q [B, Hq, Sq, D]``, ``k/v [B, Hkv, Sk, D]``;
a varlen shape packs ``len(varlen)`` sequences (query length == key length per sequence) into
``[total, H, D]``. Causal masks are bottom-right aligned (query i sees key j iff
``j <= i + Sk - Sq``), as in :func:`flashcore.attention`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .results import read_json_file


class SuiteError(ValueError):
    """A suite name or suite file is unusable; the message names the bad field."""


@dataclass(frozen=True)
class Shape:
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    causal: bool = False
    varlen: Optional[tuple] = None  # sequence lengths; then B == len(varlen), Sq == Sk == max length

    @staticmethod
    def dense(B: int, H: int, S: int, D: int, causal: bool = False, *, Hkv: Optional[int] = None,
              Sk: Optional[int] = None) -> "Shape":
        return Shape(B, H, Hkv or H, S, Sk or S, D, bool(causal))

    @staticmethod
    def packed(lengths: Sequence[int], H: int, D: int, causal: bool = False, *, Hkv: Optional[int] = None) -> "Shape":
        lens = tuple(int(n) for n in lengths)
        longest = max(lens) if lens else 0
        return Shape(len(lens), H, Hkv or H, longest, longest, D, bool(causal), lens)

    @property
    def is_varlen(self) -> bool:
        return self.varlen is not None

    @property
    def gqa(self) -> bool:
        return self.Hq != self.Hkv

    @property
    def total_tokens(self) -> int:
        return sum(self.varlen) if self.is_varlen else self.B * self.Sq

    @property
    def key(self) -> str:
        """Stable identifier used to match shapes across runs (``--compare``)."""
        if self.is_varlen:
            digest = _short_digest(self.varlen)
            core = f"varlen{self.B}t{self.total_tokens}-{digest}x{self.Hq}x{self.D}"
        else:
            core = f"{self.B}x{self.Hq}x{self.Sq}x{self.D}"
            if self.Sk != self.Sq:
                core += f"-sk{self.Sk}"
        if self.gqa:
            core += f"-kv{self.Hkv}"
        return core + ("-causal" if self.causal else "")

    @property
    def label(self) -> str:
        """Human-readable name (B×H×S×D)."""
        return self.key.replace("x", "×")

    def visible_pairs_per_head(self) -> int:
        """Query/key pairs that take part in attention, per head (summed over the batch).

        Causal with Sq == Sk counts S²/2 (the usual convention for FLOP counts); for Sq != Sk the
        visible pairs are counted exactly.
        """
        if self.is_varlen:
            return sum(_pairs(n, n, self.causal) for n in self.varlen)
        return self.B * _pairs(self.Sq, self.Sk, self.causal)

    @property
    def flops(self) -> int:
        """Forward FLOPs: two matmuls of 2·D FLOPs per visible pair."""
        return 4 * self.Hq * self.D * self.visible_pairs_per_head()

    def io_bytes(self, element_size: int) -> int:
        """Minimal HBM traffic: read q, k, v once and write o once."""
        tq = self.total_tokens
        tk = sum(self.varlen) if self.is_varlen else self.B * self.Sk
        return element_size * self.D * (2 * tq * self.Hq + 2 * tk * self.Hkv)

    def score_bytes(self, element_size: int) -> int:
        """Size of the full score matrix S = q·kᵀ (what an unfused implementation materialises)."""
        if self.is_varlen:
            return element_size * self.Hq * sum(n * n for n in self.varlen)
        return element_size * self.B * self.Hq * self.Sq * self.Sk

    def to_dict(self) -> dict:
        d = {"B": self.B, "Hq": self.Hq, "Hkv": self.Hkv, "Sq": self.Sq, "Sk": self.Sk, "D": self.D,
             "causal": self.causal}
        d["varlen"] = list(self.varlen) if self.is_varlen else None
        return d


def _pairs(sq: int, sk: int, causal: bool) -> int:
    if not causal:
        return sq * sk
    if sq == sk:
        return sq * sk // 2
    seen = np.clip(np.arange(sq, dtype=np.int64) + (sk - sq) + 1, 0, sk)
    return int(seen.sum())


def _short_digest(lengths) -> str:
    import hashlib

    return hashlib.sha1(",".join(map(str, lengths)).encode()).hexdigest()[:6]


# The built-in suites (issue 3); the GPU tools (``flashcore bench gpu-check|sweep``) run them too.
SEED: tuple = (
    Shape.dense(1, 8, 512, 64),
    Shape.dense(1, 16, 1024, 64),
    Shape.dense(4, 16, 1024, 64),
    Shape.dense(16, 16, 2048, 64),
)
LARGE: tuple = (
    Shape.dense(4, 32, 4096, 64),
    Shape.dense(4, 32, 4096, 64, causal=True),
    Shape.dense(4, 32, 4096, 128),
    Shape.dense(4, 32, 4096, 128, causal=True),
    Shape.dense(1, 32, 16384, 128),
    Shape.dense(1, 32, 16384, 128, causal=True),
    Shape.dense(1, 16, 32768, 128),
    Shape.dense(1, 16, 32768, 128, causal=True),
)
SUITES: dict = {"seed": SEED, "large": LARGE, "all": SEED + LARGE}


# ---------------------------------------------------------------- suite files
_FIELDS = {"B", "Hq", "Hkv", "Sq", "Sk", "D", "causal", "varlen"}


def _int_field(entry: dict, name: str, where: str, *, required: bool, minimum: int = 1) -> Optional[int]:
    if name not in entry:
        if required:
            raise SuiteError(f"{where}: missing required field '{name}'")
        return None
    value = entry[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise SuiteError(f"{where}: field '{name}' must be an integer, got {value!r}")
    if value < minimum:
        raise SuiteError(f"{where}: field '{name}' must be >= {minimum}, got {value}")
    return value


def shape_from_dict(entry, where: str = "shape") -> Shape:
    """Validate one suite entry and build its :class:`Shape` (SuiteError names the bad field)."""
    if not isinstance(entry, dict):
        raise SuiteError(f"{where}: must be a JSON object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise SuiteError(f"{where}: unknown field '{unknown[0]}' (allowed: {', '.join(sorted(_FIELDS))})")
    Hq = _int_field(entry, "Hq", where, required=True)
    Hkv = _int_field(entry, "Hkv", where, required=False)
    D = _int_field(entry, "D", where, required=True)
    causal = entry.get("causal", False)
    if not isinstance(causal, bool):
        raise SuiteError(f"{where}: field 'causal' must be true or false, got {causal!r}")
    if Hkv is not None and Hq % Hkv != 0:
        raise SuiteError(f"{where}: field 'Hkv' ({Hkv}) must divide 'Hq' ({Hq})")
    if D % 8 != 0 or D > 256:
        raise SuiteError(f"{where}: field 'D' must be a multiple of 8 between 8 and 256, got {D}")

    if "varlen" in entry:
        return _varlen_shape(entry, where, Hq, Hkv, D, causal)
    B = _int_field(entry, "B", where, required=True)
    Sq = _int_field(entry, "Sq", where, required=True)
    Sk = _int_field(entry, "Sk", where, required=False)
    return Shape.dense(B, Hq, Sq, D, causal, Hkv=Hkv, Sk=Sk)


def _varlen_shape(entry: dict, where: str, Hq: int, Hkv, D: int, causal: bool) -> Shape:
    lens = entry["varlen"]
    if not isinstance(lens, list) or not lens:
        raise SuiteError(f"{where}: field 'varlen' must be a non-empty list of sequence lengths, got {lens!r}")
    for i, n in enumerate(lens):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise SuiteError(f"{where}: field 'varlen' item {i} must be a non-negative integer, got {n!r}")
    if max(lens) == 0:
        raise SuiteError(f"{where}: field 'varlen' needs at least one non-empty sequence")
    for name in ("Sq", "Sk"):
        if name in entry:
            raise SuiteError(f"{where}: field '{name}' cannot be combined with 'varlen' (lengths come from the list)")
    B = _int_field(entry, "B", where, required=False)
    if B is not None and B != len(lens):
        raise SuiteError(f"{where}: field 'B' ({B}) must equal the number of 'varlen' sequences ({len(lens)})")
    return Shape.packed(lens, Hq, D, causal, Hkv=Hkv)


def parse_suite(data, source: str = "suite") -> list:
    """A list of shape objects (or ``{"shapes": [...]}``) → list of Shape."""
    if isinstance(data, dict) and "shapes" in data:
        data = data["shapes"]
    if not isinstance(data, list):
        raise SuiteError(f"{source}: must be a JSON list of shape objects, got {type(data).__name__}")
    if not data:
        raise SuiteError(f"{source}: the list of shapes is empty")
    return [shape_from_dict(entry, f"{source}: shape #{i}") for i, entry in enumerate(data)]


def load_suite_file(path: str) -> list:
    return parse_suite(read_json_file(path, "suite file", SuiteError), path)


def parse_shapes(text: str) -> list:
    """``1x16x1024x64,4x16x1024x64c`` -> dense :class:`Shape` objects (a trailing ``c``: causal): how the GPU
    tools (``flashcore bench timeline``, ``bench/experiments``) take shapes on the command line."""
    out = []
    for item in text.split(","):
        item = item.strip()
        causal = item.endswith("c")
        try:
            B, H, S, D = (int(x) for x in (item[:-1] if causal else item).split("x"))
        except ValueError:
            raise SuiteError(f"a shape is BxHxSxD, with a trailing c for causal: got {item!r}") from None
        if min(B, H, S, D) < 1:
            raise SuiteError(f"a shape's sizes must be positive: got {item!r}")
        out.append(Shape.dense(B, H, S, D, causal))
    return out


def resolve_suite(name_or_path: str) -> list:
    """``seed`` / ``large`` / ``all`` or the path of a JSON suite file."""
    if name_or_path in SUITES:
        return list(SUITES[name_or_path])
    if not name_or_path.lower().endswith(".json") and not os.path.exists(name_or_path):
        raise SuiteError(f"unknown suite '{name_or_path}': use one of {', '.join(SUITES)} or the path of a JSON file")
    return load_suite_file(name_or_path)


def as_shapes(shapes) -> list:
    """Accept a suite name, Shape objects or suite dicts (for the Python API)."""
    if isinstance(shapes, str):
        return resolve_suite(shapes)
    out = []
    for i, s in enumerate(shapes):
        out.append(s if isinstance(s, Shape) else shape_from_dict(s, f"shape #{i}"))
    if not out:
        raise SuiteError("no shapes to benchmark")
    return out

