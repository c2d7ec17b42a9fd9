"""GPU robustness: threads, streams, devices, out of memory, and the documented behaviours of the
validation layer (gradients refused, varlen rows no sequence owns) under CUDA-graph capture."""
import pytest
import torch

import flashcore
from conftest import capture_cuda_graph, rel_err

pytestmark = pytest.mark.gpu
TOL = 1.2e-2


def _qkv(B, Hq, Hkv, S, D, seed, dtype=torch.bfloat16, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    mk = lambda h: torch.randn(B, h, S, D, device=device, generator=g).to(dtype)
    return mk(Hq), mk(Hkv), mk(Hkv)


def test_eight_threads_with_different_shapes_match_single_threaded_results():
    from flashcore.bench.experiments.robustness import calls, threads_check

    flashcore.plan.cache.PLANS.clear()  # the threads race on planning, compiling and the caches
    # every other workload: both kernels, fast and secure, GQA, D 40-256, varlen
    report = threads_check(work=calls(seed=7)[::2], repeats=20)
    assert not report["errors"], report["errors"]
    assert report["threads"] == 8
    for row in report["rows"]:
        assert row["bitwise_equal_to_single_thread"], row  # the kernels are deterministic: bitwise equal


@pytest.mark.parametrize("shape", [(1, 4, 4, 256, 64)])  # the Triton kernel: a few CTAs, which fit beside the sleep
def test_a_call_on_a_side_stream_runs_on_that_stream(shape):
    # (The persistent Gluon kernel needs every SM, one of which the sleep below holds, so this way of telling
    # streams apart works for the Triton kernel only; both kernels take the stream from runtime.current_stream.)
    q, k, v = _qkv(*shape, seed=1)
    side = torch.cuda.Stream()
    out = torch.full_like(q, float("nan"))
    with torch.cuda.stream(side):  # planned, compiled and loaded (module loading may synchronise the device)
        flashcore.attention(q, k, v, causal=True, out=out)
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    # Keep the default stream busy; a launch that went to the default stream would queue behind the sleep.
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU cycles on the default stream
    with torch.cuda.stream(side):
        flashcore.attention(q, k, v, causal=True, out=out)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    assert not torch.cuda.current_stream().query(), "the default stream should still be sleeping"
    assert rel_err(out, flashcore.reference.attention(q, k, v, causal=True)) < TOL
    torch.cuda.synchronize()


def test_mixed_devices_are_refused():
    q, k, v = _qkv(1, 2, 2, 64, 64, seed=2)
    with pytest.raises(ValueError, match="device"):
        flashcore.attention(q, k.cpu(), v)
    with pytest.raises(ValueError, match="seqlens_k must be on q's device"):
        flashcore.attention(q, k, v, secure=True, seqlens_k=torch.tensor([64], dtype=torch.int32))
    cu = torch.tensor([0, 64], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q must be on q's device"):
        flashcore.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu.cuda(),
                                   64, 64)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_a_non_current_device_launch_on_their_own_device():
    torch.cuda.set_device(0)
    for secure in (False, True):
        q, k, v = _qkv(2, 8, 2, 700, 128, seed=3, device="cuda:1")
        lens = torch.tensor([700, 311], dtype=torch.int32, device="cuda:1")
        kw = dict(secure=True, seqlens_k=lens) if secure else {}
        out = flashcore.attention(q, k, v, causal=True, **kw)
        assert out.device == q.device
        torch.cuda.synchronize(1)
        ref = flashcore.reference.attention(q, k, v, causal=True, **kw)
        assert rel_err(out, ref) < TOL
        with pytest.raises(ValueError, match="device"):
            flashcore.attention(q, k.to("cuda:0"), v)
    assert torch.cuda.current_device() == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("path", ["gluon", "triton", "secure", "varlen", "kvcache", "backward"])
def test_the_same_call_on_two_devices_runs_on_each_ones_own(path):
    """One shape, called on cuda:1, cuda:0, then cuda:1 again, with cuda:0 current: each call's plan, its cached
    launch (TMA descriptors, workspace) and its kernels belong to the tensors' device, whichever device planned
    that shape first. Every path: the Gluon and Triton forwards, secure mode with its pre-pass, varlen, the
    KV-cache decode kernels (with a split count from the device's SM count) and the backward."""
    torch.cuda.set_device(0)
    for dev in ("cuda:1", "cuda:0", "cuda:1"):
        torch.manual_seed(5)
        if path == "kvcache":
            q = torch.randn(2, 1, 8, 128, device=dev).to(torch.bfloat16)
            kc, vc = (torch.randn(2, 4096, 2, 128, device=dev).to(torch.bfloat16) for _ in range(2))
            lens = torch.tensor([4000, 1234], dtype=torch.int32, device=dev)
            run = lambda: flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens)
            ref = flashcore.reference.attention_with_kvcache(q, kc, vc, cache_seqlens=lens)
        elif path == "varlen":
            cu = torch.tensor([0, 100, 357, 700], dtype=torch.int32, device=dev)
            q, k, v = (torch.randn(700, h, 128, device=dev).to(torch.bfloat16) for h in (8, 2, 2))
            run = lambda: flashcore.attention_varlen(q, k, v, cu, cu, 343, 343, causal=True)
            ref = flashcore.reference.attention_varlen(q, k, v, cu, cu, 343, 343, causal=True)
        else:
            S, D = (700, 128) if path in ("gluon", "secure") else (300, 96)
            q, k, v = _qkv(2, 8, 2, S, D, seed=3, device=dev)
            kw = {"secure": True, "seqlens_k": torch.tensor([S, 311], dtype=torch.int32, device=dev)} \
                if path == "secure" else {}
            run = lambda: flashcore.attention(q, k, v, causal=True, **kw)
            ref = flashcore.reference.attention(q, k, v, causal=True, **kw)
        if path == "backward":
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            out = flashcore.attention(q, k, v, causal=True)
            dout = torch.randn_like(out)
            grads = torch.autograd.grad(out, (q, k, v), dout)
            qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
            want = torch.autograd.grad(flashcore.reference.attention(qr, kr, vr, causal=True), (qr, kr, vr),
                                       dout.double())
            for g, w in zip(grads, want):
                assert g.device == q.device
                assert rel_err(g, w) < TOL
        else:
            plan = flashcore.plan_attention(q, k, v, causal=True, **kw) if path in ("gluon", "triton", "secure") \
                else None
            if plan is not None:
                assert plan.selection.kernel.startswith("sm90_fwd" if path != "triton" else "triton_fwd"), \
                    plan.selection.explain()
            out = run()
            assert out.device == q.device
            torch.cuda.synchronize(q.device)
            assert rel_err(out, ref) < TOL
        assert torch.cuda.current_device() == 0


