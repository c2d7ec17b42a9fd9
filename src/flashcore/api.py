"""Public entry points: check -> Problem -> plan -> run.

1. **check** (``_checks``): every argument, on every backend, before anything runs;
2. **Problem** (``problem``): the call's public facts, and the plan key derived from them;
3. **plan** (``plan.select`` + ``plan.build``, cached in ``plan.cache.PLANS`` under that key);
4. **run**: the plan's steps launch (``launch`` builders, ``runtime`` mechanism).

A repeat call whose key matches an earlier one skips steps 1-3: the key is computed from the raw
arguments, so host time drops from tens of µs to a dictionary lookup and the launch. The secure-length
range check reads values, so it stays in the replay (``plan.build.Plan``).

Causal alignment (FlashAttention convention): with ``causal=True`` query ``i`` sees key ``j``
iff ``j <= i + Sk - Sq`` (bottom-right aligned). When ``Sq == Sk`` this is SDPA's
``is_causal=True``. A query row that sees no key outputs zeros, and its logsumexp is ``-inf``.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks as C
from . import ops
from . import reference as _ref
from .kvcache_step import KVCacheStep, make_step
from .plan.build import Plan
from .plan.cache import PLANS
from .problem import dense_key, varlen_key

Tensor = torch.Tensor


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    scale: Optional[float] = None,
    layout: str = "bhsd",
    return_lse: bool = False,
    backend: str = "auto",
    seqlens_q: Optional[Tensor] = None,
    seqlens_k: Optional[Tensor] = None,
    secure: bool | str = False,
    out: Optional[Tensor] = None,
    validate_seqlens: bool = True,
    deterministic: bool = False,
):
    """Fused scaled-dot-product attention, differentiable in q, k and v.

    Shapes: ``layout="bhsd"``: q ``[B, Hq, Sq, D]``, k/v ``[B, Hkv, Sk, D]``; ``layout="bshd"``:
    ``[B, S, H, D]``. ``Hq % Hkv == 0`` (GQA/MQA). D is a multiple of 8 in [8, 256]. Any strides
    with a unit last-dim stride. Output has q's dtype and layout (contiguous). With
    ``return_lse=True`` returns ``(out, lse)``, lse ``[B, Hq, Sq]`` float32, natural log.

    fp16/bf16: fp32 accumulation, inputs of P·V rounded to the input dtype (as in every fused
    attention). fp32: both products in IEEE fp32 on the tensor-core-free path (no TF32), so
    results match the float64 reference to ~1e-6 relative error.

    ``secure=True`` selects the constant-time kernel: inputs are padded to ``Sq``/``Sk`` and the
    true lengths ``seqlens_q``/``seqlens_k`` (int32 ``[B]`` on q's device) are secret. See
    docs/security.md. Pass ``seqlens_q=None`` for self-attention (query lengths = key lengths):
    the causal diagonal is then public and blocks above it are skipped. ``validate_seqlens``
    (eager only): check on the host that every length lies in ``[0, S]`` — one sync that reveals
    one bit (all in range or not), never the lengths; skipped during CUDA-graph capture, where
    out-of-range lengths are clamped on the device. ``secure="strict"``: secure mode in which the kernels never
    multiply the caller's padding: the padding rows of q and k (and, causal on Hopper, v) are replaced by public
    data-like rows in pre-passes first (docs/security.md §2, §5.6: it passes the timing gate where the default
    form does not, at +7-49% time). Same results, bit for bit.

    ``out``: an optional caller-owned output buffer (q's shape, dtype, device; contiguous), so
    CUDA-graph users can own their buffers; it is returned.

    Gradients: when q, k or v requires grad (and grad mode is on), the call records a backward pass (the
    Triton backward kernels; the forward saves its output and logsumexp, so the backward never reruns it).
    ``deterministic=True`` makes the gradients bitwise reproducible from run to run (every floating-point sum
    in a fixed order: dQ on its own kernel, or at D=128 on Hopper added inside the dK/dV kernel in a fixed order of
    key tiles). A returned lse is differentiable too. ``secure=True`` and ``out=`` are forward-only: with
    inputs that want gradients they raise.
    """
    key = None
    if not torch.compiler.is_compiling() and not C.wants_grad({"q": q, "k": k, "v": v}):
        key = dense_key(backend, q, k, v, seqlens_q, seqlens_k, out, layout=layout, causal=causal, scale=scale,
                        secure=secure, self_attention=seqlens_q is seqlens_k, return_lse=return_lse,
                        validate=validate_seqlens, deterministic=deterministic)
        plan = PLANS.get(key) if key is not None else None
        if plan is not None:
            if out is not None:  # the key holds out's alignment, not its address
                C.check_out_overlaps(out, {"q": q, "k": k, "v": v})
            if secure:  # said on every call, as Python's warning filters expect, not only on the plan's first
                C.warn_not_constant_time(True, q.device)
            res, lse = plan(q, k, v, seqlens_q, seqlens_k, out)
            return (res, lse) if return_lse else res

    a = C.check_dense(q, k, v, layout=layout, causal=causal, scale=scale, secure=secure, seqlens_q=seqlens_q,
                      seqlens_k=seqlens_k, out=out, backend=backend, return_lse=return_lse, validate=validate_seqlens,
                      deterministic=deterministic)

    if not a.kernel:
        res, lse = _ref.attention_bhsd(a.qb, a.kb, a.vb, causal=a.causal, scale=a.scale,
                                       seqlens_q=a.seqlens_q if a.secure else None,
                                       seqlens_k=seqlens_k if a.secure else None)
        res = res.to(q.dtype)
        if layout == "bshd":
            res = res.transpose(1, 2)
        res = out.copy_(res) if out is not None else res.contiguous()
        return (res, lse.float()) if a.return_lse else res

    if a.grad:  # the differentiable custom op (eager and traced alike): it saves what the backward needs
        res, lse = ops.attention_fwd_grad(q, k, v, a.causal, a.scale, layout == "bshd", a.deterministic)
        return (res, lse) if a.return_lse else res
    mode = "strict" if a.strict else a.secure  # the internal form of ``secure`` (ops.dense_plan)
    if key is None:  # tracing under torch.compile, or inputs we do not key on: the custom op
        res, lse = ops.attention_fwd(q, k, v, seqlens_q, seqlens_k, a.causal, a.scale, layout == "bshd", mode,
                                     a.return_lse, out, a.validate)
        return (res, lse) if a.return_lse else res
    plan = PLANS.put(key, ops.dense_plan(q, k, v, seqlens_q, seqlens_k, a.causal, a.scale, layout == "bshd",
                                         mode, a.return_lse, out, validate=a.validate))
    res, lse = plan(q, k, v, seqlens_q, seqlens_k, out)
    return (res, lse) if a.return_lse else res


def plan_attention(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Plan | None:
    """The plan :func:`attention` runs for these arguments (from the cache, or made and cached now), without
    running it; None where the reference runs instead. For inspection: ``plan.selection.explain()`` says
    which kernel runs with which configuration and why the others do not, ``plan.steps`` and
    ``plan.workspace`` what it launches and allocates."""
    backend, secure = kwargs.get("backend", "auto"), kwargs.get("secure", False)
    layout, out = kwargs.get("layout", "bhsd"), kwargs.get("out")
    seqlens_q, seqlens_k = kwargs.get("seqlens_q"), kwargs.get("seqlens_k")
    unknown = set(kwargs) - {"causal", "scale", "layout", "return_lse", "backend", "seqlens_q", "seqlens_k", "secure",
                             "out", "validate_seqlens", "deterministic"}
    if unknown:
        raise TypeError(f"plan_attention() got unexpected keyword arguments {sorted(unknown)}")
    a = C.check_dense(q, k, v, layout=layout, causal=kwargs.get("causal", False), scale=kwargs.get("scale"),
                      secure=secure, seqlens_q=seqlens_q, seqlens_k=seqlens_k, out=out, backend=backend,
                      return_lse=kwargs.get("return_lse", False), validate=kwargs.get("validate_seqlens", True),
                      deterministic=kwargs.get("deterministic", False))
    if not a.kernel:
        return None
    key = dense_key(backend, q, k, v, seqlens_q, seqlens_k, out, layout=layout, causal=kwargs.get("causal", False),
                    scale=kwargs.get("scale"), secure=secure, self_attention=seqlens_q is seqlens_k,
                    return_lse=kwargs.get("return_lse", False), validate=kwargs.get("validate_seqlens", True),
                    deterministic=kwargs.get("deterministic", False))
    return PLANS.get_or_build(key, lambda: ops.dense_plan(
        q, k, v, seqlens_q, seqlens_k, a.causal, a.scale, layout == "bshd", "strict" if a.strict else a.secure,
        a.return_lse, out, validate=a.validate))


def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    scale: Optional[float] = None,
    return_lse: bool = False,
    backend: str = "auto",
    out: Optional[Tensor] = None,
    deterministic: bool = False,
):
    """Attention over packed variable-length sequences, differentiable in q, k and v.

    q ``[total_q, Hq, D]``, k/v ``[total_k, Hkv, D]``; ``cu_seqlens_*`` int32 ``[N+1]`` cumulative
    lengths starting at 0 (zero-length sequences allowed). Same semantics per sequence as
    :func:`attention` (causal is bottom-right aligned per sequence). lse is ``[Hq, total_q]``.

    ``cu_seqlens`` are checked on the host (monotonic, within the tensors, lengths <= max_seqlen);
    that check is skipped while a CUDA graph is being captured, where it would need a sync.

    Gradients and ``deterministic`` as in :func:`attention`; rows of zero-length sequences (and rows past
    ``cu_seqlens[-1]``) get zero gradients.
    """
    a = C.check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, scale=scale,
                       return_lse=return_lse, backend=backend, out=out, deterministic=deterministic)

    if not a.kernel:
        res, lse = ops.attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, a.max_seqlen_q,
                                                  a.max_seqlen_k, a.causal, a.scale)
        res = out.copy_(res) if out is not None else res
        return (res, lse) if a.return_lse else res

    if a.grad:
        res, lse = ops.attention_varlen_fwd_grad(q, k, v, cu_seqlens_q, cu_seqlens_k, a.max_seqlen_q, a.max_seqlen_k,
                                                 a.causal, a.scale, a.deterministic)
        return (res, lse) if a.return_lse else res
    res, lse = ops.attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, a.max_seqlen_q, a.max_seqlen_k,
                                        a.causal, a.scale, a.return_lse, out)
    return (res, lse) if a.return_lse else res


def _kvcache_inputs(q, cache_seqlens, secure, **opt):
    """(cache_seqlens as a tensor where an int was given, the optional tensors by name) of a KV-cache call."""
    return ops.kvcache_lengths(q, cache_seqlens, secure, opt["cu_seqlens_q"]), opt


def attention_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    *,
    cache_seqlens,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    page_table: Optional[Tensor] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    causal: bool = True,
    scale: Optional[float] = None,
    num_splits: int = 0,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    return_lse: bool = False,
    out: Optional[Tensor] = None,
    secure: bool = False,
    backend: str = "auto",
    validate: bool = True,
):
    """Attention of new query tokens against a KV cache (decode, speculative tokens, chunked prefill), after
    FlashAttention-3's ``flash_attn_with_kvcache``.

    q ``[B, Sq, Hq, D]`` (or packed ``[total_q, Hq, D]`` with ``cu_seqlens_q`` int32 ``[B+1]`` and
    ``max_seqlen_q``). The cache: contiguous ``[B_cache, S_cache, Hkv, D]`` (row ``cache_batch_idx[b]``, or
    ``b``), or paged ``[num_pages, page_size, Hkv, D]`` with ``page_table`` int32 ``[B, max_pages_per_seq]``
    (any page size from 1 to 256, pages in any order). Any strides with a unit last stride.
    ``cache_seqlens`` (int32 ``[B]``, or an int for all): tokens already in each sequence's cache.

    ``k``/``v`` (``[B, Sq, Hkv, D]``, packed ``[total_q, Hkv, D]``; the cache's dtype) are first written into
    the cache at ``cache_seqlens`` (the caches are modified; ``cache_seqlens`` is not), then attended.
    Sequence ``b`` attends to cache positions ``[cache_leftpad[b], L_b)``, ``L_b`` = ``cache_seqlens[b]`` plus
    the new tokens. ``causal`` is bottom-right: query ``i`` of ``n_b`` sees positions up to ``L_b - n_b + i``
    (with appended tokens: up to ``cache_seqlens[b] + i``). A row that sees no key outputs zeros, lse -inf.

    FP8 cache: ``torch.float8_e4m3fn`` K/V with ``k_descale``/``v_descale`` float32 ``[B, Hkv]`` (real value =
    stored x descale); q float16/bfloat16. ``num_splits``: key ranges per sequence (split-KV); 0 chooses it
    from public shapes only (never the lengths), so a captured CUDA graph replays correctly for any lengths.
    Returns out (q's shape and dtype; ``out=`` a caller-owned buffer) or ``(out, lse)``, lse float32
    ``[B, Hq, Sq]`` (packed: ``[Hq, total_q]``).

    ``secure=True``: ``cache_seqlens`` and ``cache_leftpad`` are secret; the kernel reads every page of the
    table and masks by select, so time and addresses do not depend on them (docs/security.md). No append
    (the write position would be an address) and no packed queries.

    ``validate`` (eager only): check lengths, page-table entries and batch indices on the host (a sync).
    Skipped under CUDA-graph capture and torch.compile, where the kernels clamp every index to the cache
    (an out-of-range value gives a wrong result, never an out-of-bounds access).
    """
    cache_seqlens, opt = _kvcache_inputs(q, cache_seqlens, secure, k=k, v=v, page_table=page_table,
                                         cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                                         cu_seqlens_q=cu_seqlens_q, k_descale=k_descale, v_descale=v_descale)
    return ops.kvcache_call(q, k_cache, v_cache, cache_seqlens, opt, max_seqlen_q=max_seqlen_q, causal=causal,
                            scale=scale, num_splits=num_splits, return_lse=return_lse, out=out, secure=secure,
                            backend=backend, validate=validate)


def kvcache_step(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    *,
    cache_seqlens,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    page_table: Optional[Tensor] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    causal: bool = True,
    scale: Optional[float] = None,
    num_splits: int = 0,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    return_lse: bool = False,
    out: Optional[Tensor] = None,
    secure: bool = False,
    backend: str = "auto",
    validate: bool = True,
) -> KVCacheStep:
    """Plan one decode step of :func:`attention_with_kvcache` (same arguments, same checks, nothing launched) and
    return a :class:`~flashcore.kvcache_step.KVCacheStep` whose ``run(q, k_cache, v_cache, *, k=None, v=None,
    k_descale=None, v_descale=None, out=None)`` attends each layer's tensors with this step's metadata
    (``cache_seqlens``, ``page_table``, ``cache_batch_idx``, ``cache_leftpad``, ``cu_seqlens_q``) and options::

        step = flashcore.kvcache_step(q0, k_cache[0], v_cache[0], cache_seqlens=lens, page_table=table)
        for layer in range(num_layers):
            out = step.run(q[layer], k_cache[layer], v_cache[layer])

    The tensors given here fix the facts every run's tensors must share (dtype, device, shape, strides, 16-byte
    alignment; ``out=None`` or a buffer); a run whose tensors differ, or that runs under CUDA-graph capture,
    torch.compile or on another stream, takes ``attention_with_kvcache``'s full path with its checks. Values
    (``validate``) are checked once, here; the kernels read the bound tensors at each launch."""
    given = cache_seqlens
    cache_seqlens, opt = _kvcache_inputs(q, cache_seqlens, secure, k=k, v=v, page_table=page_table,
                                         cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                                         cu_seqlens_q=cu_seqlens_q, k_descale=k_descale, v_descale=v_descale)
    return make_step(q, k_cache, v_cache, cache_seqlens, opt, max_seqlen_q=max_seqlen_q, causal=causal, scale=scale,
                     num_splits=num_splits, return_lse=return_lse, out=out, secure=secure, backend=backend,
                     validate=validate, given_lengths=given)
