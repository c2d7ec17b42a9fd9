"""Kernel launchers. ``launch_attention`` is the single entry that picks an architecture's
configuration and launches; ``audit_specs`` lists every configuration that can be launched, for
the static SASS audit."""
from __future__ import annotations

import os
from dataclasses import replace
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


def build_launch(q, k, v, o, lse, *, seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k,
                 scale: float, causal: bool, secure: bool, secure_public_diag: bool,
                 seqlen_q: int, seqlen_k: int, batch: int, num_heads_q: int, num_heads_kv: int,
                 q_strides, k_strides, v_strides, o_strides, lse_strides, config: Optional[Config] = None,
                 arch=None):
    """Everything a launch of ``attn_fwd_kernel`` needs: (config, grid, positional args, constexprs).

    Shared by the launcher and by :func:`audit_specs`, so the audit compiles exactly what runs.
    Strides are (batch, head, seq) element strides; for varlen the batch stride is unused and
    ``batch`` is the number of sequences. In secure mode with ``cfg.v_prepass`` the caller passes
    the pre-pass's clean copy of V (contiguous) and its strides."""
    head_dim = q.shape[-1]
    varlen = cu_seqlens_q is not None
    facts = dict(head_dim=head_dim, dtype_bytes=q.element_size(), causal=causal, secure=secure, seqlen_q=seqlen_q,
                 seqlen_k=seqlen_k, batch_heads=batch * num_heads_q)
    cfg = config or configs.choose(arch, **facts)
    if cfg.kernel != "triton":  # this builds the Triton kernel's launch (the Gluon one: hopper_fwd.py)
        cfg = configs.triton_table(arch, **facts)
    use_tma = cfg.tma and not varlen and all(_tma_ok(t) for t in (q, k, v))
    bd = configs.block_d(head_dim)
    if use_tma:
        qa, ka, va = (_descriptor(t, rows, bd) for t, rows in ((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n)))
    else:
        qa, ka, va = q, k, v
    args = [*_pointer_args(qa, ka, va, o, lse, (seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k), dummy=q),
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
    grid = (triton_cdiv(seqlen_q, cfg.block_m), batch * num_heads_q)
    return cfg, grid, args, constexprs


PREPASS_BLOCK_S = 64
PREPASS_WARPS = 4


def build_prepass(v, vs, seqlens_k, *, seqlen_k: int, batch: int, num_heads_kv: int, v_strides):
    """(grid, positional args, constexprs) of the secure V pre-pass (``secure_prepass.py``)."""
    head_dim = v.shape[-1]
    args = [v, vs, seqlens_k, *v_strides, seqlen_k, num_heads_kv]
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=configs.block_d(head_dim), BLOCK_S=PREPASS_BLOCK_S)
    return (triton_cdiv(seqlen_k, PREPASS_BLOCK_S), batch * num_heads_kv), args, constexprs


def build_prepass_kv(k, v, ks, vs, w, seqlens_k, *, seqlen_k: int, batch: int, num_heads_kv: int, k_strides,
                     v_strides):
    """(grid, positional args, constexprs) of the secure K/V pre-pass with key weights
    (``secure_prepass.attn_secure_sanitize_kv_kernel``); ``w`` is ``key_weights_shape(batch, seqlen_k)``."""
    from .secure_prepass import W_ROWS

    head_dim = v.shape[-1]
    args = [k, v, ks, vs, w, seqlens_k, *k_strides, *v_strides, seqlen_k, num_heads_kv, w.shape[-1]]
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=configs.block_d(head_dim), BLOCK_S=PREPASS_BLOCK_S, W_ROWS=W_ROWS,
                      V_PAD_PAIRS=configs.secure_v_pad_pairs())
    # w_len <= seqlen_k rounded up to 8 <= the rows this grid covers
    return (triton_cdiv(seqlen_k, PREPASS_BLOCK_S), batch * num_heads_kv), args, constexprs


