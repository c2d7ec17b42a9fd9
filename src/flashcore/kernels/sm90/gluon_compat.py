"""The one place that knows how Gluon's API differs between the Triton versions flashcore supports
(3.6 to 3.9). The sm_90 device code imports the Gluon names that moved from here, and no other source
module spells them per version. Each name is chosen by what the installed Triton has (feature detection,
no version numbers), so every version in the range gets the spelling it offers.

What differs:

* TMA copies. Triton 3.6 and 3.7 have ``tma.async_copy_global_to_shared`` and
  ``tma.async_copy_shared_to_global``; 3.8 renames them ``tma.async_load`` and ``tma.async_store``
  (keeping the old names as aliases), and 3.9 keeps the old names only as stubs that raise. The
  arguments flashcore passes (descriptor, coordinates, barrier, destination / descriptor, coordinates,
  source) are the same and build the same operations (``ttng.async_tma_copy_global_to_local`` /
  ``..._local_to_global``); the new names' extra keyword arguments (multicast, cache policy) keep
  their defaults, which are the old behaviour.
* Aggregates. Triton 3.6 and 3.7 have the aggregate decorator only as the private
  ``triton.language.core._aggregate``; 3.8 exports the same decorator as ``triton.aggregate``.

* The partition-wide barrier: ``gl.thread_barrier`` in 3.6 and 3.7, ``gl.barrier`` from 3.8 on (the same
  ``gpu.barrier``, lowered inside a warp-specialised partition to a named barrier of its own warps).
* Viewing a shared-memory buffer as another type and layout (the same bytes): ``_reinterpret`` in 3.6, ``reinterpret``
  in 3.9 (same arguments); spelled here as ``reinterpret(buffer, dtype, shape, layout)``.
* The TMA reduce-add: Triton 3.9's Gluon has ``tma.async_atomic_add``. 3.6's Gluon has no Python name for it, but
  its builder has the operation (``create_async_tma_reduce``, the ``ttng.async_tma_reduce`` that ``tl``'s
  ``descriptor.atomic_add`` lowers to), so the same builtin is spelled here from it (None only where a Triton
  has neither).

Everything else the kernels use (``mbarrier``, ``tma.store_wait``, ``warpgroup_mma``, ``warp_specialize``,
``fence_async_shared``, the layouts, ``constexpr_function``) is spelled alike in all four versions and is
imported directly (``tma.store_wait`` gains a ``read_only`` argument in 3.8 whose default is the 3.6 wait).
"""
from triton.experimental.gluon.language.nvidia.hopper import tma as _tma

if hasattr(_tma, "async_load"):  # Triton >= 3.8
    async_load = _tma.async_load
    async_store = _tma.async_store
else:  # Triton 3.6, 3.7
    async_load = _tma.async_copy_global_to_shared
    async_store = _tma.async_copy_shared_to_global

# The TMA reduce-add (``cp.reduce.async.bulk.tensor``, a shared-memory tile added into global memory by the copy
# engine): Triton 3.9's Gluon has it as ``tma.async_atomic_add``; on 3.6 the builder's operation is wrapped here as
# 3.9 does it (the coordinates as 32-bit values, then the reduce of kind ADD).
async_atomic_add = getattr(_tma, "async_atomic_add", None)
if async_atomic_add is None:
    from triton._C.libtriton import gluon_ir as _gluon_ir
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    if hasattr(_gluon_ir.GluonOpBuilder, "create_async_tma_reduce"):

        @_builtin
        def async_atomic_add(tensor_desc, coord, src, _semantic=None):
            """Add the shared-memory tile ``src`` into the global tile of ``tensor_desc`` at ``coord`` (TMA
            reduce-add; completion as a TMA store's, ``store_wait``)."""
            coord = _semantic._convert_to_ir_values(coord, require_i64=False)
            _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                      src.handle)

from triton.experimental.gluon import language as _gl
from triton.experimental.gluon.language._core import builtin as _builtin_fn
from triton.experimental.gluon.language._core import shared_memory_descriptor as _shared

thread_barrier = getattr(_gl, "thread_barrier", None) or _gl.barrier

_REINTERPRET = "reinterpret" if hasattr(_shared, "reinterpret") else "_reinterpret"


@_builtin_fn
def reinterpret(buffer, dtype, shape, layout, _semantic=None):
    """``buffer`` (shared memory) viewed as ``dtype`` elements of ``shape`` in ``layout``: the same bytes."""
    return getattr(buffer, _REINTERPRET)(dtype, shape, layout, _semantic=_semantic)


try:  # Triton >= 3.8
    from triton import aggregate
except ImportError:  # Triton 3.6, 3.7
    from triton.language.core import _aggregate as aggregate

__all__ = ["aggregate", "async_atomic_add", "async_load", "async_store", "reinterpret", "thread_barrier"]
