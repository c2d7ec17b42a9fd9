"""Launching mechanism, shared by every kernel: the compiled-kernel cache of a planned launch
(:class:`KernelStep`), Triton's launch hooks, streams, and the TMA descriptor cache of the Hopper
kernels (:mod:`.tma`). Nothing here decides *what* runs: that is :mod:`flashcore.plan`."""
from .launcher import (KernelStep, capturing, cdiv, current_stream, device_arch, in_compiled_graph,
                       inside_compiled_graph, interpreting, keeps_buffers, launch_hooks_active, sm_count)

__all__ = ["KernelStep", "capturing", "cdiv", "current_stream", "device_arch", "in_compiled_graph",
           "inside_compiled_graph", "interpreting", "keeps_buffers", "launch_hooks_active", "sm_count"]
