"""flashcore as a Hugging Face transformers (>= 5) attention implementation.

    import flashcore.integrations.transformers as fc_hf
    name = fc_hf.register()                       # "fcore"; register(backend="triton") under TRITON_INTERPRET=1
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)   # or model.set_attn_implementation(name)

``register`` puts two functions into transformers' global registries under one name: the attention function
(``AttentionInterface``) and a mask function (``AttentionMaskInterface``). Without the mask function
transformers would drop the padding mask for an unknown name. The name has no "flash" in it: transformers 5
sends every name containing "flash" to its hub FlashAttention loader (``utils/generic.py:
is_flash_attention_requested``), which fails for a kernel it does not know.

**What the mask function returns** (once per forward pass, for all layers): ``None`` when attention is causal
with no padding and the last query is the last key (no padding mask, a growing ``DynamicCache``), otherwise
the padding mask as a bool tensor ``[B, kv_length]`` in the keys' frame (True: a position the padding lets
through; for a causal mask with a ``StaticCache`` also False from the first position past the last query on,
as those slots hold no token yet). It carries a ``_flashcore`` attribute: whether the mask is causal or
bidirectional, and where the last query sits. A mask pattern other than causal/bidirectional + padding
(sliding window, chunked attention, packed sequences, ``or_mask``/``and_mask`` overlays, block ids) raises
there, naming it.

**How a call maps onto flashcore.** Per sequence ``b`` the padding mask must be one run of True positions
``[start_b, end_b)`` (left padding, right padding, or none); anything else raises. The first layer of a
forward pass derives ``start``/``end`` from the mask on the device (one launch: ``kernels/triton/mask_bounds.py``)
and keeps them on the mask for the others.

* decode (at most ``DECODE_MAX_QUERIES`` new tokens per sequence): the split-KV decode kernel, as
  ``flashcore.attention_with_kvcache`` with ``cache_leftpad=start``, ``cache_seqlens=end`` (int32 on the
  device, never copied to the host) on the ``[B, S, H, D]`` views of transformers' K/V, ``validate=False``
  (the lengths lie in ``[0, S]`` with ``start <= end`` by construction). The first layer of a forward pass plans
  it as a ``flashcore.kvcache_step`` kept on the mask (without a mask: kept per thread), one per kind of layer
  (q's and the cache's shapes, dtypes and device, and the options), and every layer of that kind runs it on its
  own tensors, which the step checks against the planned ones (an eager step's host time per layer:
  docs/perf-notes.md v61);
* prefill without padding: ``flashcore.attention`` (dense, ``layout="bshd"`` on the same views);
* prefill with padding: ``flashcore.attention_varlen`` on the unpadded tokens (the padding rows' outputs are
  zero: they see no key). Rows after a sequence's last real token (right padding) see all of its tokens, as
  with SDPA: a second, non-causal varlen call.

Causal masks are bottom-right aligned to the queries' positions in the cache (flashcore's convention and the
one transformers' masks encode). Exactness before speed: a mask or a setting flashcore cannot reproduce
exactly raises (``ValueError`` for masks, ``NotImplementedError`` for features: sliding windows, logit
soft-capping, attention sinks, dropout while training, position biases, packed sequences, a V head dim that
differs from Q's).

**Host syncs.** A prefill with a padding mask reads the per-sequence bounds back once (dense or varlen, and
varlen's cumulative lengths; ``attention_varlen`` checks them on the host too). A decode step with a padding
mask makes one sync per forward pass, not per layer, to check the mask's shape (one run of True positions per
sequence; transformers' own sdpa mask creation syncs once per step there too); ``register(validate_masks=False)``
drops that check, leaving a decode step without host syncs — only for masks that are contiguous by construction
(``generate`` with left padding, or no padding), since a mask with holes would then give a wrong result. Without a
padding mask (transformers 5.24 drops an all-ones mask in ``generate``; 5.17 passes it on) a decode step has no
sync either way.

**torch.compile.** transformers compiles the decode steps of ``generate`` with a static cache on CUDA (prefill
stays eager). Traced, the mask function returns the bare padding mask and the attention function runs only
the decode path, its lengths computed in the graph, with no host check (as with ``validate_masks=False``: the
mask is trusted to be one run per sequence, which ``generate``'s left-padded masks are); a traced call with
more than ``DECODE_MAX_QUERIES`` queries, a 4-D or a bidirectional mask raises.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch

import flashcore

from ..plan.cache import PlanCache
from ..runtime import KernelStep, interpreting

NAME = "fcore"
DECODE_MAX_QUERIES = 16  # new tokens per sequence up to which a call runs the KV-cache (split-KV) kernel
_RESERVED = ("flash", "sdpa", "eager", "flex_attention", "paged", "|", "/")
_STEPS = threading.local()  # .by_kind: {layer kind: flashcore.KVCacheStep} of this thread's decode calls without a mask
_MAX_KINDS = 8  # kept steps per thread (or per mask): a model's kinds of attention layer, the kinds of models in turn


def _layer_kind(q, k, *options) -> tuple:
    """What a decode step is planned for beside its metadata: the layer's q and cache shapes, dtypes and device
    (layers of other head counts, head dims or devices get steps of their own, not a run that falls back to the full
    path every time) and the options."""
    return (tuple(q.shape), q.dtype, q.device, tuple(k.shape), k.dtype, *options)


def _kept_step(steps: dict, kind: tuple, make):
    step = steps.get(kind)
    if step is None:
        if len(steps) >= _MAX_KINDS:
            steps.clear()
        step = steps[kind] = make()
    return step


@dataclass
class _Options:
    backend: str = "auto"
    validate_masks: bool = True


@dataclass
class _MaskSpec:
    """What the attention function needs from the mask: causal or not, and the causal frame ``frame``:
    the last query's key position + 1 (an int, or a 0-d device tensor with a ``StaticCache``)."""
    causal: bool
    frame: object  # int | torch.Tensor
    dev: Optional[tuple] = None   # (start, end, count) int32 [B] on the device, made by the first layer
    host: Optional[tuple] = None  # (start, end, count) lists and the frame as an int, once synced
    ok: Optional[bool] = None     # the decode check's verdict, once made
    extra: dict = field(default_factory=dict)


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - the tests skip without it
        raise ImportError("flashcore.integrations.transformers needs transformers >= 5: "
                          "pip install 'flashcore[transformers]'") from e
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        raise ImportError(f"flashcore.integrations.transformers needs transformers >= 5, found {transformers.__version__}")
    return transformers


