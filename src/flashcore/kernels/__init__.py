"""Device code only: one module per kernel family, each declaring its capabilities and its secret
parameters beside its signature (``CAPABILITIES``, a :class:`~.capabilities.Capabilities`).

* ``triton/fwd.py``: the portable forward kernel (every CUDA GPU, the CPU interpreter, secure mode);
* ``sm90/fwd.py``: the Hopper warp-specialised Gluon forward kernel, with its device parts beside it;
* ``secure/prepass.py``: the secure mode's pre-passes;
* ``triton/bwd.py``: the portable backward kernels (pre-pass, dK/dV, dQ);
* ``sm90/bwd.py``: the Hopper warp-specialised Gluon dK/dV kernel (the pre-pass and dQ stay Triton's);
* ``triton/decode.py``, ``triton/combine.py``, ``triton/kv_append.py``: KV-cache attention (split-KV decode,
  its combine step, the cache append).

Their host side (grids, arguments, constexprs) is in ``flashcore.launch``; which one runs is decided in
``flashcore.plan.select``. The validation layer and the docs read :data:`KERNELS`."""
from __future__ import annotations

from .capabilities import Capabilities, head_dim_text
from .secure import prepass as _secure_prepass
from .sm90 import bwd as _sm90_bwd
from .sm90 import fwd as _sm90_fwd
from .triton import bwd as _triton_bwd
from .triton import combine as _triton_combine
from .triton import decode as _triton_decode
from .triton import fwd as _triton_fwd
from .triton import kv_append as _triton_kv_append

TRITON_FWD: Capabilities = _triton_fwd.CAPABILITIES
SM90_FWD: Capabilities = _sm90_fwd.CAPABILITIES
SECURE_PREPASS_V: Capabilities = _secure_prepass.V_CAPABILITIES
SECURE_PREPASS_KV: Capabilities = _secure_prepass.KV_CAPABILITIES
SECURE_PREPASS_PAGED_V: Capabilities = _secure_prepass.PAGED_V_CAPABILITIES
SECURE_FILL_ROWS: Capabilities = _secure_prepass.ROWS_CAPABILITIES
TRITON_BWD: Capabilities = _triton_bwd.CAPABILITIES
SM90_BWD: Capabilities = _sm90_bwd.CAPABILITIES
TRITON_DECODE: Capabilities = _triton_decode.CAPABILITIES
TRITON_DECODE_COMBINE: Capabilities = _triton_combine.CAPABILITIES
TRITON_KV_APPEND: Capabilities = _triton_kv_append.CAPABILITIES
KERNELS: dict[str, Capabilities] = {c.name: c for c in (TRITON_FWD, SM90_FWD, TRITON_BWD, SM90_BWD, SECURE_PREPASS_V,
                                                        SECURE_PREPASS_KV, SECURE_PREPASS_PAGED_V, SECURE_FILL_ROWS,
                                                        TRITON_DECODE, TRITON_DECODE_COMBINE, TRITON_KV_APPEND)}
# The forward kernels of the public entry points: a call is valid if one of them runs it (the portable one
# runs everything the others do, so its declaration is the public contract)
FORWARD = (TRITON_FWD, SM90_FWD)

DTYPE_NAMES = ("fp16", "bf16", "fp32")  # the names capabilities use (torch.float16, torch.bfloat16, torch.float32)


def forward_dtype_names() -> tuple[str, ...]:
    """Input dtypes some forward kernel runs."""
    return tuple(n for n in DTYPE_NAMES if any(n in c.dtypes for c in FORWARD))


def forward_head_dims() -> tuple[int, ...]:
    """Head dims some forward kernel runs."""
    return tuple(sorted({d for c in FORWARD for d in c.head_dims}))


def capability_table() -> str:
    """The declared capabilities as a Markdown table (docs/design.md carries it; a test keeps it current)."""
    rows = ["| kernel | module | role | dtypes | head dims | arch | features | needs | secret parameters |",
            "|---|---|---|---|---|---|---|---|---|"]
    for c in KERNELS.values():
        arch = "any (+ CPU interpreter)" if c.archs is None else ", ".join(f"sm_{a}0" for a in c.archs)
        secret = ", ".join(c.secret) + (f"; secure: {', '.join(c.secret_secure)}" if c.secret_secure else "") + (
            f"; varlen: {', '.join(c.secret_varlen)}" if c.secret_varlen else "")
        rows.append(f"| `{c.name}` | `{c.module}` | {c.role} | {', '.join(c.dtypes)} | {head_dim_text(c.head_dims)} "
                    f"| {arch} | {', '.join(c.features)} | {', '.join(c.needs) or '-'} | {secret} |")
    return "\n".join(rows)
