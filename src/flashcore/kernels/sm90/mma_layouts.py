"""The register layouts of wgmma accumulators, as compile-time functions the sm_90 kernels call from device code
(a module of its own: kernel modules hold kernels only)."""
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function


@constexpr_function
def acc_layout(n):
    """The wgmma accumulator layout of a [64, n] tile of one 4-warp warpgroup (the backward's consumers: keys, or
    query rows for dQ, are the rows of every product there)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])