def register(name: str = NAME, *, backend: str = "auto", validate_masks: bool = True) -> str:
    """Register flashcore with transformers under ``name`` (attention and mask function) and return the name to
    pass as ``attn_implementation``. ``backend``: flashcore's ``backend`` argument ("auto": the kernels on CUDA
    tensors, the float64 reference on CPU ones; "triton" forces the kernels, on CPU under TRITON_INTERPRET=1).
    ``validate_masks=False`` skips the per-step check that each padding mask is one run of True positions per
    sequence (see the module docstring). Registering a name again replaces the earlier functions."""
    _transformers()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if not isinstance(name, str) or not name or any(r in name for r in _RESERVED):
        raise ValueError(f"name {name!r} is refused: transformers treats names containing any of {list(_RESERVED)} "
                         "specially (e.g. any name with 'flash' goes to its hub FlashAttention loader)")
    if backend not in ("auto", "triton", "reference"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'reference', got {backend!r}")
    opt = _Options(backend=backend, validate_masks=bool(validate_masks))

    def fcore_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        return attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                 _options=opt, **kwargs)

    AttentionInterface.register(name, fcore_attention)
    AttentionMaskInterface.register(name, mask_function)
    return name


# ---------------------------------------------------------------------------------------------- mask function

def _pattern(mask_function, local_size, config) -> bool:
    """True for a causal mask, False for a bidirectional one; raises for any other pattern."""
    from transformers import masking_utils as mu

    if local_size is not None:
        setting = "config.sliding_window"
        if config is not None and getattr(config, "sliding_window", None) != local_size and \
                getattr(config, "attention_chunk_size", None) == local_size:
            setting = "config.attention_chunk_size"
        raise NotImplementedError(
            f"flashcore has no sliding-window or chunked attention, and this model asks for a window of {local_size} "
            f"tokens ({setting}). Set {setting} = None (identical results while every sequence fits in the window) "
            "or use attn_implementation='sdpa'")
    if mask_function is None or mask_function is mu.causal_mask_function:
        return True
    if mask_function is mu.bidirectional_mask_function:
        return False
    raise ValueError(
        "flashcore maps only causal or bidirectional attention with padding; this model builds another mask pattern "
        f"({getattr(mask_function, '__qualname__', mask_function)!s}: an or_mask/and_mask overlay, block_sequence_ids, "
        "or packed sequences detected from position_ids). Use attn_implementation='sdpa' for it")


