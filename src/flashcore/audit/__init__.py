"""The constant-time audit gates (``flashcore audit``): :mod:`.sass` (static SASS taint analysis),
:mod:`.counters`, :mod:`.repro` and :mod:`.timing` (GPU gates), wired together by :mod:`.cli`.

``sass_taint`` is exported here lazily: importing ``flashcore.audit`` does not import the SASS gate, so
a broken or missing gate module never breaks the others.
"""
from __future__ import annotations

__all__ = ["sass_taint"]


def __getattr__(name: str):
    if name == "sass_taint":
        from .sass import sass_taint

        return sass_taint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