def _pointer_args(q, k, v, o, lse, extra, *, dummy):
    """The kernel's pointer arguments in order; an unused one still needs a tensor (``dummy``)."""
    return (q, k, v, o, lse if lse is not None else dummy, *(t if t is not None else dummy for t in extra))


class _Step:
    """One kernel launch whose scalars and constexprs are fixed; only the pointers change.

    The first run goes through Triton's launcher (compiling if needed). On a GPU the compiled
    kernel is kept and later runs call it directly, skipping Triton's argument binding: the plan
    key (below) holds every fact Triton specialises on, so this is the kernel Triton would pick."""
    __slots__ = ("fn", "grid", "n_ptrs", "scalars", "constexprs", "num_warps", "num_stages", "options", "compiled",
                 "tail")

    def __init__(self, fn, grid, args, n_ptrs, constexprs, num_warps, num_stages, options=None):
        self.fn, self.grid, self.n_ptrs = fn, grid, n_ptrs
        self.scalars = tuple(args[n_ptrs:])
        self.constexprs, self.num_warps, self.num_stages = constexprs, num_warps, num_stages
        self.options = options or {}
        self.compiled, self.tail = None, ()

    def run(self, ptrs, device: torch.device) -> None:
        grid = self.grid
        if grid[0] == 0 or grid[1] == 0:
            return
        compiled = self.compiled
        if compiled is None:
            kernel = self.fn[grid](*ptrs, *self.scalars, **self.constexprs, num_warps=self.num_warps,
                                   num_stages=self.num_stages, **self.options)
            if hasattr(kernel, "result"):  # asynchronous compilation hands back a future
                kernel = kernel.result()
            if device.type == "cuda" and not _interpreting() and kernel is not None:
                names = list(self.fn.arg_names)
                self.tail = tuple(self.constexprs[n] for n in names[len(ptrs) + len(self.scalars):])
                self.compiled = kernel
            return
        args = (*ptrs, *self.scalars, *self.tail)
        stream = _current_stream(device)
        if _launch_hooks_active():
            from triton import knobs

            compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata,
                         compiled.launch_metadata(grid, stream, *args), knobs.runtime.launch_enter_hook,
                         knobs.runtime.launch_exit_hook, *args)
        else:  # no hook to call: skip building launch metadata and calling two empty hook chains
            compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *args)


