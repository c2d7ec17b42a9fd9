"""Which kernel runs: the one selection function, :func:`select`.

It reads the per-architecture tables (``tables``), the knobs (``knobs``) and the kernels' declared
capabilities (``flashcore.kernels``), and returns the choice together with, for every kernel not chosen,
the reason (``Selection.rejected``), so a benchmark or a user can ask why a call did not take a kernel."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..kernels import SM90_FWD, TRITON_FWD
from ..problem import Problem
from . import knobs, tables
from .tables import Config

TRITON = TRITON_FWD.name
SM90 = SM90_FWD.name


@dataclass(frozen=True)
class Selection:
    kernel: str  # a kernel's declared name (flashcore.kernels.KERNELS)
    config: Config
    rejected: tuple = ()  # ((kernel name, why not), ...)

    def explain(self) -> str:
        why = "; ".join(f"{k}: {r}" for k, r in self.rejected)
        return f"{self.kernel} {tables.config_name(self.config)}" + (f" (not {why})" if why else "")


def table_config(arch, *, secret_diagonal: bool = False, **facts) -> Config:
    """The configuration the architecture's table gives these facts (``Problem.table_facts``), with the
    knobs applied (a Gluon config where the table prefers the sm_90 kernel). ``arch``: the compute
    capability, None for CPU tensors and the interpreter. ``secret_diagonal``: secure causal attention whose
    diagonal is secret (``Problem.secret_diagonal``; the Hopper table's own rows for it)."""
    kw, secure = facts, facts.get("secure")
    if arch is None:
        cfg = tables.INTERPRETER
    elif tables.is_hopper(arch):
        cfg = tables.hopper(**kw, secret_diagonal=secret_diagonal)
    else:
        cfg = tables.generic(**kw)
    if tables.is_hopper(arch):
        env = knobs.SECURE_KERNEL_ENV if secure else knobs.HOPPER_KERNEL_ENV
        mode = knobs.env_choice(env, knobs.HOPPER_KERNEL_MODES)
        if mode == "gluon_ws" and cfg.kernel != "gluon_ws":  # (the table's own Gluon layout stays; the planner
            # still runs the Triton kernel where Gluon is not eligible)
            cfg = (tables.gluon_secure if secure else tables.gluon_ws)(kw["head_dim"], kw["seqlen_q"], kw["causal"])
        elif mode == "triton" and cfg.kernel != "triton":
            cfg = tables.hopper_triton(**kw)
    if secure:
        mode = knobs.env_choice(knobs.SECURE_V_ZEROING_ENV, knobs.SECURE_V_ZEROING_MODES)
        if mode != "auto":
            if mode == "in_loop" and cfg.kernel == "gluon_ws":  # the Gluon kernel needs the pre-pass
                cfg = tables.hopper_triton(**kw)
            cfg = replace(cfg, v_prepass=mode == "prepass")
    return cfg


def triton_config(problem: Problem) -> Config:
    """The Triton kernel's configuration for this problem as its table gives it (the form the static audit
    lists for the Triton kernel)."""
    cfg = table_config(problem.arch, **problem.table_facts())
    return cfg if cfg.kernel == "triton" else tables.triton_table(problem.arch, **problem.table_facts())


def sm90_rejection(problem: Problem, cfg: Config) -> str | None:
    """Why the sm_90 Gluon kernel cannot run this problem with ``cfg`` (None: it can)."""
    caps = SM90_FWD
    if not tables.is_hopper(problem.arch):
        return "needs an sm_90 GPU"
    if problem.varlen:
        return "dense calls only (varlen runs the Triton kernel)"
    if not caps.supports(problem.dtype_name, problem.head_dim, problem.arch[0]):
        return f"supports {'/'.join(caps.dtypes)} at head dims {caps.head_dims}"
    if not problem.tma_addressable:
        return "needs tensors the copy engine can address (16-byte aligned base and strides, unit last stride)"
    if problem.secure and not cfg.v_prepass:  # (the Gluon kernel has no in-loop V select)
        return "secure mode takes the V pre-pass form (v_prepass) on this kernel"
    return tables.gluon_config_error(cfg, problem.head_dim)


def select(problem: Problem, config: Config | None = None) -> Selection:
    """The kernel and configuration that run ``problem``. ``config`` (benchmarks, sweeps) replaces the
    table's; a Gluon config still falls back to the Triton kernel where the Gluon kernel cannot run."""
    cfg = config or table_config(problem.arch, **problem.table_facts(), secret_diagonal=problem.secret_diagonal)
    if cfg.kernel == "triton":
        return Selection(TRITON, cfg, ((SM90, "the table chose the Triton kernel"),))
    why = sm90_rejection(problem, cfg)
    if why is None:
        return Selection(SM90, cfg, ((TRITON, "the table prefers the sm_90 kernel here"),))
    if config is not None and why == tables.gluon_config_error(cfg, problem.head_dim):
        raise ValueError(why)  # an explicit config the Gluon kernel cannot run, on a problem it could run
    # the Triton kernel's own table, V zeroing included: the form the static audit lists for it (audit.specs'
    # triton_config). Keeping the Gluon form's pre-pass here launched an unaudited form for small secure problems.
    return Selection(TRITON, tables.triton_table(problem.arch, **problem.table_facts()), ((SM90, why),))
