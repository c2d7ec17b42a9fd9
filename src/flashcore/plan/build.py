"""A :class:`Plan`: the ordered steps of one call and the workspace they need, built once per plan key
from the :class:`~flashcore.problem.Problem` and the :func:`~flashcore.plan.select.select` choice, and
replayed on every call with the same key."""
from __future__ import annotations

import torch

from .._checks import check_secure_lengths
from ..launch.secure_prepass import SecureRowFill, fill_rows, prepass_kv, prepass_v
from ..launch.sm90_fwd import GluonLaunch, follows_prepass_pdl
from ..launch.triton_fwd import TritonForward, pointer_args
from ..problem import Problem
from .knobs import SecurePadding, gluon_switches, secure_padding
from ..runtime.launcher import capturing
from .select import SM90, Selection, select
from .tables import secure_padding_in_kernel


class Plan:
    """Replayable on tensors with the metadata of its key: calling it returns ``(out, lse or None)``.

    Steps, in order: the secure pre-pass (secure mode; it writes the plan's :attr:`workspace`), then the
    main kernel. q/k/v/out are the caller's tensors in the caller's layout (only their pointers are read:
    strides were fixed when the plan was made)."""
    __slots__ = ("problem", "selection", "prepass", "main", "out_shape", "lse_shape", "validate", "check_cu",
                 "fill_q", "fill_k")

    def __init__(self, problem: Problem, selection: Selection, prepass, main, out_shape, lse_shape, validate: bool,
                 fill_q=None, fill_k=None):
        self.problem, self.selection, self.prepass, self.main = problem, selection, prepass, main
        self.out_shape, self.lse_shape, self.validate = out_shape, lse_shape, validate
        self.check_cu = None
        self.fill_q, self.fill_k = fill_q, fill_k  # secure: Q's / K's padding rows replaced (SecureRowFill)

    @property
    def steps(self) -> tuple:
        return tuple(s for s in (self.fill_q, self.fill_k, self.prepass, self.main) if s is not None)

    @property
    def workspace(self) -> tuple:
        """(name, shape) of each buffer the steps need beside the caller's (q's dtype)."""
        return tuple(w for s in self.steps[:-1] for w in s.workspace)

    def __call__(self, q, k, v, seqlens_q=None, seqlens_k=None, out=None, cu_seqlens_q=None, cu_seqlens_k=None):
        device = q.device
        if device.type == "cuda" and device.index != torch.cuda.current_device():
            # Launch on the tensors' own device (Triton launches on the current one), and allocate there.
            with torch.cuda.device(device):
                return self._run(q, k, v, seqlens_q, seqlens_k, out, cu_seqlens_q, cu_seqlens_k)
        return self._run(q, k, v, seqlens_q, seqlens_k, out, cu_seqlens_q, cu_seqlens_k)

    def _run(self, q, k, v, seqlens_q, seqlens_k, out, cu_seqlens_q, cu_seqlens_k):
        device = q.device
        if out is None:
            out = torch.empty(self.out_shape, dtype=q.dtype, device=device)
        lse = None if self.lse_shape is None else torch.empty(self.lse_shape, dtype=torch.float32, device=device)
        end_q = None  # varlen: where the last query sequence ends (None: unknown on the host)
        if self.problem.secure:
            if seqlens_q is None:
                seqlens_q = seqlens_k  # self-attention: the query lengths are the key lengths
            if self.validate and not capturing(device):
                check_secure_lengths(seqlens_q, seqlens_k, self.problem.seqlen_q, self.problem.seqlen_k)
        elif self.check_cu is not None and not capturing(device):
            end_q = self.check_cu(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], self.problem.seqlen_q,
                                  self.problem.seqlen_k)
        w = None
        if self.fill_q is not None:
            q = self.fill_q.run(q, seqlens_q)
        if self.fill_k is not None:
            k = self.fill_k.run(k, seqlens_k)
        if isinstance(self.prepass, SecureRowFill):  # the causal form's V (fill_k)
            v = self.prepass.run(v, seqlens_k)
        elif self.prepass is not None:
            k, v, w = self.prepass.run(k, v, seqlens_k)
        self.main.run(pointer_args(q, k, v, out, lse, (seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k), dummy=q),
                      device, w)
        if self.problem.varlen:
            clear_unowned_rows(out, lse, cu_seqlens_q, end_q)
        return out, lse


