"""Control kernels for compute-sanitizer, not part of the library.

``ws_control_kernel``: the smallest Gluon warp_specialize (a 4-warp default partition and two 1-warp workers,
each storing to its own global slice, no shared memory of its own). What racecheck reports on it comes from
Triton's warp-specialize dispatch (the per-warp state bytes in shared memory, ordered by named barrier 1), not
from flashcore's kernels; the robustness experiment runs it beside them to tell the two apart.

``ws_barrier_control_kernel``: the same dispatch with 4-warp workers, plus a CTA-local barrier
(``gl.thread_barrier``) where flashcore's Gluon kernel has them: in the default warps before the dispatch
(``PROLOGUE``: the barrier after its mbarrier inits; Triton lowers it to ``BAR.SYNC 0x0, 0x80``, barrier 0 for
the 128 default threads only), inside the default partition (``IN_DEFAULT``: also ``BAR.SYNC 0x0, 0x80``), or
inside the 4-warp workers (``IN_WORKER``: ``BAR.SYNC 0x2, 0x80`` / ``0x3, 0x80``). Each switch is one thing
flashcore's kernel adds to the dispatch; racecheck run on each form alone says which one its reports follow.
"""
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


@gluon.jit
def _default_barrier(ptr, IN_DEFAULT: gl.constexpr):
    offs = gl.arange(0, 128, gl.BlockedLayout([1], [32], [4], [0]))
    if IN_DEFAULT:
        gl.thread_barrier()
    gl.store(ptr + offs, offs)


@gluon.jit
def _worker_barrier(ptr, idx: gl.constexpr, IN_WORKER: gl.constexpr):
    offs = gl.arange(0, 128, gl.BlockedLayout([1], [32], [4], [0]))
    if IN_WORKER:
        gl.thread_barrier()
    gl.store(ptr + 128 + idx * 128 + offs, offs + idx)


@gluon.jit
def ws_barrier_control_kernel(ptr, PROLOGUE: gl.constexpr, IN_DEFAULT: gl.constexpr, IN_WORKER: gl.constexpr):
    if PROLOGUE:
        gl.thread_barrier()
    gl.warp_specialize([(_default_barrier, (ptr, IN_DEFAULT)), (_worker_barrier, (ptr, 0, IN_WORKER)),
                        (_worker_barrier, (ptr, 1, IN_WORKER))], [4, 4], [24, 24])
