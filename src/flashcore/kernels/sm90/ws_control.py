"""A control kernel for compute-sanitizer, not part of the library: the smallest Gluon warp_specialize
(a 4-warp default partition and two 1-warp workers, each storing to its own global slice, no shared
memory of its own). What racecheck reports on it comes from Triton's warp-specialize dispatch (the
per-warp state bytes in shared memory, ordered by named barrier 1), not from flashcore's kernels; the
robustness experiment runs it beside them to tell the two apart."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _default(ptr):
    offs = gl.arange(0, 128, gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(ptr + offs, offs)


@gluon.jit
def _worker(ptr, idx: gl.constexpr):
    offs = gl.arange(0, 32, gl.BlockedLayout([1], [32], [1], [0]))
    gl.store(ptr + 128 + idx * 32 + offs, offs + idx)


@gluon.jit
def ws_control_kernel(ptr):
    gl.warp_specialize([(_default, (ptr,)), (_worker, (ptr, 0)), (_worker, (ptr, 1))], [1, 1], [24, 24])