def mask_function(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                  attention_mask=None, local_size=None, config=None, device=None, **kwargs):
    """transformers' mask interface for flashcore: ``None`` or the padding mask ``[B, kv_length]`` (bool) with a
    ``_flashcore`` attribute (module docstring)."""
    causal = _pattern(mask_function, local_size, config)
    device = attention_mask.device if attention_mask is not None else device
    pm = None
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError(f"expected a 2-D padding mask here, got shape {tuple(attention_mask.shape)}")
        pm = attention_mask.to(torch.bool)
        short = kv_offset + kv_length - pm.shape[1]
        if short > 0:  # a StaticCache's slots past the mask: nothing there yet
            pm = torch.nn.functional.pad(pm, (0, short), value=False)
        pm = pm[:, kv_offset:kv_offset + kv_length]
    frame = kv_length
    if causal:
        frame = q_offset + q_length - kv_offset  # keys at or after `frame` lie in every query's future
        if isinstance(frame, torch.Tensor) or frame != kv_length:
            # a StaticCache: empty slots past the last query; they are out of every causal window, mark them
            # as padding so that the attention function sees each sequence's last key position.
            pos = torch.arange(kv_length, device=device)
            valid = (pos < frame.to(device) if isinstance(frame, torch.Tensor) else pos < frame)[None, :]
            pm = valid.expand(batch_size, kv_length) if pm is None else pm & valid
        elif pm is None:
            return None
    elif pm is None:
        pm = torch.ones(batch_size, kv_length, dtype=torch.bool, device=device)
    if torch.compiler.is_compiling():  # traced: no Python attributes on tensors (see _traced_decode)
        if not causal:
            raise NotImplementedError("under torch.compile flashcore's integration maps causal masks only")
        return pm
    pm._flashcore = _MaskSpec(causal=causal, frame=frame)
    return pm


# ---------------------------------------------------------------------------------------- attention function

def _refuse_features(module, query, value, dropout, kwargs) -> None:
    """Raise for what flashcore does not compute, naming the model setting."""
    window = kwargs.get("sliding_window")
    if window is not None:
        raise NotImplementedError(
            f"flashcore has no sliding-window attention; this layer has sliding_window={window} (config.sliding_window"
            ", with config.layer_types where layers differ). Set config.sliding_window = None (identical results "
            "while every sequence fits in the window) or use attn_implementation='sdpa'")
    softcap = kwargs.get("softcap")
    if softcap is not None and softcap != 0:
        raise NotImplementedError(
            f"flashcore has no attention logit soft-capping; this layer has softcap={softcap} "
            "(config.attn_logit_softcapping). Use attn_implementation='eager'")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError(
            "flashcore has no attention sinks; this layer passes s_aux (its learned `sinks`, e.g. gpt-oss). "
            "Use attn_implementation='eager'")
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("flashcore has no additive position bias (position_bias); use "
                                  "attn_implementation='sdpa'")
    if dropout is not None and dropout > 0:
        raise NotImplementedError(
            f"flashcore has no attention dropout; this call asks for p={dropout} (config.attention_dropout while "
            f"the model is in training mode, module.training={getattr(module, 'training', None)}). Call model.eval() "
            "or set config.attention_dropout = 0.0")
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        raise NotImplementedError("packed sequences (cu_seq_lens_q/cu_seq_lens_k) are not mapped by this "
                                  "integration; call flashcore.attention_varlen directly or use 'sdpa'")
    if value.shape[-1] != query.shape[-1]:
        raise NotImplementedError(f"flashcore needs V's head dim to equal Q's; got {value.shape[-1]} and "
                                  f"{query.shape[-1]} (e.g. config.v_head_dim)")
    if kwargs.get("output_attentions"):
        warnings.warn("flashcore does not return attention weights (output_attentions=True): they are None",
                      stacklevel=3)


