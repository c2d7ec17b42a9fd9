"""Without CUDA, the Triton kernels run under the interpreter (must be set before triton is imported)."""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_interp = pytest.mark.skip(reason="interpreter tests run on CPU only (TRITON_INTERPRET=1)")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "interp" in item.keywords and not INTERPRET:
            item.add_marker(skip_interp)


def rel_err(out, ref) -> float:
    ref = ref.double()
    denom = ref.norm().item()
    return (out.double() - ref).norm().item() / max(denom, 1e-30)


def capture_cuda_graph(fn):
    """Capture ``fn()`` in a CUDA graph on a side stream (as PyTorch recommends); returns
    ``(graph, fn's outputs)``. Warm ``fn`` up first: compiling or planning inside capture fails."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph):
            outs = fn()
    torch.cuda.current_stream().wait_stream(s)
    return graph, outs
