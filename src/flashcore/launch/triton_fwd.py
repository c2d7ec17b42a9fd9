"""Launch builder of the portable Triton forward kernel (``kernels/triton/fwd.py``)."""
from __future__ import annotations

import torch

from ..kernels.triton.fwd import LOG2E, attn_fwd_kernel
from ..plan.tables import Config, block_d
from ..runtime import KernelStep, cdiv, interpreting
from ..runtime.tma import addressable

# The kernel's pointer arguments after q, k, v, o, lse (an unused one still needs a tensor)
LENGTH_ARGS = ("seqlens_q", "seqlens_k", "cu_seqlens_q", "cu_seqlens_k")
N_POINTERS = 5 + len(LENGTH_ARGS)


def build_launch(q, k, v, o, lse, *, seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k,
                 scale: float, causal: bool, secure: bool, secure_public_diag: bool,
                 seqlen_q: int, seqlen_k: int, batch: int, num_heads_q: int, num_heads_kv: int,
                 q_strides, k_strides, v_strides, o_strides, lse_strides, config: Config):
    """Everything a launch of ``attn_fwd_kernel`` needs: (config, grid, positional args, constexprs).

    Shared by the planner and by the audit's specs, so the audit compiles exactly what runs.
    Strides are (batch, head, seq) element strides; for varlen the batch stride is unused and
    ``batch`` is the number of sequences. In secure mode with ``config.v_prepass`` the caller passes
    the pre-pass's clean copy of V (contiguous) and its strides."""
    cfg = config
    if cfg.kernel != "triton":
        raise ValueError(f"build_launch builds the Triton kernel's launch, got a {cfg.kernel!r} config")
    head_dim = q.shape[-1]
    varlen = cu_seqlens_q is not None
    use_tma = cfg.tma and not varlen and all(tma_ok(t) for t in (q, k, v))
    bd = block_d(head_dim)
    if use_tma:
        qa, ka, va = (_descriptor(t, rows, bd) for t, rows in ((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n)))
    else:
        qa, ka, va = q, k, v
    args = [*pointer_args(qa, ka, va, o, lse, (seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k), dummy=q),
            scale * LOG2E,
            *q_strides, *k_strides, *v_strides, *o_strides, *lse_strides,
            seqlen_q, seqlen_k, num_heads_q, num_heads_q // num_heads_kv]
    constexprs = dict(
        HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=bool(causal), VARLEN=varlen, SECURE=bool(secure), SECURE_PUBLIC_DIAG=bool(secure_public_diag),
        EVEN_N=(seqlen_k % cfg.block_n == 0), RETURN_LSE=lse is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", USE_TMA=use_tma,
        ZERO_V_IN_LOOP=bool(secure) and not cfg.v_prepass,
    )
    grid = (cdiv(seqlen_q, cfg.block_m), batch * num_heads_q)
    return cfg, grid, args, constexprs


def pointer_args(q, k, v, o, lse, extra, *, dummy):
    """The kernel's pointer arguments in order; an unused one still needs a tensor (``dummy``)."""
    return (q, k, v, o, lse if lse is not None else dummy, *(t if t is not None else dummy for t in extra))


def compile_options(cfg: Config) -> dict:
    """Compiler options beyond warps/stages; only CUDA's compiler knows ``maxnreg``."""
    return {"maxnreg": cfg.maxnreg} if cfg.maxnreg is not None and not interpreting() else {}


def tma_ok(t: torch.Tensor) -> bool:
    """The copy engine can address it (the Triton kernel's TMA option; ``runtime.tma.addressable``)."""
    return addressable(t)


def _descriptor(t: torch.Tensor, rows: int, block_d_: int):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, block_d_])


class TritonForward:
    """A planned launch of the Triton kernel, replayable on tensors with the planned metadata."""
    __slots__ = ("step", "tma_kw", "has_lse")

    def __init__(self, q, k, v, o, lse, **kw):
        cfg, grid, args, constexprs = build_launch(q, k, v, o, lse, **kw)
        self.has_lse = lse is not None
        # TMA descriptors hold the pointers: with them the launch is rebuilt on every call
        self.tma_kw = {n: x for n, x in kw.items() if n not in LENGTH_ARGS} if constexprs["USE_TMA"] else None
        self.step = None if self.tma_kw is not None else KernelStep(
            attn_fwd_kernel, grid, args, N_POINTERS, constexprs, cfg.num_warps, cfg.num_stages, compile_options(cfg))

    def run(self, ptrs, device, key_weights=None) -> None:
        """``ptrs``: :func:`pointer_args` of the call (q, k, v, o, lse, then the four length tensors, a dummy
        where unused). ``key_weights``: none for this kernel (the sm_90 kernel's pre-pass has them)."""
        if self.tma_kw is None:
            self.step.run(ptrs, device)
            return
        q, k, v, o, lse = ptrs[:5]
        lengths = dict(zip(LENGTH_ARGS, ptrs[5:]))
        cfg, grid, args, constexprs = build_launch(q, k, v, o, lse if self.has_lse else None, **lengths,
                                                   **self.tma_kw)
        if grid[0] and grid[1]:
            attn_fwd_kernel[grid](*args, **constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                                  **compile_options(cfg))
