"""One decode step of KV-cache attention, planned once and run per layer (:class:`KVCacheStep`).

A decode step of a transformer calls KV-cache attention once per layer with the same metadata (lengths, page
table, left pads) on tensors of the same shapes: only q, the layer's caches (and an FP8 cache's descales) change.
FlashInfer splits such a step into ``plan`` (host-side metadata, once) and ``run`` (launch, many times);
:func:`flashcore.kvcache_step` is that split for :func:`flashcore.attention_with_kvcache`: it checks every
argument once (the values too with ``validate=True``: one sync), plans, and binds the step's metadata tensors,
workspace and stream. :meth:`KVCacheStep.run` then compares each argument's public facts (dtype, device, shape,
strides, 16-byte alignment, ``requires_grad``; grad mode and flashcore's knobs) with the planned ones and
launches the plan's kernels with pointer tuples made once: the host time of an eager decode call is then that of
its launches (docs/perf-notes.md v61).

Any difference (a tensor with other facts, a bound metadata tensor moved to other memory or re-strided in place,
another stream, thread or current device, CUDA-graph capture, torch.compile, a plan not compiled yet, the reference
backend) takes :func:`flashcore.attention_with_kvcache`'s own path with the bound metadata (an int
``cache_seqlens`` converted again there, on that call's device and stream), which checks the new arguments in full.
A run with the planned facts checks what a call with the same facts would check again (``out`` and appended
``k``/``v`` against the other tensors' memory), except the metadata's values: ``validate=True`` checked them once,
when the step was made, and a value changed in place after that is clamped by the kernels, as in a CUDA graph's
replay (docs/perf-notes.md v61, v62)."""
from __future__ import annotations

import threading

import torch

from . import _checks as C
from . import ops
from .plan.decode import BoundDecode
from .plan.knobs import snapshot
from .problem import _tensor_facts
from .runtime import current_stream, in_compiled_graph, keeps_buffers, launch_hooks_active

_META = ("page_table", "cache_batch_idx", "cache_leftpad", "cu_seqlens_q")
_PER_RUN = ("k", "v", "k_descale", "v_descale")


def _facts(q, k_cache, v_cache, k, v, k_descale, v_descale, out):
    """Every per-run argument's plan facts, grad mode and the knobs (None: a tensor that cannot be keyed)."""
    try:
        return (_tensor_facts(q), _tensor_facts(k_cache), _tensor_facts(v_cache), _tensor_facts(k), _tensor_facts(v),
                _tensor_facts(k_descale), _tensor_facts(v_descale), _tensor_facts(out), torch.is_grad_enabled(),
                snapshot())
    except TypeError:
        return None


class KVCacheStep:
    """A planned :func:`flashcore.attention_with_kvcache` call whose metadata (``cache_seqlens``, ``page_table``,
    ``cache_batch_idx``, ``cache_leftpad``, ``cu_seqlens_q``) and options are bound: :meth:`run` attends each
    layer's q to its caches. Made by :func:`flashcore.kvcache_step`.

    The bound metadata tensors are read at every launch: change their values in place (a CUDA graph's pattern) and
    the next run sees them. ``validate=True`` checked the values once, when the step was made; a value made invalid
    after that is clamped by the kernels (a wrong result, never an out-of-bounds access), as under graph capture,
    where the run keeps the planned facts (a run that takes the full path checks the values again)."""
    __slots__ = ("plan", "return_lse", "_lengths", "_meta", "_options", "_bound", "_facts")

    def __init__(self, lengths, meta: dict, options: dict, plan, bound, facts):
        self.plan = plan  # the DecodePlan run (None: the reference or the custom op runs); for inspection
        self.return_lse = options["return_lse"]
        self._lengths, self._meta, self._options, self._bound, self._facts = lengths, meta, options, bound, facts

    def run(self, q, k_cache, v_cache, *, k=None, v=None, k_descale=None, v_descale=None, out=None):
        """Attention of ``q`` to ``k_cache``/``v_cache`` (appending ``k``/``v`` first when the step was planned with
        new tokens) with the bound metadata: what ``attention_with_kvcache(q, k_cache, v_cache, ...)`` returns, ``out``
        or ``(out, lse)``. Arguments as there; their shapes, dtypes and strides those the step was planned with, or
        the call takes the full path (and its checks)."""
        b = self._bound
        if (b is not None and _facts(q, k_cache, v_cache, k, v, k_descale, v_descale, out) == self._facts
                and b.thread == threading.get_ident() and torch.cuda.current_device() == b.device.index
                and b.stream == current_stream(b.device) and not torch.cuda.is_current_stream_capturing()
                and not in_compiled_graph() and not torch.compiler.is_compiling() and b.ready()
                and b.metadata_in_place()):
            if out is not None or k is not None:  # the facts hold alignments, not addresses
                C.check_kvcache_aliasing(q, k_cache, v_cache, k, v, out)
            if self._options["secure"]:  # on every run, as on every call
                C.warn_not_constant_time(True, q.device)
            res, lse = b.run(q, k_cache, v_cache, k, v, k_descale, v_descale, out, launch_hooks_active())
            return (res, lse) if self.return_lse else res
        opt = dict(self._meta, k=k, v=v, k_descale=k_descale, v_descale=v_descale)
        # an int cache_seqlens is converted again for this call (its device and stream: the bound tensor was filled
        # on the step's stream, and a captured call must own its tensors)
        lengths = ops.kvcache_lengths(q, self._lengths, self._options["secure"], self._meta["cu_seqlens_q"])
        return ops.kvcache_call(q, k_cache, v_cache, lengths, opt, out=out, **self._options)

    def __call__(self, q, k_cache, v_cache, **kwargs):
        return self.run(q, k_cache, v_cache, **kwargs)


def make_step(q, k_cache, v_cache, cache_seqlens, opt: dict, *, max_seqlen_q, causal, scale, num_splits, return_lse,
              out, secure, backend, validate, given_lengths=None) -> KVCacheStep:
    """:func:`flashcore.kvcache_step` after its argument conversion (``given_lengths``: ``cache_seqlens`` as the
    caller gave it, an int kept as an int for the runs that take the full path)."""
    options = dict(max_seqlen_q=max_seqlen_q, causal=causal, scale=scale, num_splits=num_splits,
                   return_lse=return_lse, secure=secure, backend=backend, validate=validate)
    plan = ops.kvcache_prepare(q, k_cache, v_cache, cache_seqlens, opt, out=out, **options)
    meta = {n: opt[n] for n in _META}
    bound = facts = None
    if plan is not None and keeps_buffers(q.device) and q.device.index == torch.cuda.current_device():
        # (not under capture, tracing or a compiled graph's op: their runs take the full path, whose workspace
        # belongs to the graph)
        bound = BoundDecode(plan, dict(meta, cache_seqlens=cache_seqlens), q.device)
        facts = _facts(q, k_cache, v_cache, *(opt[n] for n in _PER_RUN), out)
    return KVCacheStep(cache_seqlens if given_lengths is None else given_lengths, meta, options, plan, bound, facts)


__all__ = ["KVCacheStep", "make_step"]
