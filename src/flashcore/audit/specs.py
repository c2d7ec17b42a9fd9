"""The static audit's kernel list: every configuration flashcore launches, as compile specs built from the
kernels' own launch builders (``flashcore.launch``), so the audit compiles exactly what runs.

A spec is ``{name, fn, signature, constexprs, attrs, secret, num_warps, num_stages, maxnreg}``; its secret
parameters come from the kernel's declaration (``flashcore.kernels``, ``Capabilities.secrets``)."""
from __future__ import annotations

from dataclasses import replace

import torch

from .._checks import SECURE_PAGE_SIZES
from ..kernels import KERNELS, SM90_BWD, SM90_FWD, TRITON_DECODE, TRITON_DECODE_COMBINE, TRITON_FWD
from ..kernels.secure.prepass import (attn_secure_fill_rows_kernel, attn_secure_gather_v_padding_kernel,
                                      attn_secure_sanitize_kv_kernel, attn_secure_zero_v_padding_kernel)
from ..kernels.triton.fwd import attn_fwd_kernel
from ..launch.secure_prepass import (PREPASS_BLOCK_S, PREPASS_WARPS, build_fill_rows, build_prepass, build_prepass_kv,
                                     build_prepass_paged, key_weights_shape)
from ..launch.sm90_fwd import GluonLaunch, follows_prepass_pdl
from ..launch.triton_decode import COMBINE_STAGES, COMBINE_WARPS, DecodeShape, build_combine, build_split
from ..launch.triton_fwd import build_launch
from ..plan.decode import choose_config
from ..plan.knobs import gluon_switches
from ..plan import tables
from ..plan.select import triton_config
from ..plan.tables import Config
from ..problem import DTYPE_NAMES, Problem

_ELT = DTYPE_NAMES  # spec names use the capabilities' dtype names

# Public facts that select a different compiled kernel. The default audit covers each code path
# (dtype families, every BLOCK_D with even and masked head dims, head dims whose row stride is
# not a multiple of 16 bytes, GQA vs not, seqlen even/odd/not divisible by 16, each causal mode);
# ``full=True`` enumerates every supported head dim and all three dtypes.
_AUDIT_HEAD_DIMS = (8, 64, 72, 128, 256)
_AUDIT_SEQLENS = ((4096, 8, 8), (1000, 8, 2))  # (S, Hq, Hkv)
# The Gluon kernel's audited forms: (S, Hq, Hkv, return_lse). S=4096 takes three consumer warpgroups at
# D=64 non-causal (tables.gluon_ws); 1000 has a partial edge tile and two.
_AUDIT_GLUON = ((4096, 8, 8, False), (1000, 8, 2, True))
# The launcher's value specialisations: an integer argument equal to 1 is compiled in as a constant (a batch,
# head count, sequence length or tile count of 1), another binary that runs. One batch of one head of one
# token (the Gluon kernel: of one 64-row tile) makes every such argument 1 at once; the forms above cover
# the values that are not 1 (with and without divisibility by 16).
_AUDIT_ONES = dict(B=1, S=1, Hq=1, Hkv=1)
_AUDIT_ONES_GLUON_S = 64
# Secure mode's one-warpgroup Gluon layout at D=64 (plan.tables.ONE_WG_WORK, causal and not): (S, Hq, Hkv, return_lse,
# B), inside both ranges; the second has a partial edge tile and GQA.
_AUDIT_GLUON_ONE_WG = ((1024, 16, 16, False, 1), (1000, 16, 4, True, 2))
# Secure chunked prefill on the Gluon kernel (plan.prefill; a contiguous cache): (capacity, Hq, Hkv); the query count
# is the capacity too, so the tables' forms follow it: two consumer warpgroups, and at 2048 D=64 non-causal three
_AUDIT_PREFILL = ((1024, 32, 8), (2048, 16, 16))


