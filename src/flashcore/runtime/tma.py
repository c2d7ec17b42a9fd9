"""The Hopper kernels' TMA descriptors on the host: building them without Triton's per-call validation,
encoding them once per pointer set, and launching through Triton's raw launcher.

Why: Triton's descriptor-expanding wrapper (``triton.backends.nvidia.driver.wrap_handle_tensordesc``)
re-encodes every TMA descriptor on every launch (``cuTensorMapEncodeTiled`` four times, ~10 us of host
time per call), and a serving loop calls with the same buffers. The descriptors depend on the plan (fixed)
and the data pointers, so the encoded ones are kept per pointer set."""
from __future__ import annotations

import threading


def addressable(t) -> bool:
    """The copy engine can address a rank-4 tensor: 16-byte aligned base and 16-byte multiples for every outer
    stride (the innermost dimension is the tile's row)."""
    es = t.element_size()
    return t.dim() == 4 and t.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in t.stride()[:-1])


def make_descriptors(tensors, geometry, count: int) -> list:
    """Gluon ``TensorDescriptor``s for ``tensors`` with the planned ``geometry`` (one ``(shape, strides,
    block_shape, layout)`` per tensor), padded with None to ``count``. The plan validated shapes, strides
    and alignment (the plan key includes pointer alignment), so this skips the dataclass's validation."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    descs = []
    for t, (shape, strides, block, layout) in zip(tensors, geometry):
        d = object.__new__(TensorDescriptor)
        d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding = t, shape, strides, block, layout, "zero"
        descs.append(d)
    return descs + [None] * (count - len(descs))


# The launch arguments before the kernel's own in Triton 3.6's flat argument list (grid x/y/z, stream, function,
# cooperative grid, PDL, and six metadata/hook/scratch slots); Triton 3.7-3.9 pass 15 (those, then the argument
# annotations and the kernel signature) and the kernel's arguments as one trailing list.
RAW_LAUNCH_BASE_ARGS = 13


class RawLauncher:
    """Triton's raw launcher, called as this Triton's descriptor-expanding wrapper calls it, with descriptors that
    were encoded once (:meth:`encode`). Two conventions, told apart by the wrapper's own shape:

    * ``flat`` (Triton 3.6): ``launcher(13 launch arguments, *kernel arguments)``, each descriptor expanded in place;
    * ``list`` (Triton 3.7-3.9): ``launcher(15 launch arguments, kernel arguments)``, the same expansion in a list,
      where a parameter that is a constexpr (an absent descriptor: None) keeps its slot.

    Both expand a descriptor into its encoded CUtensorMap, shape and strides (the wrapper's ``make_tensordesc_arg``).
    """
    __slots__ = ("launcher", "meta", "flat", "make_arg")

    def __init__(self, launcher, meta, flat: bool, make_arg=None):
        self.launcher, self.meta, self.flat, self.make_arg = launcher, list(meta), flat, make_arg

    def encode(self, descs, count: int) -> tuple:
        """The launcher's arguments for the descriptors, as the wrapper would build them; an absent descriptor (past
        the planned ones) stays one None, up to ``count``."""
        if self.make_arg is not None:  # 3.8 on: the encoder the wrapper holds (its third argument is unused)
            make = lambda d, m: self.make_arg(d, m, None)  # noqa: E731
        else:  # 3.6, 3.7: the driver module's, looked up as the wrapper does (at call time)
            from triton.backends.nvidia import driver

            make = driver.make_tensordesc_arg
        out = []
        for d, m in zip(descs, self.meta):
            out.extend(make(d, m))
        return tuple(out) + (None,) * (count - len(self.meta))

    def __call__(self, grid, stream, compiled, kernel_args: tuple) -> None:
        run = compiled.run
        if self.flat:
            self.launcher(grid[0], grid[1], 1, stream, compiled.function, run.launch_cooperative_grid, run.launch_pdl,
                          None, None, compiled.packed_metadata, None, None, None, *kernel_args)
        else:
            self.launcher(grid[0], grid[1], 1, stream, compiled.function, run.launch_cooperative_grid, run.launch_pdl,
                          compiled.packed_metadata, None, None, None, None, None, run.arg_annotations,
                          run.kernel_signature, kernel_args)


def unwrap_tensordesc_launcher(compiled, max_descriptors: int):
    """The :class:`RawLauncher` behind Triton's descriptor-expanding wrapper, or None where this Triton build does
    not have one of the wrapper shapes it knows; the caller then keeps Triton's own path. Reaches into Triton's
    launcher on purpose (see the module docstring). The kernel's descriptors must be its first parameters (4, or
    ``max_descriptors``), and the launch must need no scratch memory, no sanitizer state, and no other wrapper."""
    run = getattr(compiled, "run", None)
    inner = getattr(run, "launch", None)
    code, cells = getattr(inner, "__code__", None), getattr(inner, "__closure__", None)
    if code is None or not cells or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    if getattr(run, "gsan_enabled", False):
        return None
    try:
        free = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
    except ValueError:  # an empty cell
        return None
    launcher, meta = free.get("launcher"), free.get("tensordesc_meta")
    if not callable(launcher) or meta is None or len(meta) not in (4, max_descriptors):
        return None
    first = set(range(len(meta)))
    if "_BASE_ARGS_FORMAT_LEN" in code.co_names:  # 3.6: one flat list
        if getattr(inner, "__globals__", {}).get("_BASE_ARGS_FORMAT_LEN") != RAW_LAUNCH_BASE_ARGS:
            return None
        return RawLauncher(launcher, meta, flat=True) if free.get("tensordesc_indices") == first else None
    if not {"base_args", "kernel_args"} <= set(code.co_varnames) or not hasattr(run, "arg_annotations") \
            or not hasattr(run, "kernel_signature"):
        return None
    if "tensordesc_indices" in free:  # 3.7: indices of the descriptor parameters, the driver's encoder
        return RawLauncher(launcher, meta, flat=False) if free["tensordesc_indices"] == first else None
    paths, make_arg = free.get("relevant_paths"), free.get("make_tensordesc_arg")
    if paths == {i: {} for i in first} and callable(make_arg):  # 3.8, 3.9: a tree of descriptor paths
        return RawLauncher(launcher, meta, flat=False, make_arg=make_arg)
    return None


class EncodedDescriptors:
    """Encoded descriptor arguments per pointer set, the oldest of ``capacity`` sets dropped first.
    Safe to share between threads (a serving process calls one plan from several)."""
    __slots__ = ("capacity", "sets", "lock")

    def __init__(self, capacity: int):
        self.capacity, self.sets, self.lock = capacity, {}, threading.Lock()

    def get(self, key, make):
        enc = self.sets.get(key)
        if enc is None:
            enc = make()
            with self.lock:
                if key not in self.sets and len(self.sets) >= self.capacity:
                    del self.sets[next(iter(self.sets))]
                self.sets[key] = enc
        return enc

    def __len__(self) -> int:
        return len(self.sets)
