"""Minimal pure-Python reader for the parts of a CUDA cubin (ELF64) the SASS audit needs.

We only need three things from a cubin:

* the kernel (entry function) names: one ``.text.<name>`` section per function;
* the kernel-parameter layout: the ``.nv.info.<kernel>`` section holds one ``EIATTR_KPARAM_INFO``
  record per parameter (ordinal, offset inside the parameter block, size) and an
  ``EIATTR_PARAM_CBANK`` record whose low 16 bits are the constant-bank offset where the
  parameter block starts (``0x210`` on sm_90, i.e. parameter ``i`` lives at ``c[0x0][0x210 + offset_i]``);
* nothing else (disassembly is done by ``nvdisasm``).

``.nv.info`` records are ``u8 format, u8 attribute, u16 value-or-size`` followed, for the
``EIFMT_SVAL`` format (4), by ``size`` payload bytes.  ``EIATTR_KPARAM_INFO`` (0x17) payload is
``u32 index, u16 ordinal, u16 offset, u32 flags`` with the parameter size in bytes in
``flags >> 18`` (14 bits) and the pointee space in bits 8..11.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

EIFMT_NVAL = 0x01
EIFMT_BVAL = 0x02
EIFMT_HVAL = 0x03
EIFMT_SVAL = 0x04

EIATTR_PARAM_CBANK = 0x0A
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_EXIT_INSTR_OFFSETS = 0x1C

#: constant-bank offset of the parameter block on sm_70..sm_90 when the cubin does not say.
DEFAULT_PARAM_BASE = 0x210


@dataclass(frozen=True)
class KParam:
    ordinal: int
    offset: int  # relative to the parameter block
    size: int  # bytes
    flags: int

    def cbank_range(self, base: int) -> tuple[int, int]:
        return base + self.offset, base + self.offset + self.size


@dataclass
class KernelInfo:
    name: str
    param_base: int
    params: list[KParam]  # sorted by ordinal
    param_block_size: int | None
    exit_offsets: list[int]


def _sections(data: bytes) -> dict[str, tuple[int, int, int]]:
    """name -> (file offset, size, type)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 cubin")
    (e_shoff,) = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = []
    for i in range(e_shnum):
        name, typ, _flags, _addr, off, size, _link, _info, _align, _ent = struct.unpack_from(
            "<IIQQQQIIQQ", data, e_shoff + i * e_shentsize
        )
        raw.append((name, typ, off, size))
    stroff = raw[e_shstrndx][2]
    out: dict[str, tuple[int, int, int]] = {}
    for name, typ, off, size in raw:
        end = data.index(b"\0", stroff + name)
        out[data[stroff + name : end].decode("latin-1")] = (off, size, typ)
    return out


def kernel_names(cubin: bytes) -> list[str]:
    return [n[len(".text.") :] for n in _sections(cubin) if n.startswith(".text.")]


def _records(payload: bytes):
    p = 0
    while p + 4 <= len(payload):
        fmt, attr, val = struct.unpack_from("<BBH", payload, p)
        p += 4
        if fmt == EIFMT_SVAL:
            yield attr, payload[p : p + val]
            p += val
        elif fmt in (EIFMT_HVAL, EIFMT_BVAL, EIFMT_NVAL):
            yield attr, val
        else:  # unknown format: stop rather than misparse
            return


def kernel_info(cubin: bytes, kernel: str) -> KernelInfo:
    secs = _sections(cubin)
    key = f".nv.info.{kernel}"
    if key not in secs:
        raise KeyError(f"cubin has no {key} section (kernels: {kernel_names(cubin)})")
    off, size, _ = secs[key]
    payload = cubin[off : off + size]
    params: list[KParam] = []
    base = None
    block_size = None
    exits: list[int] = []
    for attr, val in _records(payload):
        if attr == EIATTR_KPARAM_INFO and isinstance(val, bytes) and len(val) >= 12:
            _idx, ordinal, poff, flags = struct.unpack_from("<IHHI", val, 0)
            params.append(KParam(ordinal=ordinal, offset=poff, size=(flags >> 18) & 0x3FFF, flags=flags))
        elif attr == EIATTR_PARAM_CBANK and isinstance(val, bytes) and len(val) >= 8:
            (word,) = struct.unpack_from("<I", val, 4)
            base = word & 0xFFFF
            block_size = word >> 16
        elif attr == EIATTR_CBANK_PARAM_SIZE and isinstance(val, int):
            block_size = block_size or val
        elif attr == EIATTR_EXIT_INSTR_OFFSETS and isinstance(val, bytes):
            exits = list(struct.unpack_from(f"<{len(val) // 4}I", val, 0))
    params.sort(key=lambda p: p.ordinal)
    return KernelInfo(
        name=kernel,
        param_base=DEFAULT_PARAM_BASE if base is None else base,
        params=params,
        param_block_size=block_size,
        exit_offsets=exits,
    )