def clear_unowned_rows(out, lse, cu_seqlens_q, end_q) -> None:
    """Rows of a packed q past ``cu_seqlens_q[-1]`` belong to no sequence, and no kernel program writes
    them: give them the value of a row that sees no key (output 0, lse -inf), as the reference does, never
    leftover memory. Eager calls know where the sequences end (the host check read it): clear just the tail.
    Under CUDA-graph capture the end is device data: a masked select over all rows (one extra pass)."""
    total = out.shape[0]
    if end_q is not None:
        if end_q < total:
            out[end_q:].zero_()
            if lse is not None:
                lse[:, end_q:].fill_(float("-inf"))
        return
    unowned = torch.arange(total, device=out.device) >= cu_seqlens_q[-1]
    out.masked_fill_(unowned.view(-1, *([1] * (out.dim() - 1))), 0)
    if lse is not None:
        lse.masked_fill_(unowned.view(1, -1), float("-inf"))


def build(problem: Problem, q, k, v, o, lse, *, seqlens_q=None, seqlens_k=None, cu_seqlens_q=None,
          cu_seqlens_k=None, lse_strides, out_shape, validate: bool = True, config=None) -> Plan:
    """The plan for ``problem``; q/k/v/o are [B, H, S, D] views (varlen: the packed tensors) and ``lse``
    a representative lse buffer or None. ``config`` (benchmarks, sweeps) replaces the table's choice."""
    sel = select(problem, config)
    cfg = sel.config
    p = problem
    if p.secure and seqlens_q is None:
        seqlens_q = seqlens_k
    kw = dict(scale=p.scale, causal=p.causal, seqlen_q=p.seqlen_q, seqlen_k=p.seqlen_k, batch=p.batch,
              num_heads_q=p.num_heads_q, num_heads_kv=p.num_heads_kv, lse_strides=lse_strides)
    prepass = fill_q = fill_k = None
    # Q's and K's padding rows replaced by data-like stand-ins (copies): secure="strict", or the audit knob
    pad = secure_padding() if p.secure else None
    strict_q = p.secure and (p.strict or pad.fill_q)
    strict_k = p.secure and (p.strict or pad.fill_k)
    if sel.kernel == SM90:
        q_in, k_in, v_in = q, k, v
        if strict_q:
            fill_q, q_in = fill_rows(q, seqlens_q, batch=p.batch, num_heads=p.num_heads_q, seqlen=p.seqlen_q,
                                     x_strides=p.q_strides[:3], name="q_clean")
        if p.causal and strict_k:  # causal: only padding rows see padding keys
            fill_k, k_in = fill_rows(k, seqlens_k, batch=p.batch, num_heads=p.num_heads_kv, seqlen=p.seqlen_k,
                                     x_strides=p.k_strides[:3], name="k_clean")
        # (sanitise: causal, the kernel's loader warpgroup writes V's padding; no pre-pass)
        sanitise = p.secure and p.causal and _in_kernel_padding(cfg, strict_k, pad,
                                                                p.batch * p.num_heads_q * p.seqlen_q * p.seqlen_k,
                                                                p.secret_diagonal)
        # the main kernel a programmatic dependent of the pre-pass before it (every secure form here but sanitise)
        pdl = follows_prepass_pdl(p.secure, False, sanitise, p.batch * p.num_heads_q * p.seqlen_q * p.seqlen_k)
        if p.secure and not p.causal:  # no key mask in the kernel: K, V and key weights
            prepass, k_in, v_in = prepass_kv(k, v, seqlens_k, batch=p.batch, num_heads_kv=p.num_heads_kv,
                                             seqlen_k=p.seqlen_k, k_strides=p.k_strides[:3], v_strides=p.v_strides[:3],
                                             pdl_trigger=pdl)
        elif strict_k:  # V's padding: data-like stand-ins too (finite, as the V pre-pass's)
            prepass, v_in = fill_rows(v, seqlens_k, batch=p.batch, num_heads=p.num_heads_kv, seqlen=p.seqlen_k,
                                      x_strides=p.v_strides[:3], name="v_clean")
        elif p.secure and not sanitise:
            prepass, v_in = prepass_v(v, seqlens_k, batch=p.batch, num_heads_kv=p.num_heads_kv, seqlen_k=p.seqlen_k,
                                      v_strides=p.v_strides[:3], pdl_trigger=pdl)
        main = GluonLaunch(q_in, k_in, v_in, o, lse, cfg=cfg, secure=p.secure, sanitise=sanitise,
                           secret_diag=p.secret_diagonal, pdl_wait=pdl, **kw)
    else:
        q_strides, k_strides, v_strides = p.q_strides[:3], p.k_strides[:3], p.v_strides[:3]
        if strict_q:  # the kernel masks by select; the copies keep the caller's padding out of its products
            fill_q, q = fill_rows(q, seqlens_q, batch=p.batch, num_heads=p.num_heads_q, seqlen=p.seqlen_q,
                                  x_strides=q_strides, name="q_clean")
            q_strides = _contiguous_strides(p.num_heads_q, p.seqlen_q, p.head_dim)
        if strict_k:
            fill_k, k = fill_rows(k, seqlens_k, batch=p.batch, num_heads=p.num_heads_kv, seqlen=p.seqlen_k,
                                  x_strides=k_strides, name="k_clean")
            k_strides = _contiguous_strides(p.num_heads_kv, p.seqlen_k, p.head_dim)
        if p.secure and cfg.v_prepass:
            prepass, v = prepass_v(v, seqlens_k, batch=p.batch, num_heads_kv=p.num_heads_kv, seqlen_k=p.seqlen_k,
                                   v_strides=v_strides)
            v_strides = v.stride()[:3]  # the pre-pass's contiguous copy
        main = TritonForward(q, k, v, o, lse, seqlens_q=seqlens_q, seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q,
                             cu_seqlens_k=cu_seqlens_k, secure=p.secure, secure_public_diag=p.public_diagonal,
                             q_strides=q_strides, k_strides=k_strides, v_strides=v_strides,
                             o_strides=p.o_strides[:3], config=cfg, **kw)
    lse_shape = None
    if p.return_lse:
        lse_shape = (p.num_heads_q, q.shape[0]) if p.varlen else (p.batch, p.num_heads_q, p.seqlen_q)
    return Plan(p, sel, prepass, main, out_shape, lse_shape, validate, fill_q, fill_k)


def _in_kernel_padding(cfg, filled_v: bool, pad, work: int, secret_diagonal: bool = False) -> bool:
    """Secure mode, causal, on the Gluon kernel: the loader warpgroup writes V's padding
    (``GluonLaunch(sanitise=True)``) where the planner chooses it (or the ``secure_in_kernel_padding`` switch forces
    it), with the default padding only: the strict form's V stand-ins (``filled_v``) and the audit knobs' other
    paddings keep the pre-passes. ``secret_diagonal``: the form that visits every key tile (tables'
    secure_padding_in_kernel says where its loader's rewrite pays)."""
    mode = gluon_switches().secure_in_kernel_padding
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"the secure_in_kernel_padding switch takes 'auto', 'on' or 'off', got {mode!r}")
    if filled_v or pad != SecurePadding():
        return False
    return mode == "on" or (mode == "auto" and secure_padding_in_kernel(cfg, work, secret_diagonal))


def _contiguous_strides(heads: int, seqlen: int, head_dim: int) -> tuple:
    """[B, H, S, D] element strides of a contiguous copy (a pre-pass's workspace) for its first three dims."""
    return heads * seqlen * head_dim, seqlen * head_dim, head_dim