def _spec_from_4d(mask: torch.Tensor, B: int, Hq: int, Sq: int, K: int):
    """A 4-D mask (bool, True = attend; or additive float, 0 = attend) that is exactly causal (bottom-right) or
    bidirectional, with padding: its padding mask and spec. Anything else raises. (Syncs: a 4-D mask is not
    transformers' own path with a registered mask function.)"""
    shape = tuple(mask.shape)
    if len(shape) != 4 or shape[0] not in (1, B) or shape[1] not in (1, Hq) or shape[2] != Sq or shape[3] != K:
        raise ValueError(f"attention_mask of shape {shape} does not fit queries [{B}, {Hq}, {Sq}] and {K} keys")
    if mask.dtype == torch.bool:
        allowed = mask
    elif mask.is_floating_point():
        allowed = mask == 0
        blocked = (mask <= torch.finfo(mask.dtype).min / 2) | (mask == float("-inf"))
        if not bool((allowed | blocked).all()):
            raise ValueError("attention_mask holds additive values other than 0 and -inf/the dtype's minimum "
                             "(a bias): flashcore cannot apply it")
    else:
        raise ValueError(f"attention_mask has dtype {mask.dtype}; expected bool or floating point")
    if shape[1] > 1 and not bool((allowed == allowed[:, :1]).all()):
        raise ValueError("attention_mask differs between heads: flashcore cannot apply a per-head mask")
    allowed = allowed[:, 0].expand(B, Sq, K)
    pm = allowed.any(dim=1)  # keys some query sees: the padding
    i = torch.arange(Sq, device=mask.device)[:, None]
    j = torch.arange(K, device=mask.device)[None, :]
    if bool((allowed == (pm[:, None, :] & (j <= i + (K - Sq)))).all()):
        causal = True
    elif bool((allowed == pm[:, None, :]).all()):
        causal = False
    else:
        raise ValueError("attention_mask is neither a causal (bottom-right aligned) nor a bidirectional mask "
                         "combined with padding; flashcore cannot reproduce it exactly (use attn_implementation='sdpa')")
    pm = pm.clone()
    pm._flashcore = _MaskSpec(causal=causal, frame=K)
    return pm


def _mask_spec(attention_mask, is_causal: bool, B: int, Hq: int, Sq: int, K: int):
    """(padding mask [B, K] or None, spec)."""
    if attention_mask is None:
        return None, _MaskSpec(causal=is_causal, frame=K)
    if not isinstance(attention_mask, torch.Tensor):
        raise ValueError(f"attention_mask of type {type(attention_mask).__name__} is not one flashcore maps "
                         "(register() installs the mask function that makes a padding mask)")
    spec = getattr(attention_mask, "_flashcore", None)
    if spec is not None:
        if attention_mask.shape != (B, K):
            raise ValueError(f"flashcore's padding mask has shape {tuple(attention_mask.shape)}, expected {(B, K)}")
        return attention_mask, spec
    if attention_mask.dim() == 2:  # somebody's padding mask (FlashAttention's convention): padding + is_causal
        if attention_mask.shape != (B, K):
            raise ValueError(f"a 2-D attention_mask must be a padding mask [B, kv_length] = {[B, K]}, got "
                             f"{list(attention_mask.shape)}")
        if attention_mask.dtype != torch.bool:
            attention_mask = attention_mask != 0
        spec = _MaskSpec(causal=is_causal, frame=K)
        attention_mask = attention_mask.clone()
        attention_mask._flashcore = spec
        return attention_mask, spec
    cached = getattr(attention_mask, "_flashcore_pm", None)
    if cached is None:
        cached = _spec_from_4d(attention_mask, B, Hq, Sq, K)
        try:
            attention_mask._flashcore_pm = cached  # the other layers get the same mask object
        except Exception:  # pragma: no cover
            pass
    return cached, cached._flashcore


