"""What a kernel supports, declared once beside its device code (vLLM-style), and read by the planner
(``flashcore.plan.select``), the validation layer (``flashcore._checks``) and the docs
(``docs/design.md``'s table, checked by a test). Plain Python: importing it compiles nothing."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """One kernel's declared support.

    ``dtypes``: input dtype names (``fp16``, ``bf16``, ``fp32``); ``head_dims``: the head dims it runs;
    ``archs``: compute-capability majors it runs on (``None``: any CUDA GPU and the CPU interpreter);
    ``features``: what it implements (``causal``, ``gqa``, ``varlen``, ``secure``, ``lse``, ...);
    ``needs``: conditions on the tensors beyond shape (``tma``: 16-byte aligned base and outer strides);
    ``secret``: its parameters that carry secret data (always, in secure mode, and in a varlen launch):
    what the static constant-time gate treats as secret."""
    name: str
    module: str
    role: str
    dtypes: tuple[str, ...]
    head_dims: tuple[int, ...]
    archs: tuple[int, ...] | None
    features: tuple[str, ...]
    needs: tuple[str, ...] = ()
    secret: tuple[str, ...] = ()
    secret_secure: tuple[str, ...] = ()
    secret_varlen: tuple[str, ...] = ()

    def secrets(self, secure: bool = False, varlen: bool = False) -> set[str]:
        return set(self.secret) | (set(self.secret_secure) if secure else set()) | (
            set(self.secret_varlen) if varlen else set())

    def supports(self, dtype: str, head_dim: int, arch_major: int | None = None) -> bool:
        return (dtype in self.dtypes and head_dim in self.head_dims
                and (self.archs is None or arch_major in self.archs))


def head_dim_text(dims: tuple[int, ...]) -> str:
    """``8, 16, ..., 256`` as prose for errors and docs."""
    if len(dims) > 4 and all(b - a == dims[1] - dims[0] for a, b in zip(dims, dims[1:])):
        return f"multiples of {dims[1] - dims[0]} from {dims[0]} to {dims[-1]}"
    return ", ".join(str(d) for d in dims)
