"""PyTorch custom ops around the planned launches.

Registered with ``torch.library`` (with fake implementations) so ``torch.compile(fullgraph=True)``
traces through them; the real implementations allocate with the caching allocator and never
sync the host (except the documented eager-only input checks), so CUDA-graph capture works.
Both the eager path (``api``) and the ops plan through :func:`dense_plan` / :func:`varlen_plan` and keep
their plans in the one plan cache (``plan.cache.PLANS``)."""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks as C
from . import reference as _ref
from .launch.triton_bwd import BackwardLaunch
from .plan.backward import backward_config
from .plan.build import Plan, build
from .plan.cache import PLANS
from .plan.decode import decode_serves, dense_decode_plan, lengths_tensor, plan_kvcache
from .problem import DTYPE_NAMES, Problem, backward_key, dense_key, kvcache_key, varlen_key
from .runtime import device_arch, inside_compiled_graph

Tensor = torch.Tensor
_OP_ROUTE = "op"  # plan-key route of the custom ops (the eager entry points key by their backend)


def dense_plan(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, out=None, config=None,
               validate=True):
    """Plan a dense call (q/k/v in the caller's layout, already validated). ``seqlens_q`` None, or the same
    tensor as ``seqlens_k``, is self-attention. ``secure``: a bool, or "strict" (secure mode's strict padding form,
    which the KV-cache kernel serving short query blocks does not have)."""
    # Index q/k/v/out as [B, H, S, D] through strides (the one layout mapping, _checks.as_bhsd).
    layout = "bshd" if bshd else "bhsd"
    qb, kb, vb = (C.as_bhsd(n, t, layout) for n, t in (("q", q), ("k", k), ("v", v)))
    B, Hq, Sq, D = qb.shape
    o = out if out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)  # caller's layout
    ob = C.as_bhsd("out", o, layout)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device) if return_lse else None
    strict = secure == "strict"
    problem = Problem.dense(qb, kb, vb, ob, causal=causal, scale=scale, layout=layout,
                            secure=secure is not False, self_attention=seqlens_q is None or seqlens_q is seqlens_k,
                            return_lse=return_lse, strict=strict)
    if config is None and not strict and decode_serves(Sq, kb.shape[2], secure is not False):
        return dense_decode_plan(problem, q, k, v, o, causal=causal, scale=scale, return_lse=return_lse, bshd=bshd)
    return build(problem, qb, kb, vb, ob, lse, seqlens_q=seqlens_q, seqlens_k=seqlens_k, lse_strides=(Hq * Sq, Sq),
                 out_shape=tuple(q.shape), validate=validate, config=config)


def _dense_impl(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, out=None, validate=True,
                config=None):
    """Run a dense call through the plan cache (``config``: a benchmark's explicit configuration, planned
    afresh and not cached)."""
    if config is not None:
        plan = dense_plan(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, out, config, validate)
        res, lse = plan(q, k, v, seqlens_q, seqlens_k, out)
        return res, (lse if lse is not None else q.new_empty((0,), dtype=torch.float32))
    key = dense_key(_OP_ROUTE, q, k, v, seqlens_q, seqlens_k, out, layout="bshd" if bshd else "bhsd", causal=causal,
                    scale=scale, secure=secure, self_attention=seqlens_q is None or seqlens_q is seqlens_k,
                    return_lse=return_lse, validate=validate)
    plan = PLANS.get_or_build(key, lambda: dense_plan(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure,
                                                      return_lse, out, validate=validate))
    res, lse = plan(q, k, v, seqlens_q, seqlens_k, out)
    return res, (lse if lse is not None else q.new_empty((0,), dtype=torch.float32))


@torch.library.custom_op("flashcore::attention_fwd", mutates_args=())
def _attention_fwd_op(q: Tensor, k: Tensor, v: Tensor, seqlens_q: Optional[Tensor], seqlens_k: Optional[Tensor],
                      causal: bool, scale: float, bshd: bool, secure: bool, return_lse: bool,
                      validate: bool, strict: bool = False) -> tuple[Tensor, Tensor]:
    # only a compiled graph calls this op (eager calls skip the dispatcher): a short query runs the decode kernels,
    # whose workspace such a call must not keep (runtime.launcher.inside_compiled_graph)
    with inside_compiled_graph():
        return _dense_impl(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, "strict" if strict else secure,
                           return_lse, validate=validate)


