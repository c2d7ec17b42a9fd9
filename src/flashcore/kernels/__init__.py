"""Kernel launchers. ``launch_attention`` is the single entry that picks an architecture's
configuration and launches; ``audit_specs`` lists every configuration that can be launched, for
the static SASS audit."""
from __future__ import annotations

import math
import os
from typing import Optional

import torch

from . import configs
from .configs import Config

LOG2E = 1.4426950408889634

# Declared support (vLLM-style): checked in flashcore._checks before anything launches.
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SUPPORTED_HEAD_DIMS = tuple(range(8, 257, 8))


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _arch(device: torch.device):
    if device.type != "cuda" or _interpreting():
        return None
    return torch.cuda.get_device_capability(device)


def launch_attention(q, k, v, o, lse, *, seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k,
                     scale: float, causal: bool, secure: bool, secure_public_diag: bool,
                     seqlen_q: int, seqlen_k: int, batch: int, num_heads_q: int, num_heads_kv: int,
                     q_strides, k_strides, v_strides, o_strides, lse_strides, config: Optional[Config] = None):
    """Launch the fused forward. Strides are (batch, head, seq) element strides; for varlen the
    batch stride is unused and ``batch`` is the number of sequences."""
    from .attention_fwd import attn_fwd_kernel

    head_dim = q.shape[-1]
    varlen = cu_seqlens_q is not None
    cfg = config or configs.choose(_arch(q.device), head_dim=head_dim, dtype_bytes=q.element_size(), causal=causal,
                                   secure=secure, seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    use_tma = cfg.tma and not varlen and all(_tma_ok(t) for t in (q, k, v))
    grid = (triton_cdiv(seqlen_q, cfg.block_m), batch * num_heads_q)
    if grid[0] == 0 or grid[1] == 0:
        return cfg
    dummy = q  # unused pointer arguments still need a tensor
    bd = configs.block_d(head_dim)
    if use_tma:
        qa, ka, va = (_descriptor(t, rows, bd) for t, rows in ((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n)))
    else:
        qa, ka, va = q, k, v
    attn_fwd_kernel[grid](
        qa, ka, va, o, lse if lse is not None else dummy,
        seqlens_q if seqlens_q is not None else dummy, seqlens_k if seqlens_k is not None else dummy,
        cu_seqlens_q if varlen else dummy, cu_seqlens_k if varlen else dummy,
        scale * LOG2E,
        *q_strides, *k_strides, *v_strides, *o_strides, *lse_strides,
        seqlen_q, seqlen_k, num_heads_q, num_heads_q // num_heads_kv,
        HEAD_DIM=head_dim, BLOCK_D=configs.block_d(head_dim), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=bool(causal), VARLEN=varlen, SECURE=bool(secure), SECURE_PUBLIC_DIAG=bool(secure_public_diag),
        EVEN_N=(seqlen_k % cfg.block_n == 0), RETURN_LSE=lse is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", USE_TMA=use_tma,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return cfg


def _tma_ok(t: torch.Tensor) -> bool:
    """The copy engine needs a 16-byte aligned base and 16-byte multiples for every outer stride."""
    es = t.element_size()
    return t.dim() == 4 and t.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in t.stride()[:-1])


def _descriptor(t: torch.Tensor, rows: int, block_d: int):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, block_d])


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


_ELT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def kernel_signature(dtype: torch.dtype) -> dict:
    """Triton signature of ``attn_fwd_kernel`` (types of the runtime arguments)."""
    e = _ELT[dtype]
    sig = {"Q": f"*{e}", "K": f"*{e}", "V": f"*{e}", "O": f"*{e}", "LSE": "*fp32",
           "SEQLENS_Q": "*i32", "SEQLENS_K": "*i32", "CU_SEQLENS_Q": "*i32", "CU_SEQLENS_K": "*i32",
           "qk_scale": "fp32"}
    for name in ("stride_qb", "stride_qh", "stride_qs", "stride_kb", "stride_kh", "stride_ks",
                 "stride_vb", "stride_vh", "stride_vs", "stride_ob", "stride_oh", "stride_os",
                 "stride_lb", "stride_lh", "seqlen_q", "seqlen_k", "num_heads_q", "gqa_group"):
        sig[name] = "i32"
    return sig


def audit_specs(secure: bool, arch: tuple[int, int] = (9, 0)) -> list[dict]:
    """Every configuration of the forward kernel that flashcore launches in this mode on ``arch``,
    as ``{name, fn, signature, constexprs, secret, num_warps, num_stages}`` for the SASS audit.

    Public facts that select a specialisation (head dim, dtype, causal, EVEN_N, lse) are
    enumerated; the secrets are the data behind q/k/v and, in secure mode, the true lengths.
    """
    from .attention_fwd import attn_fwd_kernel

    specs = []
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    head_dims = (64, 128, 256, 72) if secure else (64, 128)
    for dtype in dtypes if secure else (torch.bfloat16,):
        for hd in head_dims:
            for causal in (False, True):
                for public_diag in ((False, True) if (secure and causal) else (False,)):
                    for even_n in (True, False) if secure else (True,):
                        for varlen in ((False,) if secure else (False, True)):
                            cfg = configs.hopper(hd, torch.tensor([], dtype=dtype).element_size(), causal, secure, 4096, 4096)
                            constexprs = dict(HEAD_DIM=hd, BLOCK_D=configs.block_d(hd), BLOCK_M=cfg.block_m,
                                              BLOCK_N=cfg.block_n, CAUSAL=causal, VARLEN=varlen, SECURE=secure,
                                              SECURE_PUBLIC_DIAG=public_diag, EVEN_N=even_n, RETURN_LSE=True,
                                              PRECISION="ieee" if dtype == torch.float32 else "tf32", USE_TMA=False)
                            sig = kernel_signature(dtype)
                            sig.update({k: "constexpr" for k in constexprs})
                            secret = {"Q", "K", "V"} | ({"SEQLENS_Q", "SEQLENS_K"} if secure else {"CU_SEQLENS_Q", "CU_SEQLENS_K"})
                            name = (f"{'secure' if secure else 'fast'}_{_ELT[dtype]}_d{hd}_{'causal' if causal else 'full'}"
                                    f"{'_pubdiag' if public_diag else ''}{'' if even_n else '_oddn'}{'_varlen' if varlen else ''}")
                            specs.append(dict(name=name, fn=attn_fwd_kernel, signature=sig, constexprs=constexprs,
                                              secret=secret, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return specs
