"""Reuse of a committed analysis for the same machine code (``flashcore audit sass --reuse REPORT``).

The machine-code analysis (:func:`.analyze.analyze_cubin`) is a pure function of its inputs: the cubin's sections
other than its debug ones (:func:`code_digest`), the kernel's name, the parameter table it is read with, the secret
set, the shared-memory split, the analyser's source (:data:`ANALYSER_MODULES`) and the ``nvdisasm`` binary that
lists the code. :func:`analysis_key` hashes all of them. A report written by ``audit sass --json`` carries each
kernel's key, so a later run that compiles the same configuration to the same code, under the same analyser, can
take the earlier result instead of disassembling and
analysing again (about 1.5 s of CPU per kernel, 1,278 kernels per Triton version: most of CI's time).

Only clean results are taken (no violation, no error): a kernel with findings is always analysed again, so its
report is current. The launch-level checks (:func:`.analyze.launcher_choice_violations`,
:func:`.analyze.specialisation_violations`) and the compile are never reused; they run every time.

Why a key match is enough: every input of the analysis is in it, including the analyser's own code, so a change
to the analyser, the disassembler, a kernel, its parameters or its secret set misses and is analysed. What the
key cannot see is nondeterminism in the analysis itself; ``--verify N`` re-analyses N reused kernels, picked at
random, and fails the gate if any result differs from the one taken."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import struct

from .report import ParamInfo, Report

_FINGERPRINT: str | None = None
#: the active memo: analysis key -> the stored report's dict (set by :func:`activate`; inherited by forked workers)
_MEMO: dict[str, dict] = {}


#: the modules whose code decides an analysis (:func:`.analyze.analyze_cubin` and what it imports from this package).
#: Not the command line, the package's front module or this reuse layer: edits there change no analysis, and a
#: change to the fingerprint sends CI through every kernel again until the committed reports are re-run.
ANALYSER_MODULES = ("analyze", "cfg", "compile", "elf", "isa", "params", "report", "taint")


def analyser_fingerprint() -> str:
    """sha256 over the analyser's Python sources (:data:`ANALYSER_MODULES`) and the ``nvdisasm`` binary the listing
    comes from; computed once per process."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        from .compile import _tool

        h = hashlib.sha256()
        here = os.path.dirname(os.path.abspath(__file__))
        for name in ANALYSER_MODULES:
            h.update(name.encode())
            with open(os.path.join(here, name + ".py"), "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        with open(_tool("nvdisasm"), "rb") as f:
            h.update(b"nvdisasm")
            h.update(hashlib.sha256(f.read()).digest())
        _FINGERPRINT = h.hexdigest()
    return _FINGERPRINT


#: what the content keys hash of a cubin (:func:`code_digest`); part of every key, so a change here misses them all
KEY_SCHEME = "non-debug-sections-1"
#: a key of this scheme -> the whole-cubin key of the same analysis (the scheme before 2026-11-30), for :func:`lookup`
_LEGACY: dict[str, str] = {}
_SHT_NOBITS = 8  # ELF: a section that occupies no file space (.nv.shared.*)


def code_digest(cubin: bytes) -> bytes:
    """sha256 over every section of ``cubin`` whose name does not contain "debug" (name, type, size and bytes, in
    name order; a section without file contents by its size): the machine code, its ``.nv.info`` tables, symbols,
    relocations and constants, all that ``nvdisasm -c`` lists and :func:`.analyze.analyze_cubin` reads. Not the
    debug sections: they hold the source's paths and line numbers, so a kernel edit that moves another form's lines,
    or a checkout in another folder, changes them and nothing the analysis sees (2026-11-30: three secure decode
    forms compiled before and after an edit above them differed in ``.debug_line`` alone, and their ``nvdisasm -c``
    listings were identical). A blob that is not an ELF64 cubin is hashed whole."""
    from .elf import _sections

    try:
        secs = _sections(cubin)
    except (ValueError, IndexError, struct.error):
        return hashlib.sha256(cubin).digest()
    h = hashlib.sha256()
    for name in sorted(secs):
        if "debug" in name:
            continue
        off, size, typ = secs[name]
        h.update(f"{name}\0{typ}\0{size}\0".encode())
        if typ != _SHT_NOBITS:
            h.update(cubin[off:off + size])
    return h.digest()


def _key(code: bytes, kernel, expected_params, secret, smem_control_from, scheme: str | None) -> str:
    h = hashlib.sha256()
    h.update(analyser_fingerprint().encode())
    if scheme:
        h.update(scheme.encode())
    h.update(code)
    rest = {"kernel": kernel, "params": [list(p) for p in expected_params] if expected_params is not None else None,
            "secret": sorted(secret), "smem": repr(smem_control_from)}
    h.update(json.dumps(rest, sort_keys=True).encode())
    return h.hexdigest()


def analysis_key(cubin: bytes, kernel: str | None, expected_params, secret, smem_control_from) -> str:
    """The content key of one machine-code analysis: every input of :func:`.analyze.analyze_cubin` (the cubin by
    :func:`code_digest`) and the analyser's fingerprint. The same analysis's key under the earlier whole-cubin
    scheme is kept beside it, so :func:`lookup` can take a report keyed that way (a stricter key: equal whole
    cubins are equal in every section)."""
    key = _key(code_digest(cubin), kernel, expected_params, secret, smem_control_from, KEY_SCHEME)
    _LEGACY[key] = _key(hashlib.sha256(cubin).digest(), kernel, expected_params, secret, smem_control_from, None)
    return key


def reusable(entry: dict) -> bool:
    """A stored report whose analysis may be taken: it has a key, and it is clean."""
    return bool(entry.get("analysis_key")) and entry.get("ok") is True and not entry.get("error") \
        and not entry.get("violations")


def read_report(path: str) -> dict:
    """A report written by ``audit sass --json``: plain JSON, or gzip-compressed where ``path`` ends in ``.gz`` (the
    committed reports are gzip: ~15 MB each as plain JSON)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def write_report(path: str, doc: dict) -> None:
    """Write ``doc`` as :func:`read_report` reads it (gzip where ``path`` ends in ``.gz``, with no timestamp in the
    gzip header, so the same report gives the same bytes)."""
    text = json.dumps(doc, indent=2)
    if path.endswith(".gz"):
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
            f.write(text.encode())
    else:
        with open(path, "w") as f:
            f.write(text)


def load(path: str) -> dict[str, dict]:
    """The reusable analyses of a report written by ``audit sass --json`` (secure and fast lists): key -> entry.
    A report without keys gives an empty memo (everything is analysed)."""
    doc = read_report(path)
    out = {}
    for entry in list(doc.get("secure") or []) + list(doc.get("fast") or []):
        if reusable(entry):
            out[entry["analysis_key"]] = entry
    return out


def activate(memo: dict[str, dict] | None) -> None:
    """Use ``memo`` for the analyses that follow in this process (and in workers forked after this); None or {}
    turns reuse off."""
    _MEMO.clear()
    if memo:
        _MEMO.update(memo)


def lookup(key: str) -> Report | None:
    """The analysis stored under ``key`` as a :class:`Report` with the fields :func:`.analyze.analyze_cubin` sets
    (``reused`` True), or None."""
    entry = _MEMO.get(key)
    if entry is None and key in _LEGACY:  # a report keyed by whole cubins (analysis_key)
        entry = _MEMO.get(_LEGACY[key])
    if entry is None:
        return None
    n = int(entry.get("analysis_notes", 0))
    return Report(kernel=entry["kernel"], violations=[], n_instructions=entry["n_instructions"],
                  n_blocks=entry["n_blocks"], total_instructions=entry["total_instructions"],
                  iterations=entry["iterations"], tainted_registers=list(entry["tainted_registers"]),
                  tainted_memory=list(entry["tainted_memory"]), unknown_opcodes=dict(entry["unknown_opcodes"]),
                  params=[ParamInfo(**{k: p[k] for k in ("ordinal", "name", "cbank_offset", "size", "role", "secret")})
                          for p in entry["params"]],
                  notes=list(entry["notes"][:n]), analysis_key=key, analysis_notes=n, reused=True)


#: the fields of a report that the machine-code analysis determines (what ``--verify`` compares)
ANALYSIS_FIELDS = ("kernel", "ok", "violations", "n_instructions", "n_blocks", "total_instructions", "iterations",
                   "tainted_registers", "tainted_memory", "unknown_opcodes", "params", "notes", "analysis_key")


def differences(taken: Report, fresh: Report) -> list[str]:
    """The analysis fields in which a reused report and a fresh analysis of the same kernel differ."""
    a, b = taken.to_dict(), fresh.to_dict()
    return [k for k in ANALYSIS_FIELDS if a.get(k) != b.get(k)]