@_attention_fwd_op.register_fake
def _(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, validate, strict=False):
    B, Hq, Sq = (q.shape[0], q.shape[2], q.shape[1]) if bshd else q.shape[:3]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty((B, Hq, Sq) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def attention_fwd(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, out=None, validate=True):
    if torch.compiler.is_compiling():
        # The op boundary loses tensor identity, so self-attention is passed as seqlens_q=None.
        if seqlens_q is seqlens_k:
            seqlens_q = None
        res, lse = torch.ops.flashcore.attention_fwd(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd,
                                                     secure is not False, return_lse, validate, secure == "strict")
        return (out.copy_(res) if out is not None else res), lse
    # Eager: skip the dispatcher round trip (a few µs that matter on small shapes).
    return _dense_impl(q, k, v, seqlens_q, seqlens_k, causal, scale, bshd, secure, return_lse, out, validate=validate)


def varlen_plan(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, out=None, config=None) -> Plan:
    """Plan a varlen call (packed tensors, already validated)."""
    total_q, Hq, D = q.shape
    o = out if out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((Hq, total_q), dtype=torch.float32, device=q.device) if return_lse else None
    problem = Problem.packed(q, k, v, o, num_seqs=cu_q.shape[0] - 1, max_seqlen_q=max_q, max_seqlen_k=max_k,
                             causal=causal, scale=scale, return_lse=return_lse)
    plan = build(problem, q, k, v, o, lse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, lse_strides=(0, total_q),
                 out_shape=tuple(q.shape), config=config)
    plan.check_cu = C.check_cu_seqlens
    return plan


def _varlen_impl(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, out=None):
    key = varlen_key(_OP_ROUTE, q, k, v, cu_q, cu_k, out, max_seqlen_q=max_q, max_seqlen_k=max_k, causal=causal,
                     scale=scale, return_lse=return_lse)
    plan = PLANS.get_or_build(key, lambda: varlen_plan(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale,
                                                       return_lse, out))
    res, lse = plan(q, k, v, out=out, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    return res, (lse if lse is not None else q.new_empty((0,), dtype=torch.float32))


@torch.library.custom_op("flashcore::attention_varlen_fwd", mutates_args=())
def _attention_varlen_fwd_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                             max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: float,
                             return_lse: bool) -> tuple[Tensor, Tensor]:
    return _varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, return_lse)


@_attention_varlen_fwd_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, return_lse):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty((q.shape[1], q.shape[0]) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def attention_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, out=None):
    if torch.compiler.is_compiling():
        res, lse = torch.ops.flashcore.attention_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse)
        return (out.copy_(res) if out is not None else res), lse
    return _varlen_impl(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, out)


@torch.library.custom_op("flashcore::attention_varlen_reference", mutates_args=())
def attention_varlen_reference(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                               max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                               scale: float) -> tuple[Tensor, Tensor]:
    """The float64 reference over packed sequences, as an op: its per-sequence loop reads the lengths, which
    ``torch.compile(fullgraph=True)`` cannot trace, so the op is opaque to it (and differentiable)."""
    C.check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
    res, lse = _ref.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                     scale=scale, return_lse=True)
    return res.to(q.dtype), lse.float()


@attention_varlen_reference.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _varlen_reference_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale = inputs
    ctx.save_for_backward(q, k, v, cu_q, cu_k)
    ctx.args = (max_q, max_k, causal, scale)


