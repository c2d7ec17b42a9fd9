"""Kernel parameters -> constant bank 0: the parameter list Triton's launcher passes
(:func:`_expand_params`) matched against the cubin's ``EIATTR_KPARAM_INFO`` records (:func:`map_params`)."""
from __future__ import annotations

import re

from .elf import KernelInfo
from .report import ParamInfo


def tuple_leaves(ty, path: tuple):
    """(path, type) of every element of a (nested) tuple argument's type, depth first: the order in which Triton's
    launcher passes them as kernel parameters (a non-tuple type is one leaf at ``path``)."""
    if isinstance(ty, (tuple, list)):
        for j, t in enumerate(ty):
            yield from tuple_leaves(t, path + (j,))
    else:
        yield path, ty


def leaf_name(arg: str, path: tuple) -> str:
    """``T[0][1]`` for the element at ``path`` (its argument's index first) of the tuple argument ``T``."""
    return arg + "".join(f"[{j}]" for j in path[1:])


def _expand_params(jfn, signature: dict, constant_keys: set, tensordesc_meta: list | None) -> list[tuple[str, str, str]]:
    """Kernel-parameter list in ordinal order as (name, role, arg) - mirrors Triton's launcher. A tuple argument
    ``T`` passes its elements in order as ``T[0]``, ``T[1]``, ... (nested: ``T[0][1]``), each with its own role; an
    element that is a constexpr or that the launcher specialised to a constant (``constant_keys`` holds its path)
    passes nothing. A descriptor inside a tuple is left unmapped (every parameter then counts as secret)."""
    out: list[tuple[str, str, str]] = []
    td_idx = 0
    for i, arg in enumerate(jfn.arg_names):
        ty = signature.get(arg)
        if ty is None or ty == "constexpr" or (i,) in constant_keys:
            continue
        if isinstance(ty, (tuple, list)):
            for path, ety in tuple_leaves(ty, (i,)):
                if ety == "constexpr" or path in constant_keys:
                    continue
                name = leaf_name(arg, path)
                if not isinstance(ety, str) or ety.startswith("tensordesc") or ety == "nvTmaDesc":
                    out.append((name, "unmapped", arg))
                elif ety.startswith("**") or ety in ("*i64", "*u64", "*fp64"):
                    out.append((name, "pointer-to-pointer", arg))
                elif ety.startswith("*"):
                    out.append((name, "pointer", arg))
                else:
                    out.append((name, "scalar", arg))
            continue
        if isinstance(ty, str) and ty.startswith("tensordesc"):
            meta = tensordesc_meta[td_idx] if tensordesc_meta and td_idx < len(tensordesc_meta) else None
            td_idx += 1
            m = re.match(r"tensordesc<([^[>]*)\[([^]]*)\]", ty)
            ndim = m.group(2).count(",") + 1 if m else 2
            if meta is None:
                out.append((arg, "pointer", arg))
                out += [(f"{arg}.host_shape_stride{k}", "scalar", arg) for k in range(2 * ndim)]
                out.append((f"{arg}.padding", "scalar", arg))
            else:
                out.append((arg, "tensordesc", arg))
            out += [(f"{arg}.shape{k}", "scalar", arg) for k in range(ndim)]
            out += [(f"{arg}.stride{k}", "scalar", arg) for k in range(ndim)]
        elif isinstance(ty, str) and (ty.startswith("**") or ty in ("*i64", "*u64", "*fp64")):
            # memory that may hold addresses: a pointer array passed as 64-bit integers (grouped-GEMM style) is read as
            # a ``**T`` (its values carry unknown provenance), or a pointer to a secret buffer read from it and rebased
            # onto a public argument (``Y + (a - Y)``) would be taken for that argument (found by a review, 2026-11-28)
            out.append((arg, "pointer-to-pointer", arg))
        elif isinstance(ty, str) and (ty.startswith("*") or ty == "nvTmaDesc"):
            out.append((arg, "pointer" if ty.startswith("*") else "tensordesc", arg))
        elif isinstance(ty, str):
            out.append((arg, "scalar", arg))
        else:  # tuples etc.: let the count check catch it
            out.append((arg, "unmapped", arg))
    return out


def map_params(kinfo: KernelInfo, expected: list[tuple[str, str, str]], secret: set[str],
               notes: list[str]) -> list[ParamInfo]:
    params: list[ParamInfo] = []
    n_exp = len(expected)
    hidden_names = ["<global_scratch>", "<profile_scratch>"]
    mismatch = len(kinfo.params) < n_exp or any(r == "unmapped" for _, r, _ in expected)
    if mismatch:
        notes.append(f"parameter mapping uncertain: cubin has {len(kinfo.params)} parameters, signature implies "
                     f"{n_exp} (+hidden); unmapped parameters are treated as secret")
    fields = _secret_fields(expected, secret)
    for kp in kinfo.params:
        off = kinfo.param_base + kp.offset
        if kp.ordinal < n_exp and not mismatch:
            name, role, arg = expected[kp.ordinal]
            # (a tuple argument's elements, ``T[k]``, are secret with it, scalars included)
            is_secret = (arg in secret and (role in ("pointer", "tensordesc", "pointer-to-pointer") or name == arg
                                            or name.startswith(arg + "["))
                         or name in fields)
            params.append(ParamInfo(kp.ordinal, name, off, kp.size, role, is_secret))
        elif kp.ordinal >= n_exp and not mismatch:
            k = kp.ordinal - n_exp
            name = hidden_names[k] if k < len(hidden_names) else f"<hidden{k}>"
            params.append(ParamInfo(kp.ordinal, name, off, kp.size, "hidden", False))
        else:
            name = expected[kp.ordinal][0] if kp.ordinal < n_exp else f"<param{kp.ordinal}>"
            params.append(ParamInfo(kp.ordinal, name, off, kp.size, "unmapped", True))
    unknown = {s for s in secret if "." not in s} - {p.name for p in params} - {a for _, _, a in expected}
    if unknown:
        notes.append(f"secret names not among the kernel's runtime arguments (constexpr or misspelt?): {sorted(unknown)}")
    return params


def _secret_fields(expected: list[tuple[str, str, str]], secret: set[str]) -> set[str]:
    """The descriptor-field parameters that ``secret`` declares secret: ``D.shape`` (every ``D.shape<k>``),
    ``D.strides`` (every ``D.stride<k>``), ``D.desc`` (both), or one field by its own name. A host descriptor's
    contents are its shape and strides; they are passed beside it, and its TMA accesses check them."""
    out = set()
    for name, role, arg in expected:
        m = re.fullmatch(rf"{re.escape(arg)}\.(shape|stride)\d+", name)
        if not m or role != "scalar":
            continue
        group = f"{arg}.shape" if m.group(1) == "shape" else f"{arg}.strides"
        if name in secret or group in secret or f"{arg}.desc" in secret:
            out.add(name)
    return out
