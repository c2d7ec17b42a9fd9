"""One planned kernel launch (:class:`KernelStep`) and the facts a launch needs from the process:
whether Triton interprets, the device's architecture, the current stream, and Triton's launch hooks."""
from __future__ import annotations

import contextlib
import os
import threading

import torch


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def capturing(device: torch.device) -> bool:
    """Whether a CUDA graph is being captured on ``device``'s current stream (host syncs are not allowed)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


_CALL = threading.local()


@contextlib.contextmanager
def inside_compiled_graph():
    """Marks a call made by one of flashcore's ``torch.library`` ops as a compiled graph runs it: no buffer kept
    from call to call (:func:`keeps_buffers`). torch.compile's CUDA graphs (``mode="reduce-overhead"``, cudagraph
    trees: what transformers' static-cache generation compiles) first run the op eagerly in the graph's private
    memory pool, then check that nothing allocated there outlives the run but the outputs; a workspace kept for the
    next eager call would ("Detected 1 tensor(s) in the cudagraph pool not tracked as outputs", perf-notes v60)."""
    before = getattr(_CALL, "compiled", False)
    _CALL.compiled = True
    try:
        yield
    finally:
        _CALL.compiled = before


def in_compiled_graph() -> bool:
    """Whether this thread is inside :func:`inside_compiled_graph`."""
    return getattr(_CALL, "compiled", False)


def keeps_buffers(device: torch.device) -> bool:
    """Whether a call may keep a buffer (a workspace, a lengths tensor) for later calls: an eager call on a GPU, not
    under CUDA-graph capture, tracing, or inside a compiled graph's op (:func:`inside_compiled_graph`)."""
    return (device.type == "cuda" and not in_compiled_graph() and not capturing(device)
            and not torch.compiler.is_compiling())


def device_arch(device: torch.device):
    """(major, minor) compute capability of a CUDA device; None on CPU tensors or under the interpreter."""
    if device.type != "cuda" or interpreting():
        return None
    return torch.cuda.get_device_capability(device)


def sm_count(device: torch.device) -> int:
    """SMs of the device (an H100 SXM's 132 for CPU tensors: the audit compiles without a GPU)."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


_KNOBS = None  # triton.knobs, imported on the first launch (importing it per launch cost ~1 us of host time)


def _triton_knobs():
    global _KNOBS
    if _KNOBS is None:
        from triton import knobs

        _KNOBS = knobs
    return _KNOBS


def triton_debug() -> bool:
    """Whether Triton's launcher builds kernels in its debug mode (``triton.knobs.runtime.debug``, ``TRITON_DEBUG=1``:
    device asserts and integer overflow checks; ``audit.sass.compile.launch_debug`` reads the same knob)."""
    return bool(_triton_knobs().runtime.debug)


def launch_hooks_active() -> bool:
    """Whether a profiler or user registered a Triton launch hook. Triton 3.6 keeps the hooks as
    ``HookChain`` objects that are never None, so an empty chain counts as no hook."""
    rt = _triton_knobs().runtime
    for hook in (rt.launch_enter_hook, rt.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def current_stream(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch._C._cuda_getCurrentRawStream(index)


def _arg_class(a):
    """What Triton's launcher specialises on of one runtime argument (Triton 3.6-3.9: a tensor's dtype and
    16-byte alignment; an int's value 1, divisibility by 16 and integer width; a float's type), or a finer
    fact. TypeError for any other kind of argument (descriptors, ...): such launches are not shared."""
    if a is None:
        return None
    t = type(a)
    if t is torch.Tensor:
        return "t", a.dtype, a.data_ptr() % 16 == 0
    if t is bool:
        return "b", a
    if t is int:
        return "i", a == 1, a % 16 == 0, -2 ** 31 <= a < 2 ** 31, a < 2 ** 63
    if t is float:
        return ("f",)
    raise TypeError(f"no launch class for {t.__name__}")


# (kernel, device, constexprs, warps, stages, options, every runtime argument's class) -> (compiled, tail): the
# kernel Triton's launcher chose for that class, shared by every KernelStep of the same class. A plan made for
# new shapes whose launch class was seen before (a KV cache one token longer, a new batch size with the same
# divisibility) then skips Triton's argument binding on its first run too.
_LAUNCHED: dict = {}


class KernelStep:
    """One kernel launch whose scalars and constexprs are fixed; only the pointers change.

    The first run goes through Triton's launcher (compiling if needed), unless a launch of the same class
    (:func:`_arg_class` of every argument, the same constexprs, warps, stages, options and device) ran before.
    On a GPU the compiled kernel is kept and later runs call it directly, skipping Triton's argument binding:
    the plan key holds every fact Triton specialises on, so this is the kernel Triton would pick. (Two
    threads racing on the first run both compile through Triton's own cache and keep the same kernel.)"""
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
            cls = self._launch_class(ptrs, device)
            known = _LAUNCHED.get(cls) if cls is not None else None
            if known is None:
                kernel = self.fn[grid](*ptrs, *self.scalars, **self.constexprs, num_warps=self.num_warps,
                                       num_stages=self.num_stages, **self.options)
                if hasattr(kernel, "result"):  # asynchronous compilation hands back a future
                    kernel = kernel.result()
                if device.type == "cuda" and not interpreting() and kernel is not None:
                    names = list(self.fn.arg_names)
                    self.tail = tuple(self.constexprs[n] for n in names[len(ptrs) + len(self.scalars):])
                    self.compiled = kernel
                    if cls is not None:
                        _LAUNCHED[cls] = (kernel, self.tail)
                return
            compiled, self.tail = known
            self.compiled = compiled
        self.launch(ptrs, current_stream(device), launch_hooks_active())

    def launch(self, ptrs, stream: int, hooks: bool) -> None:
        """Launch the kept compiled kernel (``self.compiled``, set by a first :meth:`run`) on ``stream``: the host
        path of a repeat launch, for callers that read the stream and the hooks once for several launches."""
        grid, compiled = self.grid, self.compiled
        if grid[0] == 0 or grid[1] == 0:
            return
        args = (*ptrs, *self.scalars, *self.tail)
        if hooks:
            rt = _triton_knobs().runtime
            compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata,
                         compiled.launch_metadata(grid, stream, *args), rt.launch_enter_hook, rt.launch_exit_hook,
                         *args)
        else:  # no hook to call: skip building launch metadata and calling two empty hook chains
            compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *args)

    def _launch_class(self, ptrs, device: torch.device):
        """This launch's key in ``_LAUNCHED`` (None: not shareable, or not a compiled launch on a GPU)."""
        if device.type != "cuda" or interpreting():
            return None
        try:
            # Triton's debug mode is part of what its launcher compiles (device asserts, overflow checks): a kernel
            # built with it on is not shared with launches after it is turned off, nor the other way round
            cls = (self.fn, device.index, tuple(sorted(self.constexprs.items())), self.num_warps, self.num_stages,
                   tuple(sorted(self.options.items())), tuple(_arg_class(a) for a in (*ptrs, *self.scalars)),
                   triton_debug())
            hash(cls)
        except TypeError:
            return None
        return cls