def _varlen_reference_backward(ctx, d_out, d_lse):
    """Gradients by differentiating the reference itself (recomputed here: the op saved only its inputs)."""
    q, k, v, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k, causal, scale = ctx.args
    with torch.enable_grad():
        qkv = [t.detach().requires_grad_(True) for t in (q, k, v)]
        res, lse = _ref.attention_varlen(*qkv, cu_q, cu_k, max_q, max_k, causal=causal, scale=scale, return_lse=True)
        outs, grads = [res], [d_out.to(res.dtype)]
        if d_lse is not None:  # rows without keys have lse -inf: their lse gradient is zero, not nan
            finite = torch.isfinite(lse)
            outs.append(torch.where(finite, lse, torch.zeros_like(lse)))
            grads.append(torch.where(finite, d_lse.to(lse.dtype), torch.zeros_like(lse)))
        dq, dk, dv = torch.autograd.grad(outs, qkv, grads, allow_unused=True)
    return tuple(None if g is None else g.to(t.dtype) for g, t in zip((dq, dk, dv), (q, k, v))) + (None,) * 6


attention_varlen_reference.register_autograd(_varlen_reference_backward, setup_context=_varlen_reference_setup)


# --- Training: the differentiable forward ops and their backward -------------------------------------------
#
# A call whose inputs want gradients runs these ops, eagerly and under torch.compile alike: the forward always
# computes the logsumexp and saves (q, k, v, out, lse), so the backward never reruns it. The backward is its
# own op (opaque to tracing, with a fake implementation), so AOTAutograd traces both passes.


@torch.library.custom_op("flashcore::attention_fwd_grad", mutates_args=())
def _attention_fwd_grad_op(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, bshd: bool,
                           deterministic: bool) -> tuple[Tensor, Tensor]:
    return _dense_impl(q, k, v, None, None, causal, scale, bshd, False, True)


@_attention_fwd_grad_op.register_fake
def _(q, k, v, causal, scale, bshd, deterministic):
    B, Hq, Sq = (q.shape[0], q.shape[2], q.shape[1]) if bshd else q.shape[:3]
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), q.new_empty((B, Hq, Sq), dtype=torch.float32)


def _dense_grad_setup(ctx, inputs, output):
    q, k, v, causal, scale, bshd, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.flags = (causal, scale, bshd, deterministic)


def _dense_grad_backward(ctx, d_out, d_lse):
    q, k, v, out, lse = ctx.saved_tensors
    causal, scale, bshd, deterministic = ctx.flags
    if d_out is None:
        d_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.flashcore.attention_bwd(d_out, q, k, v, out, lse, d_lse, causal, scale, bshd,
                                                    deterministic)
    return dq, dk, dv, None, None, None, None


_attention_fwd_grad_op.register_autograd(_dense_grad_backward, setup_context=_dense_grad_setup)


def attention_fwd_grad(q, k, v, causal, scale, bshd, deterministic):
    """(out, lse) of a dense call that records its backward."""
    return torch.ops.flashcore.attention_fwd_grad(q, k, v, causal, scale, bshd, deterministic)


def _backward_config(q, causal, deterministic, config, seqlen_q):
    if config is not None:
        return config
    return backward_config(device_arch(q.device), head_dim=q.shape[-1], dtype_name=DTYPE_NAMES[q.dtype],
                           causal=causal, deterministic=deterministic, seqlen_q=seqlen_q)


def _unit_last(t):
    """The kernels read rows with a unit last stride; an incoming gradient may be an expanded or strided one."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def dense_backward(d_out, q, k, v, out, lse, d_lse, causal, scale, bshd, deterministic, config=None):
    """(dq, dk, dv) of a dense call, in the layouts of q, k and v. ``config``: a benchmark's explicit one."""
    layout = "bshd" if bshd else "bhsd"
    view = lambda t: C.as_bhsd("grad", t, layout)  # noqa: E731
    d_out, d_lse, lse = _unit_last(d_out), None if d_lse is None else d_lse.contiguous(), lse.contiguous()

    def make():
        qb, kb = view(q), view(k)
        return BackwardLaunch(view(d_out), q, k, v, view(out), lse, has_dlse=d_lse is not None, as_view=view,
                              varlen=False, num_seqs=qb.shape[0], seqlen_q=qb.shape[2], seqlen_k=kb.shape[2],
                              scale=scale, causal=causal,
                              config=_backward_config(q, causal, deterministic, config, qb.shape[2]))

    key = None if config is not None else backward_key(
        "dense", (d_out, q, k, v, out, lse, d_lse), (causal, scale, bshd, deterministic))
    launch = PLANS.get_or_build(key, make)
    return launch.run(view(d_out), q, k, v, view(out), lse, d_lse)