_BOUNDS = PlanCache(limit=64)  # (B, K, row stride, device) -> the mask-bounds launch (KernelStep)


def _mask_bounds(pm: torch.Tensor):
    """(start, end, count) of each row of the bool matrix ``pm`` in one launch (kernels/triton/mask_bounds.py): on
    CUDA tensors, and on CPU ones under Triton's interpreter; None elsewhere (PyTorch's ops then)."""
    if not (pm.is_cuda or interpreting()) or pm.shape[0] == 0 or pm.shape[1] >= 2 ** 31:
        return None
    from ..kernels.triton.mask_bounds import mask_bounds_kernel

    if pm.stride(1) != 1:
        pm = pm.contiguous()
    B, K = pm.shape
    out = torch.empty(3, B, dtype=torch.int32, device=pm.device)
    block = min(4096, max(16, 1 << (K - 1).bit_length()))
    step = _BOUNDS.get_or_build((B, K, pm.stride(0), pm.device), lambda: KernelStep(
        mask_bounds_kernel, (B, 1), (None, None, K, pm.stride(0), B), 2, dict(BLOCK=block), 4 if block <= 1024 else 8,
        1))
    step.run((pm.view(torch.uint8), out), pm.device)
    return out[0], out[1], out[2]


def _device_lengths(pm: torch.Tensor, spec: _MaskSpec):
    """(start, end, count): int32 [B] on the device: each sequence's first and one-past-last True position, and
    its number of True positions (a single run iff count == end - start). Empty rows: start = end = 0."""
    if spec.dev is None:
        spec.dev = _mask_bounds(pm)
    if spec.dev is None:
        K = pm.shape[1]
        pos = torch.arange(K, device=pm.device, dtype=torch.int32)
        end = torch.where(pm, pos + 1, 0).amax(dim=1).to(torch.int32)
        start = torch.minimum(torch.where(pm, pos, K).amin(dim=1).to(torch.int32), end)
        spec.dev = (start.contiguous(), end.contiguous(), pm.sum(dim=1, dtype=torch.int32))
    return spec.dev