def _spec_from_launch(name, cfg, args, constexprs, secret, fn):
    """Specialise the runtime arguments exactly as Triton's launcher does (ints equal to 1 become
    constexprs; pointers and ints divisible by 16 get ``tt.divisibility``)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

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
                secret=set(secret), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                maxnreg=getattr(cfg, "maxnreg", None))


def audit_specs(secure: bool, arch: tuple[int, int] = (9, 0), full: bool = False) -> list[dict]:
    """Every kernel configuration flashcore launches in this mode on ``arch`` (see above), for the SASS
    audit. On sm_90 the warp-specialised Gluon kernel (:func:`gluon_spec`) is listed too, in every
    form it launches in this mode (:data:`_AUDIT_GLUON`).

    Secrets (each kernel's declaration): the data behind q/k/v and, in secure mode, the true lengths; for
    the fast path the cumulative lengths of a varlen launch (its loop bounds depend on them)."""
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
                for S, Hq, Hkv in _AUDIT_SEQLENS:
                    specs.append(_audit_prepass_spec(dtype, hd, S, Hkv))
                    if dtype != torch.float32 and hd in (64, 128):  # the secure Gluon kernel's (non-causal)
                        specs.append(_audit_prepass_kv_spec(dtype, hd, S, Hkv))
                        if tables.is_hopper(arch) and _prepass_triggers():  # before the secure Gluon kernel
                            specs.append(_audit_prepass_kv_spec(dtype, hd, S, Hkv, pdl_trigger=True))
                            specs.append(_audit_prepass_spec(dtype, hd, S, Hkv, pdl_trigger=True))
                    specs.append(_audit_fill_rows_spec(dtype, hd, S, Hq))  # secure="strict", before either kernel
        if secure and _hd_ones(dtype):
            for hd in _hd_ones(dtype):
                B, S, Hq, Hkv = (_AUDIT_ONES[k] for k in ("B", "S", "Hq", "Hkv"))
                for causal, public_diag in modes:
                    specs.append(_audit_spec(dtype, hd, causal, public_diag, S, Hq, Hkv, secure, False, arch, B=B))
                specs.append(_audit_prepass_spec(dtype, hd, S, Hkv, B=B))
                if dtype != torch.float32:
                    specs.append(_audit_prepass_kv_spec(dtype, hd, S, Hkv, B=B))
                    if tables.is_hopper(arch) and _prepass_triggers():
                        specs.append(_audit_prepass_kv_spec(dtype, hd, S, Hkv, B=B, pdl_trigger=True))
                        specs.append(_audit_prepass_spec(dtype, hd, S, Hkv, B=B, pdl_trigger=True))
                specs.append(_audit_fill_rows_spec(dtype, hd, S, Hq, B=B))
    specs += decode_specs(secure, full=full)
    if tables.is_hopper(arch):
        for dtype in (torch.bfloat16, torch.float16):
            for hd in SM90_FWD.head_dims:
                for causal in (False, True):
                    forms = list(_AUDIT_GLUON)
                    if secure and dtype == torch.bfloat16:
                        forms.append((_AUDIT_ONES_GLUON_S, 1, 1, False))
                    # secure causal: V's padding in the kernel or by the pre-pass, both (the planner takes one by
                    # size, the secure_in_kernel_padding switch either)
                    paddings = (True, False) if secure and causal else (None,)
                    # secure causal: the public diagonal (self-attention) and the secret one (explicit query lengths)
                    diagonals = (False, True) if secure and causal else (False,)
                    for S, Hq, Hkv, lse in forms:
                        cfg = (tables.gluon_secure if secure else tables.gluon_ws)(hd, S, causal)
                        for sanitise in paddings:
                            for secret_diag in diagonals:
                                specs += _with_pdl_form(hd, causal, dtype, S, Hq, Hkv, lse, cfg=cfg, secure=secure,
                                                        B=1 if Hq == 1 else 2, sanitise=sanitise,
                                                        secret_diag=secret_diag)
                    for S, Hq, Hkv, lse, B in (_AUDIT_GLUON_ONE_WG if secure and hd == 64 else ()):
                        cfg = tables.hopper(hd, 2, causal, True, S, S, B * Hq)
                        assert cfg == tables.gluon_one_wg(), cfg  # the list follows the table
                        for sanitise in paddings:
                            for secret_diag in diagonals:
                                specs += _with_pdl_form(hd, causal, dtype, S, Hq, Hkv, lse, cfg=cfg, secure=True, B=B,
                                                        sanitise=sanitise, secret_diag=secret_diag)
                    for S, Hq, Hkv in (_AUDIT_PREFILL if secure else ()):
                        if S > 1024 and (hd != 64 or causal):  # (the same form as at 1024)
                            continue
                        for page in (0, *SECURE_PAGE_SIZES):  # a contiguous cache, then each paged form
                            specs.append(gluon_spec(hd, causal, dtype, S, Hq, Hkv, True, secure=True, key_lens=True,
                                                    page_size=page))
                        # V from the V pre-pass (plan.prefill.uses_v_prepass; the planner's choice, the
                        # secure_prefill_v switch either), a contiguous cache and each paged form, and that pre-pass over
                        # the cache's layout or through the page table
                        for page in (0, *SECURE_PAGE_SIZES):
                            specs.append(gluon_spec(hd, causal, dtype, S, Hq, Hkv, True, secure=True, key_lens=True,
                                                    page_size=page, v_prepass=True))
                        if not causal:
                            specs.append(_audit_prepass_spec(dtype, hd, S, Hkv, cache_layout=True))
                            for page in SECURE_PAGE_SIZES:
                                specs.append(_audit_paged_prepass_spec(dtype, hd, S, Hkv, page))
    return specs


def _with_pdl_form(*args, **kw) -> list[dict]:
    """:func:`gluon_spec` launched after its pre-pass completes, and, in secure mode where a pre-pass comes first, as
    its programmatic dependent too: the planner takes one by size (``plan.tables.secure_prepass_pdl``), the
    ``secure_pdl`` switch either."""
    plain = gluon_spec(*args, pdl_wait=False, **kw)
    if not kw.get("secure") or plain["constexprs"]["SANITISE"] or not _prepass_triggers():
        return [plain]
    return [plain, gluon_spec(*args, pdl_wait=True, **kw)]


def _hd_ones(dtype) -> tuple[int, ...]:
    """Head dims of the all-ones specialisation forms (see _AUDIT_ONES): the BLOCK_D families at bf16, one at fp32."""
    return (64, 128) if dtype == torch.bfloat16 else (128,) if dtype == torch.float32 else ()


def gluon_spec(head_dim: int, causal: bool, dtype=torch.bfloat16, S: int = 4096, Hq: int = 8, Hkv: int = 8,
               return_lse: bool = False, cfg=None, secure: bool = False, switches=None, B: int = 2,
               key_lens: bool = False, page_size: int = 0, sanitise: bool | None = None,
               secret_diag: bool = False, pdl_wait: bool | None = None, v_prepass: bool = False) -> dict:
    """The Gluon Hopper kernel as launched for these public facts, as a compile spec like
    :func:`audit_specs`' (plus ``maxnreg``); built from CPU tensors, no GPU needed. ``secure``: the
    constant-time kernel (secret: the data behind the descriptors and the lengths). ``switches``: the
    kernel's switches (``plan.knobs.GluonSwitches``; default: the current ones). ``key_lens``: the form with
    per-sequence key lengths (``plan.prefill``; secret in secure mode); ``page_size``: that form reading a paged cache
    of this page size (``S`` keys per sequence, B * S / page_size pages); ``sanitise``: the secure causal form that
    writes V's padding in the kernel (no pre-pass; the key lengths secret too); None: as the planner chooses
    (``plan.tables.secure_padding_in_kernel``); ``secret_diag``: the secure causal form whose diagonal is secret
    (explicit query lengths: every key tile, each masked with both secret lengths); ``pdl_wait``: the secure form
    launched as the programmatic dependent of its pre-pass (None: as the planner chooses,
    ``launch.sm90_fwd.follows_prepass_pdl``); ``v_prepass``: the secure ``key_lens`` form whose V comes from the V
    pre-pass's contiguous copy, K contiguous or paged (``plan.prefill.uses_v_prepass``)."""
    q, k = torch.empty(B, Hq, S, head_dim, dtype=dtype), torch.empty(B, Hkv, S, head_dim, dtype=dtype)
    v, table = k, None
    if page_size:  # [num_pages, Hkv, page_size, D] views of a [num_pages, page_size, Hkv, D] cache, and its table
        k = torch.empty(B * S // page_size, page_size, Hkv, head_dim, dtype=dtype).transpose(1, 2)
        table = torch.zeros(B, S // page_size, dtype=torch.int32)
        v = v if v_prepass else k  # (v_prepass: V is the pre-pass's contiguous copy, paged cache or not)
    lse = torch.empty(B, Hq, S, dtype=torch.float32) if return_lse else None
    cfg = cfg or (tables.gluon_secure if secure and not key_lens else tables.gluon_ws)(head_dim, S, causal)
    if sanitise is None:
        sanitise = secure and causal and not key_lens and tables.secure_padding_in_kernel(cfg, B * Hq * S * S,
                                                                                          secret_diag)
    launch = GluonLaunch(q, k, v, q, lse, scale=head_dim ** -0.5, causal=causal, seqlen_q=S, seqlen_k=S, batch=B,
                         num_heads_q=Hq, num_heads_kv=Hkv, lse_strides=(Hq * S, S), cfg=cfg, secure=secure,
                         switches=switches, key_lens=key_lens, page_size=page_size,
                         table_stride=table.stride(0) if table is not None else 0, sanitise=sanitise,
                         secret_diag=secret_diag,
                         pdl_wait=follows_prepass_pdl(secure, key_lens, sanitise, B * Hq * S * S, switches)
                         if pdl_wait is None else pdl_wait, v_prepass=v_prepass)
    step = launch.step
    lens = torch.full((B,), S, dtype=torch.int32)
    w = torch.empty(launch.key_weights_shape, dtype=dtype) if launch.key_weights_shape else None
    args = [*launch.descriptors(q, k, v, q, w), lse if lse is not None else q, lens, table,
            lens if sanitise or secret_diag else None, *step.scalars]
    # secure: the key weights and the lengths are secret too (the query lengths; with key_lens the key lengths)
    mode = "secure" if secure else "fast"
    form = (f"_keylens{f'_page{page_size}' if page_size else ''}{'_vprepass' if v_prepass else ''}") if key_lens \
        else "_sanitise" if sanitise else ""
    diagonal = "causal_secretdiag" if secret_diag else "causal" if causal else "full"
    name = (f"{mode}_gluon_ws_{_ELT[dtype]}_d{head_dim}_{diagonal}_s{S}_gqa{Hq // Hkv}"
            f"{'_lse' if return_lse else ''}{'_b1' if B == 1 else ''}_{cfg.block_m // 64}wg{form}"
            f"{'_pdl' if step.constexprs['PDL_WAIT'] else ''}")
    spec = _spec_from_launch(name, cfg, args, step.constexprs, SM90_FWD.secrets(secure), fn=step.fn)
    spec["num_stages"] = 1
    spec["maxnreg"] = step.options["maxnreg"]
    return spec


def hopper_dkdv_spec(head_dim: int, causal: bool, form=None, dtype=torch.bfloat16, S: int = 4096, Hq: int = 8,
                     Hkv: int = 2, B: int = 2, fused_dq: bool = False, ordered_dq: bool = False) -> dict:
    """The Hopper backward's Gluon dK/dV kernel as the backward launches it (``form``: its (query tile, key tile,
    warps, ring depth); default the planner's row), as a compile spec like :func:`gluon_spec`'s; built from CPU
    tensors, no GPU needed. Not in the audit's list: the backward has no secure form. ``ordered_dq``: the fused form's
    deterministic order (a program per K/V head)."""
    from ..launch.sm90_bwd import HopperDkdvLaunch
    from ..plan.backward import GLUON_DKDV

    bm, bn, warps, stages = form or GLUON_DKDV[head_dim]
    q, k = torch.empty(B, Hq, S, head_dim, dtype=dtype), torch.empty(B, Hkv, S, head_dim, dtype=dtype)
    ws = torch.empty(B, Hq, -(-S // bm) * bm, dtype=torch.float32)
    dq = torch.empty(q.shape, dtype=torch.float32) if fused_dq else None
    # the fused form with GQA adds dK/dV into fp32 buffers (one program per query head)
    split = fused_dq and Hq > Hkv and not ordered_dq
    dkv = torch.empty(k.shape, dtype=torch.float32) if split else k
    launch = HopperDkdvLaunch(q, k, k, q, dkv, dkv, tuple(ws.shape), seqlen_q=S, seqlen_k=S, scale=head_dim ** -0.5,
                              qk_scale=0.1, causal=causal, block_m=bm, block_n=bn, num_warps=warps, stages=stages,
                              dq_accum=dq, split_group=split, dq_ordered=ordered_dq)
    step = launch.step
    turns = torch.empty(launch.turns_size, dtype=torch.int32) if ordered_dq else dkv
    args = [*launch.descriptors(q, k, k, q, ws, ws, dq), dkv, dkv, dq if fused_dq else k, turns, *step.scalars]
    name = (f"fast_gluon_bwd_dkdv_{_ELT[dtype]}_d{head_dim}_{'causal' if causal else 'full'}"
            f"_{bm}x{bn}w{warps}s{stages}{'_dq' if fused_dq else ''}{'_ordered' if ordered_dq else ''}"
            f"{'_gqa' if split else ''}")
    spec = _spec_from_launch(name, step, args, step.constexprs, SM90_BWD.secrets(), fn=step.fn)
    spec["num_stages"] = 1
    spec["maxnreg"] = step.options["maxnreg"]
    return spec


def _prepass_triggers() -> bool:
    """Whether the pre-passes before the secure Gluon kernel may let it launch as they start (the ``secure_pdl``
    switch not "off": the planner takes that form by size, ``launch.sm90_fwd.follows_prepass_pdl``)."""
    return gluon_switches().secure_pdl != "off"


def _audit_prepass_spec(dtype, hd, S, Hkv, B=2, pdl_trigger=False, cache_layout=False):
    """The V pre-pass: before the secure Triton kernel (no trigger), and with ``pdl_trigger`` before the secure
    Gluon kernel's causal form (which is its programmatic dependent). ``cache_layout``: over a KV cache's V,
    ``[B, S, Hkv, D]`` viewed as ``[B, Hkv, S, D]``, before secure chunked prefill (``plan.prefill``)."""
    v = torch.empty(B, S, Hkv, hd, dtype=dtype).transpose(1, 2) if cache_layout else torch.empty(B, Hkv, S, hd,
                                                                                                   dtype=dtype)
    vs = torch.empty(B, Hkv, S, hd, dtype=dtype)
    lens = torch.full((B,), S, dtype=torch.int32)
    _, args, ce = build_prepass(v, vs, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv, v_strides=v.stride()[:3],
                                pdl_trigger=pdl_trigger)
    cfg = Config(PREPASS_BLOCK_S, PREPASS_BLOCK_S, PREPASS_WARPS, 1)
    return _spec_from_launch(f"secure_prepass_{_ELT[dtype]}_d{hd}_s{S}_hkv{Hkv}{'_b1' if B == 1 else ''}"
                             f"{'_pdl' if pdl_trigger else ''}{'_cache' if cache_layout else ''}", cfg, args, ce,
                             KERNELS["secure_prepass_v"].secrets(), fn=attn_secure_zero_v_padding_kernel)


def _audit_paged_prepass_spec(dtype, hd, S, Hkv, page, B=2):
    """The V pre-pass through a paged cache's page table (secure chunked prefill's V_PREPASS form, ``plan.prefill``):
    a binary per page size."""
    v = torch.empty(B * S // page + 1, page, Hkv, hd, dtype=dtype)
    vs = torch.empty(B, Hkv, S, hd, dtype=dtype)
    lens = torch.full((B,), S, dtype=torch.int32)
    table = torch.zeros(B, S // page, dtype=torch.int32)
    _, args, ce = build_prepass_paged(v, vs, lens, table, seqlen_k=S, batch=B, num_heads_kv=Hkv, page_size=page,
                                      table_stride=table.stride(0))
    cfg = Config(PREPASS_BLOCK_S, PREPASS_BLOCK_S, PREPASS_WARPS, 1)
    return _spec_from_launch(f"secure_prepass_paged{page}_{_ELT[dtype]}_d{hd}_s{S}_hkv{Hkv}", cfg, args, ce,
                             KERNELS["secure_prepass_paged_v"].secrets(), fn=attn_secure_gather_v_padding_kernel)


def _audit_prepass_kv_spec(dtype, hd, S, Hkv, B=2, pdl_trigger=False):
    k = torch.empty(B, Hkv, S, hd, dtype=dtype)
    ks, vs = torch.empty_like(k), torch.empty_like(k)
    w = torch.empty(key_weights_shape(B, S), dtype=dtype)
    lens = torch.full((B,), S, dtype=torch.int32)
    _, args, ce = build_prepass_kv(k, k, ks, vs, w, lens, seqlen_k=S, batch=B, num_heads_kv=Hkv,
                                   k_strides=k.stride()[:3], v_strides=k.stride()[:3], pdl_trigger=pdl_trigger)
    cfg = Config(PREPASS_BLOCK_S, PREPASS_BLOCK_S, PREPASS_WARPS, 1)
    return _spec_from_launch(f"secure_prepass_kv_{_ELT[dtype]}_d{hd}_s{S}_hkv{Hkv}{'_b1' if B == 1 else ''}"
                             f"{'_pdl' if pdl_trigger else ''}", cfg, args, ce,
                             KERNELS["secure_prepass_kv"].secrets(), fn=attn_secure_sanitize_kv_kernel)


def _audit_spec(dtype, hd, causal, public_diag, S, Hq, Hkv, secure, varlen, arch, B=2):
    # Representative tensors: only dtype, alignment and strides matter to specialisation.
    def like(h, s):
        return torch.empty(B, h, s, hd, dtype=dtype).as_strided((B, h, s, hd), (h * s * hd, s * hd, hd, 1))
    q, k, v, o = like(Hq, S), like(Hkv, S), like(Hkv, S), like(Hq, S)
    lse = torch.empty(B, Hq, S, dtype=torch.float32)
    lens = torch.full((B,), S, dtype=torch.int32)
    problem = Problem.dense(q, k, v, o, causal=causal, scale=hd ** -0.5, layout="bhsd", secure=secure,
                            self_attention=public_diag, return_lse=True)
    # the Triton kernel's own table configuration for these facts on ``arch`` (where the table prefers the
    # Gluon kernel, this is the form that runs when the Gluon kernel cannot)
    cfg = triton_config(_on_arch(problem, arch))
    if varlen:
        cu = torch.tensor([0, S, 2 * S], dtype=torch.int32)
        qv, kv, vv, ov = (t.transpose(1, 2).contiguous().reshape(B * S, -1, hd) for t in (q, k, v, o))
        cfg, _, args, ce = build_launch(
            qv, kv, vv, ov, lse, seqlens_q=None, seqlens_k=None, cu_seqlens_q=cu, cu_seqlens_k=cu,
            scale=hd ** -0.5, causal=causal, secure=False, secure_public_diag=False, seqlen_q=S, seqlen_k=S,
            batch=B, num_heads_q=Hq, num_heads_kv=Hkv,
            q_strides=(0, qv.stride(1), qv.stride(0)), k_strides=(0, kv.stride(1), kv.stride(0)),
            v_strides=(0, vv.stride(1), vv.stride(0)), o_strides=(0, ov.stride(1), ov.stride(0)),
            lse_strides=(0, B * S), config=cfg)
    else:
        cfg, _, args, ce = build_launch(
            q, k, v, o, lse, seqlens_q=lens if secure else None, seqlens_k=lens if secure else None,
            cu_seqlens_q=None, cu_seqlens_k=None, scale=hd ** -0.5, causal=causal, secure=secure,
            secure_public_diag=public_diag, seqlen_q=S, seqlen_k=S, batch=B, num_heads_q=Hq, num_heads_kv=Hkv,
            q_strides=q.stride()[:3], k_strides=k.stride()[:3], v_strides=v.stride()[:3], o_strides=o.stride()[:3],
            lse_strides=(Hq * S, S), config=cfg)
    secret = TRITON_FWD.secrets(secure=secure, varlen=varlen and not secure)
    mode = ("causal_pubdiag" if public_diag else "causal") if causal else "full"
    name = (f"{'secure' if secure else 'fast'}_{_ELT[dtype]}_d{hd}_{mode}_s{S}_gqa{Hq // Hkv}"
            f"{'_varlen' if varlen else ''}{'_b1' if B == 1 else ''}_{cfg.block_m}x{cfg.block_n}w{cfg.num_warps}"
            f"s{cfg.num_stages}")
    return _spec_from_launch(name, cfg, args, ce, secret, fn=attn_fwd_kernel)


def _on_arch(problem: Problem, arch) -> Problem:
    return replace(problem, arch=tuple(arch) if arch is not None else None)


# The KV-cache kernels' audited forms: (cache, page size); the fast path's page sizes 1 and 16 take the per-key page
# gather, 128 one page per 128-key tile; secure mode (plan.decode.choose_config) takes tiles of at most one page and 64
# keys at one split, the per-key gather with splits; "rows" reads a contiguous cache through cache_batch_idx,
# "leftpad" with cache_leftpad.
_AUDIT_DECODE_CACHES = (("paged", 1), ("paged", 16), ("paged", 128), ("contiguous", 0), ("rows", 0), ("leftpad", 0))
# every page size secure mode accepts (_checks.SECURE_PAGE_SIZES; each page size is a constexpr, its own binary)
_SECURE_DECODE_CACHES = (("paged", 16), ("paged", 32), ("paged", 64), ("paged", 128), ("paged", 256), ("contiguous", 0),
                         ("rows", 0), ("leftpad", 0))
# (q dtype, cache dtype, head dims): bf16 over the BLOCK_D families (72: a masked head dim), the others at 128
_AUDIT_DECODE_DTYPES = ((torch.bfloat16, torch.bfloat16, (64, 72, 128, 256)), (torch.float32, torch.float32, (128,)),
                        (torch.bfloat16, torch.float8_e4m3fn, (128,)), (torch.float16, torch.float8_e4m3fn, (128,)))
# (Sq, causal, splits): one split (the output written directly), several (workspace + combine)
_AUDIT_DECODE_FORMS = ((1, True, 1), (1, True, 7), (4, False, 3))
# the fast path's chunked-prefill form too: 128-row query tiles and the unmasked loop (launch.triton_decode.full_tiles)
_AUDIT_DECODE_FAST_FORMS = _AUDIT_DECODE_FORMS + ((64, True, 1),)
# secure mode with more query tokens: 32- and 64-row tiles (Sq 8 and 16 at the list's 4 query heads per K/V head)
_AUDIT_DECODE_SECURE_FORMS = _AUDIT_DECODE_FORMS + ((8, False, 3), (16, True, 1))


def decode_specs(secure: bool, full: bool = False) -> list[dict]:
    """The KV-cache kernels (split and combine) as launched from public shapes (``plan.decode.choose_config``).
    Secret: the data behind q and the caches and, in secure mode, ``cache_seqlens``/``cache_leftpad``. The fast
    path's list is the bf16 D=128 subset (its findings are reported, never fatal)."""
    specs, names = [], set()
    for q_dtype, cache_dtype, dims in _AUDIT_DECODE_DTYPES:
        if not secure and (q_dtype, cache_dtype) != (torch.bfloat16, torch.bfloat16):
            continue
        for hd in (tuple(range(8, 257, 8)) if full else dims if secure else (128,)):
            for cache, page in (_SECURE_DECODE_CACHES if secure else _AUDIT_DECODE_CACHES):
                for Sq, causal, splits in (_AUDIT_DECODE_SECURE_FORMS if secure else _AUDIT_DECODE_FAST_FORMS):
                    for spec in _decode_specs(q_dtype, cache_dtype, hd, cache, page, Sq, causal, splits, secure):
                        if spec["name"] not in names:  # the combine step is shared by every cache form
                            names.add(spec["name"])
                            specs.append(spec)
    if secure:
        for spec in _seen_by_load_variant_specs():
            if spec["name"] not in names:
                names.add(spec["name"])
                specs.append(spec)
    return specs


# V's select from loaded tensors (launch.triton_decode.seen_by_load) is a form of its own for every constexpr the
# launch sets: beside the list's forms above (Sq 1, causal, 4 query heads per K/V head, lse, K and V with the same
# strides, bf16 q), each of the others the planner gives it: no lse (the API's default), non-causal, 2 and 4 query
# tokens, 1 and 8 query heads per K/V head, an fp16 q and cache, V with strides of its own
# (v48, the hoisted loop: every layout it runs on, pages 32-256 and rows included; 2 and 16 query heads per K/V head;
# a capacity that is not whole tiles (masked copies), and the same with splits (a capacity the launcher does not mark
# divisible by 16); v49: with splits, where the loop is hoisted and V's select is from loaded tensors, each key's
# position read every tile for a 16-bit cache, the constexprs varied one at a time)
_SEEN_BY_LOAD_CACHES = (("contiguous", 0, torch.bfloat16), ("paged", 16, torch.bfloat16), ("paged", 32, torch.bfloat16),
                        ("paged", 64, torch.bfloat16), ("paged", 128, torch.bfloat16), ("paged", 256, torch.bfloat16),
                        ("rows", 0, torch.bfloat16), ("leftpad", 0, torch.bfloat16),
                        ("contiguous", 0, torch.float8_e4m3fn))
_SEEN_BY_LOAD_VARIANTS = (dict(return_lse=False), dict(causal=False), dict(Sq=2), dict(Sq=4, causal=False),
                          dict(Hq=2), dict(Hq=4), dict(Hq=16), dict(Hq=32), dict(q_dtype=torch.float16),
                          dict(same_kv=False), dict(capacity=1000), dict(capacity=1000, splits=7),
                          # v49: the hoisted split forms (V's select from loaded tensors with splits), the same way
                          dict(splits=7), dict(splits=7, return_lse=False), dict(splits=7, causal=False),
                          dict(splits=7, Sq=2), dict(splits=7, Hq=2), dict(splits=7, Hq=32),
                          dict(splits=7, q_dtype=torch.float16), dict(splits=7, same_kv=False))


def _seen_by_load_variant_specs() -> list[dict]:
    specs = []
    for cache, page, cache_dtype in _SEEN_BY_LOAD_CACHES:
        for v in _SEEN_BY_LOAD_VARIANTS:
            kw = dict(dict(q_dtype=torch.bfloat16, Sq=1, causal=True, splits=1), **v)
            if cache_dtype != torch.bfloat16 and kw["q_dtype"] == torch.float16 and "q_dtype" in v:
                continue  # the FP8 cache's fp16 q is in the main list
            if "capacity" in v and cache == "paged":
                continue  # a paged capacity is whole pages
            q_dtype = kw.pop("q_dtype")
            cd = torch.float16 if (q_dtype == torch.float16 and cache_dtype == torch.bfloat16) else cache_dtype
            specs += _decode_specs(q_dtype, cd, 128, cache, page, kw.pop("Sq"), kw.pop("causal"), kw.pop("splits"),
                                   True, **kw)
    return specs


def _decode_specs(q_dtype, cache_dtype, hd, cache, page, Sq, causal, splits, secure, Hq=8, return_lse=True,
                  same_kv=True, capacity=1024) -> list[dict]:
    B, Hkv = 2, 2
    paged = cache == "paged"
    q = torch.empty(B, Sq, Hq, hd, dtype=q_dtype)
    if paged:
        kc = torch.empty(B * capacity // page + 1, page, Hkv, hd, dtype=cache_dtype)
    else:
        kc = torch.empty(B + 1, capacity, Hkv, hd, dtype=cache_dtype)
    # V with strides of its own: a view into a buffer with a wider head axis (the row stride differs from K's)
    vc = kc if same_kv else torch.empty(*kc.shape[:-2], Hkv + 1, hd, dtype=cache_dtype)[..., :Hkv, :]
    fp8 = cache_dtype == torch.float8_e4m3fn
    shape = DecodeShape(batch=B, seqlen_q=Sq, num_heads_q=Hq, num_heads_kv=Hkv, head_dim=hd,
                        page_size=page if paged else capacity, capacity=capacity, num_pages=kc.shape[0], paged=paged,
                        packed=False, appended=False, has_batch_idx=cache == "rows", has_leftpad=cache == "leftpad",
                        causal=causal, secure=secure, fp8=fp8, return_lse=return_lse, fp32=q_dtype == torch.float32,
                        scale=hd ** -0.5)
    cfg = choose_config(shape, splits, torch.device("cpu"))
    table = torch.empty(B, capacity // max(page, 1), dtype=torch.int32) if paged else None
    fn, _, args, ce = build_split(shape, cfg, q, kc, vc, q, table.stride(0) if paged else 0)
    i32 = torch.empty(B + 1, dtype=torch.int32)
    f32 = torch.empty(4096, dtype=torch.float32)
    descale = torch.empty(B, Hkv, dtype=torch.float32)
    ptrs = [q, kc, vc, q, f32, f32, f32, i32, table if paged else i32, i32, i32, i32, descale, descale, i32]
    mode = "secure" if secure else "fast"
    variant = (f"{'' if Hq == 8 else f'_g{Hq // Hkv}'}{'' if return_lse else '_nolse'}"
               f"{'' if same_kv else '_vstrides'}{'' if capacity == 1024 else f'_cap{capacity}'}")
    name = (f"{mode}_decode_{_ELT.get(cache_dtype, 'fp8')}_q{_ELT[q_dtype]}_d{hd}_{cache}{page or ''}_sq{Sq}"
            f"{'_causal' if causal else ''}{variant}_splits{cfg.num_splits}_{cfg.block_m}x{cfg.block_n}"
            f"w{cfg.num_warps}s{cfg.num_stages}")
    specs = [_spec_from_launch(name, cfg, ptrs + list(args), ce, TRITON_DECODE.secrets(secure=secure), fn=fn)]
    if secure and ce["SEEN_BY_LOAD"]:
        # V's select on scalars at the same tiles (launch.triton_decode.seen_by_load), launchable with the audit knob
        # FLASHCORE_SECURE_V_SEEN=scalars
        fn, _, args, ce2 = build_split(shape, replace(cfg, seen_by_load=False), q, kc, vc, q,
                                       table.stride(0) if paged else 0)
        specs.append(_spec_from_launch(f"{name}_vscalars", cfg, ptrs + list(args), ce2,
                                       TRITON_DECODE.secrets(secure=secure), fn=fn))
    if secure and ce["HOISTED"]:
        # the key loop as before v48 at the same tiles (launch.triton_decode.hoisted), launchable with the audit knob
        # FLASHCORE_SECURE_HOISTED=off
        fn, _, args, ce3 = build_split(shape, replace(cfg, hoisted=False), q, kc, vc, q,
                                       table.stride(0) if paged else 0)
        specs.append(_spec_from_launch(f"{name}_unhoisted", cfg, ptrs + list(args), ce3,
                                       TRITON_DECODE.secrets(secure=secure), fn=fn))
        if ce3["SEEN_BY_LOAD"]:  # both knobs (FLASHCORE_SECURE_V_SEEN=scalars as well)
            fn, _, args, ce4 = build_split(shape, replace(cfg, hoisted=False, seen_by_load=False), q, kc, vc, q,
                                           table.stride(0) if paged else 0)
            specs.append(_spec_from_launch(f"{name}_unhoisted_vscalars", cfg, ptrs + list(args), ce4,
                                           TRITON_DECODE.secrets(secure=secure), fn=fn))
    if cfg.num_splits > 1:
        fn, _, args, ce = build_combine(shape, cfg, q, q, pdl=True)  # as launched on sm_90 (plan.decode.combine_pdl)
        name = f"{mode}_decode_combine_{_ELT[q_dtype]}_d{hd}_sq{Sq}_g{Hq // Hkv}"
        specs.append(_spec_from_launch(name, replace(cfg, num_warps=COMBINE_WARPS, num_stages=COMBINE_STAGES),
                                       [f32, f32, q, f32, i32]
                                       + list(args), ce, TRITON_DECODE_COMBINE.secrets(secure=secure), fn=fn))
    return specs


def _audit_fill_rows_spec(dtype, hd, S, H, B=2):
    """The secure row fill (Q's padding; K's in the causal form), as launched on a [B, H, S, D] tensor."""
    x = torch.empty(B, H, S, hd, dtype=dtype)
    xs = torch.empty_like(x)
    lens = torch.full((B,), S, dtype=torch.int32)
    _, args, ce = build_fill_rows(x, xs, lens, seqlen=S, batch=B, num_heads=H, x_strides=x.stride()[:3])
    cfg = Config(PREPASS_BLOCK_S, PREPASS_BLOCK_S, PREPASS_WARPS, 1)
    return _spec_from_launch(f"secure_fill_rows_{_ELT[dtype]}_d{hd}_s{S}_h{H}{'_b1' if B == 1 else ''}", cfg, args, ce,
                             KERNELS["secure_fill_rows"].secrets(), fn=attn_secure_fill_rows_kernel)