@torch.library.custom_op("flashcore::attention_bwd", mutates_args=())
def _attention_bwd_op(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                      d_lse: Optional[Tensor], causal: bool, scale: float, bshd: bool,
                      deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    return dense_backward(d_out, q, k, v, out, lse, d_lse, causal, scale, bshd, deterministic)


@_attention_bwd_op.register_fake
def _(d_out, q, k, v, out, lse, d_lse, causal, scale, bshd, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.custom_op("flashcore::attention_varlen_fwd_grad", mutates_args=())
def _attention_varlen_fwd_grad_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                  max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: float,
                                  deterministic: bool) -> tuple[Tensor, Tensor]:
    return _varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, True)


@_attention_varlen_fwd_grad_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, deterministic):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _varlen_grad_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.flags = (max_q, max_k, causal, scale, deterministic)


def _varlen_grad_backward(ctx, d_out, d_lse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k, causal, scale, deterministic = ctx.flags
    if d_out is None:
        d_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.flashcore.attention_varlen_bwd(d_out, q, k, v, out, lse, d_lse, cu_q, cu_k, max_q, max_k,
                                                           causal, scale, deterministic)
    return (dq, dk, dv) + (None,) * 7


_attention_varlen_fwd_grad_op.register_autograd(_varlen_grad_backward, setup_context=_varlen_grad_setup)


def attention_varlen_fwd_grad(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, deterministic):
    """(out, lse) of a varlen call that records its backward."""
    return torch.ops.flashcore.attention_varlen_fwd_grad(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale,
                                                         deterministic)


def varlen_backward(d_out, q, k, v, out, lse, d_lse, cu_q, cu_k, max_q, max_k, causal, scale, deterministic,
                    config=None):
    """(dq, dk, dv) of a varlen call (packed, zero on rows no sequence owns)."""
    d_out, d_lse, lse = _unit_last(d_out), None if d_lse is None else d_lse.contiguous(), lse.contiguous()

    def make():
        return BackwardLaunch(d_out, q, k, v, out, lse, has_dlse=d_lse is not None, as_view=lambda t: t, varlen=True,
                              num_seqs=cu_q.shape[0] - 1, seqlen_q=max_q, seqlen_k=max_k, scale=scale, causal=causal,
                              config=_backward_config(q, causal, deterministic, config, max_q))

    key = None if config is not None else backward_key(
        "varlen", (d_out, q, k, v, out, lse, d_lse, cu_q, cu_k), (max_q, max_k, causal, scale, deterministic))
    launch = PLANS.get_or_build(key, make)
    return launch.run(d_out, q, k, v, out, lse, d_lse, cu_q, cu_k)


@torch.library.custom_op("flashcore::attention_varlen_bwd", mutates_args=())
def _attention_varlen_bwd_op(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             d_lse: Optional[Tensor], cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                             max_seqlen_k: int, causal: bool, scale: float,
                             deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    return varlen_backward(d_out, q, k, v, out, lse, d_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal, scale, deterministic)


@_attention_varlen_bwd_op.register_fake
def _(d_out, q, k, v, out, lse, d_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
      deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# --- KV-cache attention -------------------------------------------------------------------------------------

KV_OPTIONAL = ("k", "v", "page_table", "cache_batch_idx", "cache_leftpad", "cu_seqlens_q", "k_descale", "v_descale")

def kvcache_lengths(q, cache_seqlens, secure, cu_seqlens_q):
    """``cache_seqlens`` as the tensor the kernels read: an int becomes :func:`lengths_tensor`'s (on q's device and
    the current stream), anything else is returned as given (the checks judge it)."""
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool) and isinstance(q, Tensor):
        batch = cu_seqlens_q.shape[0] - 1 if isinstance(cu_seqlens_q, Tensor) else q.shape[0]
        return lengths_tensor(cache_seqlens, batch, q.device, secure=secure)
    return cache_seqlens


def _kvcache_hit(q, k_cache, v_cache, cache_seqlens, opt: dict, out, backend, validate, flags: tuple):
    """(plan key, the plan an earlier call made under it or None). On a hit the metadata checks are skipped (the key
    holds every fact they read), the address checks are not (``out`` against the inputs, appended ``k``/``v`` against
    the caches: the key holds no addresses), and the values are checked when ``validate`` (eager, not under
    capture)."""
    key = kvcache_key(backend, q, k_cache, v_cache, tuple(opt[n] for n in KV_OPTIONAL) + (cache_seqlens,), out,
                      flags=flags)
    plan = PLANS.get(key) if key is not None else None
    if plan is not None:
        if out is not None or opt["k"] is not None:
            C.check_kvcache_aliasing(q, k_cache, v_cache, opt["k"], opt["v"], out)
        if plan.args.secure:  # said on every call, not only on the plan's first
            C.warn_not_constant_time(True, q.device)
        if validate and not C.capturing(q.device):
            C.check_kvcache_values(plan.args, cache_seqlens, opt["page_table"], opt["cache_batch_idx"],
                                   opt["cache_leftpad"], opt["cu_seqlens_q"], q.shape[0], k_cache.shape[0],
                                   k_cache.shape[0], caches=(k_cache, v_cache))
    return key, plan


def kvcache_call(q, k_cache, v_cache, cache_seqlens, opt: dict, *, max_seqlen_q, causal, scale, num_splits,
                 return_lse, out, secure, backend, validate):
    """:func:`flashcore.attention_with_kvcache` after its argument conversion: check, then the reference, the
    custom op (tracing) or the cached plan.

    A repeat call whose plan key (every public fact of the arguments, with the flags' types) matches an earlier
    kernel call skips the metadata checks and the planning: a dictionary lookup, the value checks (eager,
    ``validate``) and the launches."""
    key = None
    if not torch.compiler.is_compiling():
        key, plan = _kvcache_hit(q, k_cache, v_cache, cache_seqlens, opt, out, backend, validate,
                                 (max_seqlen_q, causal, scale, num_splits, return_lse, secure, validate))
        if plan is not None:
            res, lse = plan(q, k_cache, v_cache, dict(opt, cache_seqlens=cache_seqlens), out)
            return (res, lse) if plan.args.return_lse else res
    a = C.check_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, **opt, max_seqlen_q=max_seqlen_q,
                        causal=causal, scale=scale, num_splits=num_splits, return_lse=return_lse, out=out,
                        secure=secure, backend=backend)
    validate = C.check_flag("validate", validate)
    if validate and not torch.compiler.is_compiling() and not C.capturing(q.device):
        C.check_kvcache_values(a, cache_seqlens, opt["page_table"], opt["cache_batch_idx"], opt["cache_leftpad"],
                               opt["cu_seqlens_q"], q.shape[0], k_cache.shape[0], k_cache.shape[0],
                               caches=(k_cache, v_cache))
    if torch.compiler.is_compiling():
        # Both routes run inside the opaque op, on the route the caller chose: the reference's per-sequence loop
        # reads the lengths (data-dependent: fullgraph tracing cannot follow it).
        res, lse = torch.ops.flashcore.attention_with_kvcache(
            q, k_cache, v_cache, cache_seqlens, *(opt[n] for n in KV_OPTIONAL[:6]), a.seqlen_q, a.causal, a.scale,
            a.num_splits, opt["k_descale"], opt["v_descale"], a.return_lse, a.secure, backend)
        res = out.copy_(res) if out is not None else res
        return (res, lse) if a.return_lse else res
    if not a.kernel:
        res, lse = _ref.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, **opt,
                                               max_seqlen_q=max_seqlen_q, causal=a.causal, scale=a.scale,
                                               return_lse=True)
        res = res.to(q.dtype)
        res = out.copy_(res) if out is not None else res
        return (res, lse.float()) if a.return_lse else res
    res, lse = _kvcache_run(a, q, k_cache, v_cache, cache_seqlens, opt, out, key)
    return (res, lse) if a.return_lse else res