def _host_lengths(pm: torch.Tensor, spec: _MaskSpec):
    """Lists (start, end) after checking each sequence's padding is one run; and the causal frame as an int."""
    if spec.host is None:
        start, end, count = _device_lengths(pm, spec)
        frame = spec.frame
        st = torch.stack([start, end, count]).tolist()
        frame = int(frame.item()) if isinstance(frame, torch.Tensor) else int(frame)
        holes = [b for b, (s, e, c) in enumerate(zip(*st)) if c != e - s]
        if holes:
            raise ValueError(
                f"the attention mask of sequence(s) {holes[:8]} is not one run of attended positions (padding in "
                "the middle, e.g. right-padded prompts continued by generation): flashcore maps only left or right "
                "padding. Pad on the left for generation (tokenizer.padding_side = 'left')")
        spec.host = (st[0], st[1], frame)
    return spec.host


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, *,
                      _options: _Options = _Options(), **kwargs):
    """transformers' attention interface: q ``[B, Hq, Sq, D]``, k/v ``[B, Hkv, Sk, D]`` (the cache included);
    returns ``(out [B, Sq, Hq, D], None)``."""
    _refuse_features(module, query, value, dropout, kwargs)
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    B, Hq, Sq, D = query.shape
    K = key.shape[2]
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [B, S, H, D] views, no copies
    backend = _options.backend
    # Training: the KV-cache kernel is inference-only, so calls that record a backward take the prefill routes
    training = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    if torch.compiler.is_compiling():
        if training and attention_mask is None:
            out = flashcore.attention(q, k, v, causal=bool(is_causal), scale=scaling, layout="bshd", backend=backend)
            return out, None
        return _traced_decode(q, k, v, attention_mask, bool(is_causal), scaling, backend), None
    pm, spec = _mask_spec(attention_mask, bool(is_causal), B, Hq, Sq, K)
    if pm is None:  # no padding; a causal mask ends at the last key
        if Sq <= DECODE_MAX_QUERIES and not training:
            # the same decode step in every layer: a step planned by the first layer of each kind, run by the others
            # (flashcore.kvcache_step; its run checks each layer's tensors against the planned ones). K is in the
            # kind (k's shape): a growing cache plans a new step each forward pass
            steps = getattr(_STEPS, "by_kind", None)
            if steps is None:
                steps = _STEPS.by_kind = {}
            step = _kept_step(steps, _layer_kind(q, k, spec.causal, scaling, backend), lambda: flashcore.kvcache_step(
                q, k, v, cache_seqlens=K, causal=spec.causal, scale=scaling, backend=backend, validate=False))
            return step.run(q, k, v), None
        out = flashcore.attention(q, k, v, causal=spec.causal, scale=scaling, layout="bshd", backend=backend)
        return out, None
    if Sq <= DECODE_MAX_QUERIES and not training and _decode_fits(pm, spec, Sq, _options):
        # one step per forward pass (its mask) and kind of layer, planned by the first such layer, run by the others
        def make():
            start, end, _ = _device_lengths(pm, spec)
            return flashcore.kvcache_step(q, k, v, cache_seqlens=end, cache_leftpad=start, causal=spec.causal,
                                          scale=scaling, backend=backend, validate=False)

        step = _kept_step(spec.extra.setdefault("steps", {}), _layer_kind(q, k, scaling, backend), make)
        return step.run(q, k, v), None
    return _padded_prefill(q, k, v, pm, spec, scaling, backend), None


def _traced_decode(q, k, v, pm, causal: bool, scale, backend):
    """A decode step under torch.compile (transformers compiles the decode steps of ``generate`` with a static
    cache): the KV-cache kernel with lengths from the padding mask, computed in the graph. Nothing is checked on
    the host here: the mask is trusted to be one run per sequence (as ``generate``'s left-padded masks are)."""
    B, Sq, _, _ = q.shape
    K = k.shape[1]
    if Sq > DECODE_MAX_QUERIES:
        raise NotImplementedError(f"under torch.compile flashcore's integration runs decode steps only (at most "
                                  f"{DECODE_MAX_QUERIES} new tokens per sequence, got {Sq}); run prefill eagerly")
    if pm is None:
        return flashcore.attention_with_kvcache(q, k, v, cache_seqlens=K, causal=causal, scale=scale, backend=backend,
                                               validate=False)
    if pm.dim() != 2 or pm.dtype != torch.bool or tuple(pm.shape) != (B, K):
        raise ValueError("under torch.compile flashcore's integration takes only its own padding mask [B, kv_length]")
    pos = torch.arange(K, device=pm.device, dtype=torch.int32)
    end = torch.where(pm, pos + 1, 0).amax(dim=1).to(torch.int32)
    # one run of True positions per sequence (trusted here): it starts `count` before its end. Not the eager path's
    # where(pm, pos, K).amin: once a cache length recompiles with dynamic shapes, K is a symbol (int64), and Inductor
    # (torch 2.11) fused that into a reduction loop that starts int32 and carries int64, a Triton compile error on
    # generate's third static cache length (perf-notes v60)
    start = end - pm.sum(dim=1, dtype=torch.int32)
    return flashcore.attention_with_kvcache(q, k, v, cache_seqlens=end, cache_leftpad=start, causal=causal,
                                           scale=scale, backend=backend, validate=False)


