"""The public facts of a call (:class:`Problem`) and the plan key derived from them.

Everything the planner decides from is here and nothing else: shapes, dtype, device and its
architecture, layout and strides, pointer alignment, the flags, and (in secure mode) whether the query
lengths are the key lengths (``self_attention``: then the causal diagonal is public). Secret values (token
data, true lengths, cumulative lengths) never enter a Problem or a key.

The key (:func:`dense_key`, :func:`varlen_key`) is computed from a call's arguments *before* validation,
so that a repeat call costs a dictionary lookup: it holds every fact the Problem is built from (types,
dtypes, devices, shapes, strides, 16-byte alignment of every tensor, the keyword arguments, which optional
tensors were given) plus every knob (``plan.knobs.snapshot``), so equal keys mean equal Problems, equal
plans and equal compiled kernels."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .plan.knobs import snapshot
from .runtime import device_arch
from .runtime.tma import addressable


# the names kernels' capabilities use for the dtypes (kernels.DTYPE_NAMES), keyed by the torch dtype
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _tensor_facts(t):
    """What the plan depends on of one argument (None: the argument cannot be keyed)."""
    if t is None:
        return None
    if type(t) is not torch.Tensor:  # subclasses (fake/functional tensors, ...) take the full path
        raise TypeError
    return t.dtype, t.device, t.shape, t.stride(), t.data_ptr() & 15, t.requires_grad


def _key(kind, tensors, flags):
    # Flags are keyed with their types: a plan made for causal=True must not answer causal=1 (which the
    # validation layer refuses), nor grad mode off answer grad mode on.
    flags = (torch.is_grad_enabled(), *((type(f), f) for f in flags))
    try:
        key = (kind, flags, snapshot(), *(_tensor_facts(t) for t in tensors))
        hash(key)
    except TypeError:  # e.g. an unhashable scale or a tensor subclass: the full path names the bad argument
        return None
    return key


def dense_key(route: str, q, k, v, seqlens_q, seqlens_k, out, *, layout, causal, scale, secure, self_attention,
              return_lse, validate, deterministic=False):
    """The plan key of a dense call (None where the arguments cannot be keyed). ``route`` names the caller
    (the public entry point with its backend, or the custom op), so plans of different routes never mix. Every
    argument a call's checks look at is in the key (``deterministic`` too, though the forward plan does not use
    it): a repeat call skips the checks, so an invalid value must miss every plan a valid one made."""
    flags = (route, layout, causal, scale, secure, self_attention, return_lse, validate, deterministic)
    return _key("dense", (q, k, v, seqlens_q, seqlens_k, out), flags)


def backward_key(kind: str, tensors, flags):
    """The key of a backward launch (``ops.dense_backward``/``varlen_backward``): the metadata of every tensor the
    kernels read or whose layout the gradients copy, and the flags (None where a tensor cannot be keyed)."""
    return _key("backward-" + kind, tensors, flags)


def varlen_key(route: str, q, k, v, cu_seqlens_q, cu_seqlens_k, out, *, max_seqlen_q, max_seqlen_k, causal, scale,
               return_lse):
    flags = (route, max_seqlen_q, max_seqlen_k, causal, scale, return_lse)
    return _key("varlen", (q, k, v, cu_seqlens_q, cu_seqlens_k, out), flags)


def _aligned(t: torch.Tensor) -> bool:
    """The copy engine (TMA) can address it with unit-stride rows (what the sm_90 kernel's descriptors need)."""
    return t.stride(-1) == 1 and addressable(t)


@dataclass(frozen=True)
class Problem:
    """The public facts of one attention call, after validation.

    Dense: ``batch`` sequences of ``seqlen_q`` queries and ``seqlen_k`` keys, strides are the element
    strides of the [B, H, S, D] views (whatever the caller's layout). Varlen: ``batch`` is the number of
    sequences, ``seqlen_q``/``seqlen_k`` the ``max_seqlen`` bounds, strides ``(0, head, token, 1)``."""
    varlen: bool
    dtype: torch.dtype
    device: torch.device
    arch: tuple | None  # compute capability; None: CPU tensors or the interpreter
    batch: int
    num_heads_q: int
    num_heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    scale: float
    layout: str  # "bhsd", "bshd" (dense) or "thd" (varlen: packed tokens)
    secure: bool
    self_attention: bool  # secure mode: the query lengths are the key lengths (the causal diagonal is public)
    return_lse: bool
    q_strides: tuple
    k_strides: tuple
    v_strides: tuple
    o_strides: tuple
    tma_addressable: bool  # q, k, v and o can all be read/written by the copy engine (kernels that need "tma")
    strict: bool = False  # secure="strict": q's and k's padding rows are replaced before the kernels read them

    @property
    def dtype_name(self) -> str:
        """The name kernels' capabilities use (``fp16``, ``bf16``, ``fp32``)."""
        return DTYPE_NAMES.get(self.dtype, str(self.dtype))

    @property
    def dtype_bytes(self) -> int:
        return torch.finfo(self.dtype).bits // 8

    @property
    def public_diagonal(self) -> bool:
        """Secure causal self-attention with Sq == Sk: which blocks are above the diagonal is public."""
        return self.secure and self.causal and self.seqlen_q == self.seqlen_k and self.self_attention

    @property
    def secret_diagonal(self) -> bool:
        """Secure causal dense attention whose diagonal is secret (explicit query lengths, or Sq != Sk): query i sees
        key j iff j <= i + len_k - len_q, an offset only the device knows, so every key tile is visited."""
        return self.secure and self.causal and not self.varlen and not self.public_diagonal

    @property
    def work(self) -> int:
        """B * Hq * Sq * Sk: the size measure of the per-architecture tables."""
        return self.batch * self.num_heads_q * self.seqlen_q * self.seqlen_k

    def table_facts(self) -> dict:
        """The keyword facts the configuration tables (``plan.tables``) take."""
        return dict(head_dim=self.head_dim, dtype_bytes=self.dtype_bytes, causal=self.causal, secure=self.secure,
                    seqlen_q=self.seqlen_q, seqlen_k=self.seqlen_k, batch_heads=self.batch * self.num_heads_q)

    @classmethod
    def dense(cls, qb, kb, vb, ob, *, causal, scale, layout, secure, self_attention, return_lse, strict=False):
        """From validated [B, H, S, D] views (``ob``: the output buffer's view)."""
        B, Hq, Sq, D = qb.shape
        return cls(varlen=False, dtype=qb.dtype, device=qb.device, arch=device_arch(qb.device), batch=B,
                   num_heads_q=Hq, num_heads_kv=kb.shape[1], seqlen_q=Sq, seqlen_k=kb.shape[2], head_dim=D,
                   causal=bool(causal), scale=float(scale), layout=layout, secure=bool(secure),
                   self_attention=bool(secure and self_attention), return_lse=bool(return_lse),
                   q_strides=tuple(qb.stride()), k_strides=tuple(kb.stride()), v_strides=tuple(vb.stride()),
                   o_strides=tuple(ob.stride()), tma_addressable=all(_aligned(t) for t in (qb, kb, vb, ob)),
                   strict=bool(secure and strict))

    @classmethod
    def packed(cls, q, k, v, o, *, num_seqs, max_seqlen_q, max_seqlen_k, causal, scale, return_lse):
        """From validated packed ``[total_tokens, H, D]`` tensors of a varlen call."""
        def strides(t):
            return (0, t.stride(1), t.stride(0), t.stride(2))
        return cls(varlen=True, dtype=q.dtype, device=q.device, arch=device_arch(q.device), batch=num_seqs,
                   num_heads_q=q.shape[1], num_heads_kv=k.shape[1], seqlen_q=int(max_seqlen_q),
                   seqlen_k=int(max_seqlen_k), head_dim=q.shape[2], causal=bool(causal), scale=float(scale),
                   layout="thd", secure=False, self_attention=False, return_lse=bool(return_lse),
                   q_strides=strides(q), k_strides=strides(k), v_strides=strides(v), o_strides=strides(o),
                   tma_addressable=False)


def kvcache_key(route: str, q, k_cache, v_cache, tensors: tuple, out, *, flags: tuple):
    """The plan key of a KV-cache call: q, the caches, each optional tensor (or None), out, and the flags."""
    return _key("kvcache", (q, k_cache, v_cache, *tensors, out), (route, *flags))