def _kvcache_plan(a, q, k_cache, v_cache, opt: dict, out, key):
    def make():
        return plan_kvcache(a, q, k_cache, v_cache, opt["k"], opt["v"], opt["page_table"], opt["cache_batch_idx"],
                            opt["cache_leftpad"], out)

    return PLANS.get_or_build(key, make) if key is not None else make()


def _kvcache_run(a, q, k_cache, v_cache, cache_seqlens, opt: dict, out, key):
    plan = _kvcache_plan(a, q, k_cache, v_cache, opt, out, key)
    return plan(q, k_cache, v_cache, dict(opt, cache_seqlens=cache_seqlens), out)


def kvcache_prepare(q, k_cache, v_cache, cache_seqlens, opt: dict, *, max_seqlen_q, causal, scale, num_splits,
                    return_lse, out, secure, backend, validate):
    """What :func:`kvcache_call` does before it launches, for ``flashcore.kvcache_step``: every check (the values
    too when ``validate``, a sync), then the cached plan; None where no kernel plan runs (the reference; tracing; a
    call that cannot be keyed). A key that an earlier call planned skips the metadata checks, as
    :func:`kvcache_call` does (the key holds every fact they read)."""
    key = None
    if not torch.compiler.is_compiling():
        key, plan = _kvcache_hit(q, k_cache, v_cache, cache_seqlens, opt, out, backend, validate,
                                 (max_seqlen_q, causal, scale, num_splits, return_lse, secure, validate))
        if plan is not None:
            return plan
    a = C.check_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, **opt, max_seqlen_q=max_seqlen_q,
                        causal=causal, scale=scale, num_splits=num_splits, return_lse=return_lse, out=out,
                        secure=secure, backend=backend)
    validate = C.check_flag("validate", validate)
    if torch.compiler.is_compiling():
        return None
    if validate and not C.capturing(q.device):
        C.check_kvcache_values(a, cache_seqlens, opt["page_table"], opt["cache_batch_idx"], opt["cache_leftpad"],
                               opt["cu_seqlens_q"], q.shape[0], k_cache.shape[0], k_cache.shape[0],
                               caches=(k_cache, v_cache))
    if not a.kernel or key is None:
        return None
    return _kvcache_plan(a, q, k_cache, v_cache, opt, out, key)