def _decode_fits(pm, spec: _MaskSpec, Sq: int, opt: _Options) -> bool:
    """Whether the KV-cache kernel (keys [start, end), causal alignment at ``end``) is exact for this mask: one
    run per sequence; causal with several queries also end == frame (no right padding) or an empty sequence.
    Checked once per mask (a sync), unless validate_masks=False."""
    if spec.ok is None:
        if not opt.validate_masks:
            spec.ok = True
        else:
            start, end, count = _device_lengths(pm, spec)
            run = count == end - start
            if spec.causal and Sq > 1:
                frame = spec.frame
                fits = bool((run & ((end == frame) | (count == 0))).all())  # an empty sequence: zeros
            else:
                fits = bool(run.all())
            spec.ok = fits  # when not: _padded_prefill, exact for right padding; it raises for a mask with holes
    return spec.ok


def _padded_prefill(q, k, v, pm, spec: _MaskSpec, scale, backend):
    """Exact attention of a padded batch: dense when no sequence is padded, otherwise varlen on the unpadded
    tokens (plus a non-causal call for rows after a sequence's last token)."""
    B, Sq, Hq, D = q.shape
    K = k.shape[1]
    start, end, frame = _host_lengths(pm, spec)
    dev = q.device
    if spec.causal:
        first = frame - Sq  # key position of query 0's diagonal
        if all(s == 0 for s in start) and all(e == frame for e in end):
            return flashcore.attention(q, k[:, :frame], v[:, :frame], causal=True, scale=scale, layout="bshd",
                                       backend=backend)
        # rows [a_b, n_b) see keys [start_b, row's diagonal]; rows before a_b see nothing; rows from n_b on see all
        row_a = [min(max(s - first, 0), Sq) for s in start]
        row_n = [min(max(e - first, 0), Sq) for e in end]
        groups = [(row_a, row_n, True), (row_n, [Sq if e > s else n for s, e, n in zip(start, end, row_n)], False)]
    else:
        if all(s == 0 for s in start) and len(set(end)) == 1 and end[0] > 0:
            return flashcore.attention(q, k[:, :end[0]], v[:, :end[0]], causal=False, scale=scale, layout="bshd",
                                       backend=backend)
        groups = [([0] * B, [Sq if e > s else 0 for s, e in zip(start, end)], False)]
    out = torch.zeros(B, Sq, Hq, D, dtype=q.dtype, device=dev)
    kb, kj = _ranges(start, end, dev)
    kp, vp = k[kb, kj], v[kb, kj]
    cu_k = _cumulative([e - s for s, e in zip(start, end)], dev)
    max_k = max(e - s for s, e in zip(start, end))
    for lo, hi, causal in groups:
        lens = [max(h - l, 0) for l, h in zip(lo, hi)]
        if sum(lens) == 0:
            continue
        qb, qi = _ranges(lo, hi, dev)
        res = flashcore.attention_varlen(q[qb, qi], kp, vp, _cumulative(lens, dev), cu_k, max(lens), max(max_k, 1),
                                         causal=causal, scale=scale, backend=backend)
        out[qb, qi] = res
    return out


def _ranges(lo, hi, device):
    """(batch index, position index) of every position in [lo_b, hi_b) for each b, batch-major (made on the
    device from the per-sequence bounds)."""
    lens = [max(h - l, 0) for l, h in zip(lo, hi)]
    total = sum(lens)
    n = torch.tensor(lens, dtype=torch.long).to(device)
    first = torch.tensor([l - c for l, c in zip(lo, _prefix(lens))], dtype=torch.long).to(device)
    b = torch.repeat_interleave(torch.arange(len(lens), device=device), n, output_size=total)
    return b, torch.arange(total, device=device) + first[b]


def _prefix(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def _cumulative(lengths, device):
    return torch.tensor(_prefix(lengths), dtype=torch.int32).to(device)


__all__ = ["NAME", "DECODE_MAX_QUERIES", "register", "attention_forward", "mask_function"]