def _launch_hooks_active() -> bool:
    """Whether a profiler or user registered a Triton launch hook. Triton 3.6 keeps the hooks as
    ``HookChain`` objects that are never None, so an empty chain counts as no hook."""
    from triton import knobs

    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _current_stream(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch._C._cuda_getCurrentRawStream(index)


class SecurePrepass:
    """A plan's secure pre-pass: ``run`` returns the (k, v, key weights) the main kernel reads.

    * V only (``key_weights_shape`` None; the Triton kernel and the Gluon kernel's causal form): a copy
      of V with its padding replaced, K as given, no weights.
    * K and V (the Gluon kernel's non-causal form): sanitised copies of both plus the 0/1 key weights.
    The copies are new tensors from PyTorch's caching allocator on every call, so CUDA-graph capture
    works (the graph's private pool keeps them)."""
    __slots__ = ("step", "kv_shape", "key_weights_shape")

    def __init__(self, step, kv_shape, key_weights_shape=None):
        self.step, self.kv_shape, self.key_weights_shape = step, kv_shape, key_weights_shape

    def run(self, k, v, seqlens_k):
        vs = torch.empty(self.kv_shape, dtype=v.dtype, device=v.device)
        if self.key_weights_shape is None:
            self.step.run((v, vs, seqlens_k), v.device)
            return k, vs, None
        ks = torch.empty(self.kv_shape, dtype=k.dtype, device=k.device)
        w = torch.empty(self.key_weights_shape, dtype=k.dtype, device=k.device)
        self.step.run((k, v, ks, vs, w, seqlens_k), v.device)
        return ks, vs, w


class LaunchPlan:
    """A planned attention launch (plus the secure pre-pass when there is one), replayable on any
    tensors with the metadata it was planned for (see :func:`plan_attention`)."""
    __slots__ = ("cfg", "main", "prepass", "tma_kw")

    def __init__(self, cfg, main, prepass=None, tma_kw=None):
        self.cfg, self.main, self.prepass, self.tma_kw = cfg, main, prepass, tma_kw

    def launch(self, q, k, v, o, lse, seqlens_q=None, seqlens_k=None, cu_seqlens_q=None, cu_seqlens_k=None):
        """q/k/v/o may be the caller's tensors or any view with the same data pointer: only the
        pointers are read here; strides were fixed when the plan was made."""
        w = None
        if self.prepass is not None:
            k, v, w = self.prepass.run(k, v, seqlens_k)
        if self.tma_kw is not None:  # descriptors hold the pointers: rebuild them every call
            _launch_unplanned(q, k, v, o, lse, seqlens_q=seqlens_q, seqlens_k=seqlens_k,
                              cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, **self.tma_kw)
            return
        ptrs = _pointer_args(q, k, v, o, lse, (seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k), dummy=q)
        if w is None:
            self.main.run(ptrs, q.device)
        else:
            self.main.run(ptrs, q.device, key_weights=w)


# Plans by metadata: the key holds every fact Triton specialises on (dtypes, shapes, strides, so
# int values incl. ==1 and %16, and pointer alignment) plus our own flags.
_PLANS: dict = {}
_PLAN_LIMIT = 4096
_TENSOR_KWARGS = ("seqlens_q", "seqlens_k", "cu_seqlens_q", "cu_seqlens_k")


def _plan_key(tensors, kw):
    facts = []
    for t in tensors:
        if t is None:
            facts.append(None)
        else:
            facts.append((t.dtype, t.device, tuple(t.shape), tuple(t.stride()), t.data_ptr() % 16 == 0))
    public = tuple(sorted((k, v) for k, v in kw.items() if k not in _TENSOR_KWARGS))
    return tuple(facts), public, configs.env_overrides()


def plan_attention(q, k, v, o, lse, **kw) -> LaunchPlan:
    """The (cached) launch plan for these tensors' metadata; see :func:`build_launch` for ``kw``."""
    key = _plan_key((q, k, v, o, lse) + tuple(kw[n] for n in _TENSOR_KWARGS), kw)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(q, k, v, o, lse, **kw)
        if len(_PLANS) < _PLAN_LIMIT:
            _PLANS[key] = plan
    return plan


def _make_plan(q, k, v, o, lse, **kw) -> LaunchPlan:
    from .attention_fwd import attn_fwd_kernel

    arch = _arch(q.device)
    facts = dict(head_dim=q.shape[-1], dtype_bytes=q.element_size(), causal=kw["causal"], secure=kw["secure"],
                 seqlen_q=kw["seqlen_q"], seqlen_k=kw["seqlen_k"], batch_heads=kw["batch"] * kw["num_heads_q"])
    cfg = kw.get("config") or configs.choose(arch, **facts)
    if cfg.kernel == "gluon_ws":
        from . import hopper_fwd

        # secure causal only in the self-attention form, whose diagonal is public
        secure_ok = not kw["secure"] or (cfg.v_prepass and (not kw["causal"] or kw["secure_public_diag"]))
        if (kw["cu_seqlens_q"] is None and secure_ok and arch is not None and arch[0] == 9
                and hopper_fwd.eligible(q, k, v, o, q.shape[-1])):
            prepass, k_in, v_in = None, k, v
            if kw["secure"] and not kw["causal"]:  # no key mask in the kernel: K, V and key weights
                prepass, k_in, v_in = _prepass_kv_plan(k, v, kw)
            elif kw["secure"]:
                prepass, v_in = _prepass_plan(v, kw)
            main = hopper_fwd.GluonLaunch(q, k_in, v_in, o, lse, cfg=cfg, secure=kw["secure"],
                                          **{n: kw[n] for n in _GLUON_KW})
            return LaunchPlan(cfg, main, prepass)
        fallback = configs.triton_table(arch, **facts)
        cfg = replace(fallback, v_prepass=cfg.v_prepass) if kw["secure"] else fallback
    kw = dict(kw, config=cfg)
    prepass = None
    if kw["secure"] and cfg.v_prepass:
        prepass, v = _prepass_plan(v, kw)
        kw["v_strides"] = v.stride()[:3]  # the pre-pass's contiguous copy
    cfg, grid, args, constexprs = build_launch(q, k, v, o, lse, arch=arch, **kw)
    if constexprs["USE_TMA"]:
        return LaunchPlan(cfg, None, prepass, tma_kw={n: x for n, x in kw.items() if n not in _TENSOR_KWARGS})
    main = _Step(attn_fwd_kernel, grid, args, 5 + len(_TENSOR_KWARGS), constexprs, cfg.num_warps, cfg.num_stages,
                 _compile_options(cfg))
    return LaunchPlan(cfg, main, prepass)


def _prepass_plan(v, kw):
    """(V pre-pass, a representative sanitised copy of V) for secure mode."""
    from .secure_prepass import attn_secure_zero_v_padding_kernel

    B, Hkv, Sk, D = kw["batch"], kw["num_heads_kv"], kw["seqlen_k"], v.shape[-1]
    vs = torch.empty((B, Hkv, Sk, D), dtype=v.dtype, device=v.device)
    grid, args, ce = build_prepass(v, vs, kw["seqlens_k"], seqlen_k=Sk, batch=B, num_heads_kv=Hkv,
                                   v_strides=kw["v_strides"])
    step = _Step(attn_secure_zero_v_padding_kernel, grid, args, 3, ce, PREPASS_WARPS, 1)
    return SecurePrepass(step, vs.shape), vs


def _prepass_kv_plan(k, v, kw):
    """(K/V pre-pass with key weights, representative sanitised copies of K and V) for the secure Gluon
    kernel's non-causal form."""
    from .secure_prepass import attn_secure_sanitize_kv_kernel, key_weights_shape

    B, Hkv, Sk, D = kw["batch"], kw["num_heads_kv"], kw["seqlen_k"], v.shape[-1]
    ks, vs = (torch.empty((B, Hkv, Sk, D), dtype=v.dtype, device=v.device) for _ in range(2))
    w = torch.empty(key_weights_shape(B, Sk), dtype=v.dtype, device=v.device)
    grid, args, ce = build_prepass_kv(k, v, ks, vs, w, kw["seqlens_k"], seqlen_k=Sk, batch=B, num_heads_kv=Hkv,
                                      k_strides=kw["k_strides"], v_strides=kw["v_strides"])
    step = _Step(attn_secure_sanitize_kv_kernel, grid, args, 6, ce, PREPASS_WARPS, 1)
    return SecurePrepass(step, vs.shape, w.shape), ks, vs


_GLUON_KW = ("scale", "causal", "seqlen_q", "seqlen_k", "batch", "num_heads_q", "num_heads_kv", "lse_strides")


def _launch_unplanned(q, k, v, o, lse, **kw):
    from .attention_fwd import attn_fwd_kernel

    cfg, grid, args, constexprs = build_launch(q, k, v, o, lse, arch=_arch(q.device), **kw)
    if grid[0] and grid[1]:
        attn_fwd_kernel[grid](*args, **constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                              **_compile_options(cfg))


def _compile_options(cfg: Config) -> dict:
    """Compiler options beyond warps/stages; only CUDA's compiler knows ``maxnreg``."""
    return {"maxnreg": cfg.maxnreg} if cfg.maxnreg is not None and not _interpreting() else {}


def launch_attention(q, k, v, o, lse, **kw) -> Config:
    """Plan (or reuse the plan for) this launch and run it; returns the config used."""
    plan = plan_attention(q, k, v, o, lse, **kw)
    plan.launch(q, k, v, o, lse, *(kw[n] for n in _TENSOR_KWARGS))
    return plan.cfg


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

# Public facts that select a different compiled kernel. The default audit covers each code path
# (dtype families, every BLOCK_D with even and masked head dims, head dims whose row stride is
# not a multiple of 16 bytes, GQA vs not, seqlen even/odd/not divisible by 16, each causal mode);
# ``full=True`` enumerates every supported head dim and all three dtypes.
_AUDIT_HEAD_DIMS = (8, 64, 72, 128, 256)
_AUDIT_SEQLENS = ((4096, 8, 8), (1000, 8, 2))  # (S, Hq, Hkv)


def _spec_from_launch(name, cfg, args, constexprs, secret, fn=None):
    """Specialise the runtime arguments exactly as Triton's launcher does (ints equal to 1 become
    constexprs; pointers and ints divisible by 16 get ``tt.divisibility``)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from .attention_fwd import attn_fwd_kernel

    fn = fn or attn_fwd_kernel
    names = list(fn.arg_names)  # also set on the interpreter's function object
    signature, attrs, consts = {}, {}, dict(constexprs)
    for i, (pname, val) in enumerate(zip(names, args)):
        ty, attr = native_specialize_impl(BaseBackend, val, False, True, True)
        if ty == "constexpr":
            signature[pname] = "constexpr"
            consts[pname] = attr
        else:
            signature[pname] = ty
            if attr == "D":
                attrs[(i,)] = [["tt.divisibility", 16]]
    for pname in constexprs:
        signature[pname] = "constexpr"
    return dict(name=name, fn=fn, signature=signature, constexprs=consts, attrs=attrs,
                secret=set(secret), num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg)


def audit_specs(secure: bool, arch: tuple[int, int] = (9, 0), full: bool = False) -> list[dict]:
    """Every Triton kernel configuration flashcore launches in this mode on ``arch`` (see above), as
    ``{name, fn, signature, constexprs, attrs, secret, num_warps, num_stages}`` for the SASS audit.
    On sm_90 the warp-specialised Gluon kernel (hopper_fwd.py, :func:`gluon_spec`) is listed too, in every
    form it launches in this mode (:data:`_AUDIT_GLUON`).

    Secrets: the data behind q/k/v and, in secure mode, the true lengths (``SEQLENS_*``); for the
    fast path the cumulative lengths of a varlen launch (its loop bounds depend on them)."""
    dtypes = (torch.bfloat16, torch.float16, torch.float32) if full else (torch.bfloat16, torch.float32)
    head_dims = tuple(range(8, 257, 8)) if full else _AUDIT_HEAD_DIMS
    modes = [(False, False), (True, False), (True, True)] if secure else [(False, False), (True, False)]
    specs = []
    for dtype in dtypes:
        for hd in head_dims:
            for causal, public_diag in modes:
                for S, Hq, Hkv in _AUDIT_SEQLENS:
                    for varlen in ((False,) if secure else (False, True)):
                        specs.append(_audit_spec(dtype, hd, causal, public_diag, S, Hq, Hkv, secure, varlen, arch))
            if secure:
                for S, _, Hkv in _AUDIT_SEQLENS:
                    specs.append(_audit_prepass_spec(dtype, hd, S, Hkv))
                    if dtype != torch.float32 and hd in (64, 128):  # the secure Gluon kernel's (non-causal)
                        specs.append(_audit_prepass_kv_spec(dtype, hd, S, Hkv))
    if tuple(arch) == (9, 0):
        for dtype in (torch.bfloat16, torch.float16):
            for hd in (64, 128):
                for causal in (False, True):
                    for S, Hq, Hkv, lse in _AUDIT_GLUON:
                        cfg = (configs.gluon_secure if secure else configs.gluon_ws)(hd, S, causal)
                        specs.append(gluon_spec(hd, causal, dtype, S, Hq, Hkv, lse, cfg=cfg, secure=secure))
    return specs


# The Gluon kernel's audited forms: (S, Hq, Hkv, return_lse). S=4096 takes three consumer warpgroups at
# D=64 non-causal (configs.gluon_ws); 1000 has a partial edge tile and two.
_AUDIT_GLUON = ((4096, 8, 8, False), (1000, 8, 2, True))


def gluon_spec(head_dim: int, causal: bool, dtype=torch.bfloat16, S: int = 4096, Hq: int = 8, Hkv: int = 8,
               return_lse: bool = False, cfg=None, secure: bool = False) -> dict:
    """The Gluon Hopper kernel as launched for these public facts, as a compile spec like
    :func:`audit_specs`' (plus ``maxnreg``); built from CPU tensors, no GPU needed. ``secure``: the
    constant-time kernel (secret: the data behind the descriptors and the lengths)."""
    from .hopper_fwd import GluonLaunch

    B = 2
    q, k = torch.empty(B, Hq, S, head_dim, dtype=dtype), torch.empty(B, Hkv, S, head_dim, dtype=dtype)
    lse = torch.empty(B, Hq, S, dtype=torch.float32) if return_lse else None
    cfg = cfg or (configs.gluon_secure if secure else configs.gluon_ws)(head_dim, S, causal)
    launch = GluonLaunch(q, k, k, q, lse, scale=head_dim ** -0.5, causal=causal, seqlen_q=S, seqlen_k=S, batch=B,
                         num_heads_q=Hq, num_heads_kv=Hkv, lse_strides=(Hq * S, S), cfg=cfg, secure=secure)
    step = launch.step
    lens = torch.full((B,), S, dtype=torch.int32)
    w = torch.empty(launch.key_weights_shape, dtype=dtype) if launch.key_weights_shape else None
    args = [*launch._descs(q, k, k, q, w), lse if lse is not None else q, lens, *step.scalars]
    # secure: the key weights and the query lengths are secret too (the key lengths enter the pre-pass only)
    secret = {"q_desc", "k_desc", "v_desc"} | ({"w_desc", "seqlens_q_ptr"} if secure else set())
    mode = "secure" if secure else "fast"
    name = (f"{mode}_gluon_ws_{_ELT[dtype]}_d{head_dim}_{'causal' if causal else 'full'}_s{S}_gqa{Hq // Hkv}"
            f"{'_lse' if return_lse else ''}_{cfg.block_m // 64}wg")
    spec = _spec_from_launch(name, cfg, args, step.constexprs, secret, fn=step.fn)
    spec["num_stages"] = 1
    spec["maxnreg"] = step.options["maxnreg"]
    return spec


def _audit_prepass_spec(dtype, hd, S, Hkv):
    from .secure_prepass import attn_secure_zero_v_padding_kernel

    B = 2
    v = torch.empty(B, Hkv, S, hd, dtype=dtype)
    vs = torch.empty_like(v)
    lens = torch.full((B,), S, dtype=torch.int32)
    _, args, ce = build_prepass(v, vs, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv, v_strides=v.stride()[:3])
    cfg = Config(PREPASS_BLOCK_S, PREPASS_BLOCK_S, PREPASS_WARPS, 1)
    return _spec_from_launch(f"secure_prepass_{_ELT[dtype]}_d{hd}_s{S}_hkv{Hkv}", cfg, args, ce,
                             {"V", "VS", "SEQLENS_K"}, fn=attn_secure_zero_v_padding_kernel)


def _audit_prepass_kv_spec(dtype, hd, S, Hkv):
    from .secure_prepass import attn_secure_sanitize_kv_kernel, key_weights_shape

    B = 2
    k = torch.empty(B, Hkv, S, hd, dtype=dtype)
    ks, vs = torch.empty_like(k), torch.empty_like(k)
    w = torch.empty(key_weights_shape(B, S), dtype=dtype)
    lens = torch.full((B,), S, dtype=torch.int32)
    _, args, ce = build_prepass_kv(k, k, ks, vs, w, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv,
                                   k_strides=k.stride()[:3], v_strides=k.stride()[:3])
    cfg = Config(PREPASS_BLOCK_S, PREPASS_BLOCK_S, PREPASS_WARPS, 1)
    return _spec_from_launch(f"secure_prepass_kv_{_ELT[dtype]}_d{hd}_s{S}_hkv{Hkv}", cfg, args, ce,
                             {"K", "V", "KS", "VS", "W", "SEQLENS_K"}, fn=attn_secure_sanitize_kv_kernel)


def _audit_spec(dtype, hd, causal, public_diag, S, Hq, Hkv, secure, varlen, arch):
    B = 2
    # Representative tensors: only dtype, alignment and strides matter to specialisation.
    def like(h, s):
        return torch.empty(B, h, s, hd, dtype=dtype).as_strided((B, h, s, hd), (h * s * hd, s * hd, hd, 1))
    q, k, v, o = like(Hq, S), like(Hkv, S), like(Hkv, S), like(Hq, S)
    lse = torch.empty(B, Hq, S, dtype=torch.float32)
    lens = torch.full((B,), S, dtype=torch.int32)
    if varlen:
        cu = torch.tensor([0, S, 2 * S], dtype=torch.int32)
        qv, kv, vv, ov = (t.reshape(B * S, t.shape[1], hd) if t.shape[2] == S else t for t in
                          (q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(),
                           v.transpose(1, 2).contiguous(), o.transpose(1, 2).contiguous()))
        qv, kv, vv, ov = (t.reshape(B * S, -1, hd) for t in (qv, kv, vv, ov))
        cfg, _, args, ce = build_launch(
            qv, kv, vv, ov, lse, seqlens_q=None, seqlens_k=None, cu_seqlens_q=cu, cu_seqlens_k=cu,
            scale=hd ** -0.5, causal=causal, secure=False, secure_public_diag=False, seqlen_q=S, seqlen_k=S,
            batch=B, num_heads_q=Hq, num_heads_kv=Hkv,
            q_strides=(0, qv.stride(1), qv.stride(0)), k_strides=(0, kv.stride(1), kv.stride(0)),
            v_strides=(0, vv.stride(1), vv.stride(0)), o_strides=(0, ov.stride(1), ov.stride(0)),
            lse_strides=(0, B * S), arch=arch)
    else:
        cfg, _, args, ce = build_launch(
            q, k, v, o, lse, seqlens_q=lens if secure else None, seqlens_k=lens if secure else None,
            cu_seqlens_q=None, cu_seqlens_k=None, scale=hd ** -0.5, causal=causal, secure=secure,
            secure_public_diag=public_diag, seqlen_q=S, seqlen_k=S, batch=B, num_heads_q=Hq, num_heads_kv=Hkv,
            q_strides=q.stride()[:3], k_strides=k.stride()[:3], v_strides=v.stride()[:3], o_strides=o.stride()[:3],
            lse_strides=(Hq * S, S), arch=arch)
    secret = {"Q", "K", "V"} | ({"SEQLENS_Q", "SEQLENS_K"} if secure else ({"CU_SEQLENS_Q", "CU_SEQLENS_K"} if varlen else set()))
    mode = ("causal_pubdiag" if public_diag else "causal") if causal else "full"
    name = (f"{'secure' if secure else 'fast'}_{_ELT[dtype]}_d{hd}_{mode}_s{S}_gqa{Hq // Hkv}"
            f"{'_varlen' if varlen else ''}_{cfg.block_m}x{cfg.block_n}w{cfg.num_warps}s{cfg.num_stages}")
    return _spec_from_launch(name, cfg, args, ce, secret)