@torch.library.custom_op("flashcore::attention_with_kvcache", mutates_args=("k_cache", "v_cache"))
def _kvcache_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor, k: Optional[Tensor],
                v: Optional[Tensor], page_table: Optional[Tensor], cache_batch_idx: Optional[Tensor],
                cache_leftpad: Optional[Tensor], cu_seqlens_q: Optional[Tensor], max_seqlen_q: int, causal: bool,
                scale: float, num_splits: int, k_descale: Optional[Tensor], v_descale: Optional[Tensor],
                return_lse: bool, secure: bool, backend: str) -> tuple[Tensor, Tensor]:
    opt = dict(k=k, v=v, page_table=page_table, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
               cu_seqlens_q=cu_seqlens_q, k_descale=k_descale, v_descale=v_descale)
    with inside_compiled_graph():  # keeps no buffer past the call (runtime.launcher.inside_compiled_graph)
        out, lse = kvcache_call(q, k_cache, v_cache, cache_seqlens, opt,
                                max_seqlen_q=max_seqlen_q if cu_seqlens_q is not None else None, causal=causal,
                                scale=scale, num_splits=num_splits, return_lse=True, out=None, secure=secure,
                                backend=backend, validate=False)
    return out, (lse if return_lse else q.new_empty((0,), dtype=torch.float32))


@_kvcache_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, k, v, page_table, cache_batch_idx, cache_leftpad, cu_seqlens_q,
      max_seqlen_q, causal, scale, num_splits, k_descale, v_descale, return_lse, secure, backend):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if not return_lse:
        return out, q.new_empty((0,), dtype=torch.float32)
    shape = (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], q.shape[2], q.shape[1])
    return out, q.new_empty(shape, dtype=torch.float32)