_OOM_SCENARIO = """
import torch, flashcore
g = torch.Generator(device="cuda").manual_seed(4)
q, k, v = (torch.randn(2, 8, 2048, 128, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
lens = torch.tensor([2048, 1000], dtype=torch.int32, device="cuda")
torch.cuda.synchronize()
torch.cuda.empty_cache()  # the float32 temporaries above must not stay cached: they could serve the call
total = torch.cuda.get_device_properties(0).total_memory
# Cap the caching allocator just above what is allocated now: the call's output and the pre-pass's
# workspace cannot be allocated.
torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_allocated() + (1 << 20)) / total)
try:
    flashcore.attention(q, k, v, causal=False, secure=True, seqlens_k=lens)
    print("NO-OOM")
except torch.OutOfMemoryError:
    print("OOM")
torch.cuda.set_per_process_memory_fraction(1.0)
out = flashcore.attention(q, k, v, causal=False, secure=True, seqlens_k=lens)
ref = flashcore.reference.attention(q, k, v, causal=False, secure=True, seqlens_k=lens)
print("REL", ((out.double() - ref).norm() / ref.norm()).item())
"""


def test_out_of_memory_raises_torchs_error_and_flashcore_stays_usable():
    # In a fresh process: in this one, memory cached by earlier tests can serve the call despite the cap.
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", _OOM_SCENARIO], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.split()
    assert lines[0] == "OOM", r.stdout
    assert lines[1] == "REL" and float(lines[2]) < TOL, r.stdout


def test_gradients_flow_through_the_gpu_kernels():
    """The Wq -> q -> attention -> Wo chain of a training step: Wq gets its gradient (it was silently None before
    the backward pass existed); under inference_mode nothing is recorded."""
    q, k, v = _qkv(1, 4, 4, 128, 64, seed=5)
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    flashcore.attention(q @ w, k, v).float().sum().backward()
    assert w.grad is not None and torch.isfinite(w.grad).all() and w.grad.abs().sum() > 0
    with torch.inference_mode():
        assert not flashcore.attention(q @ w, k, v).requires_grad


def test_varlen_rows_no_sequence_owns_are_zero_under_graph_replay():
    H, D, total = 4, 128, 64
    q, k, v = (torch.randn(total, H, D, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 20, 50], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    run = lambda: flashcore.attention_varlen(q, k, v, cu, cu, 40, 40, out=out, return_lse=True)
    run()  # plan and compile outside the capture
    graph, (res, lse) = capture_cuda_graph(run)
    for lengths in ([0, 20, 50], [0, 7, 33], [0, 30, 64]):
        cu.copy_(torch.tensor(lengths, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        end = lengths[-1]
        assert torch.equal(res[end:], torch.zeros_like(res[end:]))
        assert bool((lse[:, end:] == float("-inf")).all())
        ref = flashcore.reference.attention_varlen(q, k, v, cu, cu, 40, 40)
        assert rel_err(res[:end], ref[:end]) < TOL
