"""Argument validation shared by every entry point.

Every check raises ValueError/TypeError naming the offending argument, so bad input never
reaches a kernel (where it would crash, hang or silently compute garbage).
"""
from __future__ import annotations

import torch

SUPPORTED_HEAD_DIMS = tuple(range(8, 257, 8))
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LAYOUTS = ("bhsd", "bshd")
BACKENDS = ("auto", "triton", "reference")


def check_float_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")


def check_same(names: tuple[str, ...], tensors, attr: str) -> None:
    vals = [getattr(t, attr) for t in tensors]
    if any(v != vals[0] for v in vals[1:]):
        desc = ", ".join(f"{n}.{attr}={v}" for n, v in zip(names, vals))
        raise ValueError(f"{' / '.join(names)} must share one {attr}; got {desc}")


def check_unit_last_stride(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(
            f"{name} must have a unit stride in its last (head) dimension, got strides {tuple(t.stride())}; "
            f"pass {name}.contiguous() (flashcore never copies silently)"
        )


def check_head_dim(name: str, d: int) -> None:
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{name} has head dim {d}; supported head dims are the multiples of 8 from 8 to 256")


def check_scale(scale, head_dim: int) -> float:
    if scale is None:
        return head_dim ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    scale = float(scale)
    if not (scale > 0.0 and scale < float("inf")):
        raise ValueError(f"scale must be a positive finite float, got {scale}")
    return scale


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_seqlens(name: str, t, batch: int, device: torch.device) -> None:
    """Metadata-only checks (never reads the values: they may be secret)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 torch.Tensor of shape [B], got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != 1 or t.shape[0] != batch:
        raise ValueError(f"{name} must have shape [B]=[{batch}], got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {t.device}")
