"""s26: deterministic=True's ordered fused dQ (D=128). Part A: correctness (bitwise repeatable across runs and
schedules, counters, FA rule); part B: same-run A/B of default / ordered / dQ-kernel deterministic."""
import json, os, sys, time, math
import torch
import torch.nn.functional as F
from triton.testing import do_bench
import flashcore
from flashcore import ops
from flashcore.plan.cache import PLANS
from flashcore.plan import backward as PB
from flashcore.launch import sm90_bwd as L

OUT = os.environ.get("OUT", ".")
os.makedirs(OUT, exist_ok=True)
PART = os.environ.get("PART", "AB")
res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=__import__("triton").__version__,
           git_sha=os.environ.get("FLASHCORE_GIT_SHA", "?"), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def math_grads(q, k, v, do, causal, dtype):
    qc, kc, vc = (t.detach().to(dtype).transpose(1, 2).requires_grad_(True) for t in (q, k, v))
    s = (qc @ kc.transpose(-1, -2)) * q.shape[-1] ** -0.5
    Sq, Sk = s.shape[-2:]
    if causal:
        keep = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device).tril(Sk - Sq)
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s.float(), -1).nan_to_num(0.0).to(dtype)
    o = p @ vc
    o.backward(do.to(dtype).transpose(1, 2))
    return [t.grad.transpose(1, 2) for t in (qc, kc, vc)]


captured = []
real_run = L.HopperDkdvLaunch.run


def spy(self, *a):
    real_run(self, *a)
    turns = a[9] if len(a) > 9 else None
    captured.append(None if turns is None else turns.clone())


L.HopperDkdvLaunch.run = spy


def expected_counts(B, H, Sq, Sk, causal):
    n_kt = -(-Sk // 128)
    num_m = -(-Sq // 64)
    cnt = []
    for m in range(num_m):
        if causal:
            last = min(((m + 1) * 64 + (Sk - Sq) - 1) // 128, n_kt - 1)
            cnt.append(max(last + 1, 0))
        else:
            cnt.append(n_kt)
    t = torch.tensor(cnt, dtype=torch.int32).view(1, 1, num_m).expand(B, H, num_m)
    return t.reshape(-1)


if "A" in PART:
    rows = []
    SHAPES = [(2, 4, 300, 300, False), (2, 4, 300, 300, True), (1, 4, 1024, 1024, True), (1, 2, 511, 777, True),
              (1, 3, 777, 511, True), (1, 2, 2048, 2048, False), (1, 8, 130, 2048, False), (2, 16, 2048, 2048, True),
              (1, 16, 4096, 4096, False)]
    for B, H, Sq, Sk, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(int(time.time()) % 100000 + Sq + Sk + causal)
        q = torch.randn(B, Sq, H, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Sk, H, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        do = torch.randn(B, Sq, H, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        runs = []
        for chunk in (4, 1, 16, 4):
            L.HEAD_CHUNK = chunk
            PLANS.clear()
            captured.clear()
            ins = [t.clone().requires_grad_() for t in (q, k, v)]
            torch.full((64 << 20,), float("nan"), device="cuda")
            flashcore.attention(*ins, causal=causal, layout="bshd", deterministic=True).backward(do)
            torch.cuda.synchronize()
            runs.append([t.grad for t in ins])
            turns = captured[0] if captured else None
        L.HEAD_CHUNK = 4
        PLANS.clear()
        ordered = turns is not None
        counts_ok = ordered and torch.equal(turns.cpu(), expected_counts(B, H, Sq, Sk, causal))
        bitwise = all(torch.equal(a, b) for r in runs[1:] for a, b in zip(runs[0], r))
        ref = math_grads(q, k, v, do, causal, torch.float32)
        low = math_grads(q, k, v, do, causal, torch.bfloat16)
        fa = []
        for x, r, lo in zip(runs[0], ref, low):
            fa.append([rel(x, r), rel(lo, r)])
        fa_ok = all(e <= 2 * b + 1e-3 for e, b in fa) and all(bool(t.isfinite().all()) for t in runs[0])
        # the default (unordered) form, five runs: does it repeat bitwise?
        dflt = []
        for _ in range(5):
            ins = [t.clone().requires_grad_() for t in (q, k, v)]
            flashcore.attention(*ins, causal=causal, layout="bshd").backward(do)
            dflt.append(ins[0].grad)
        default_repeats = all(torch.equal(dflt[0], d) for d in dflt[1:])
        vs_default = rel(runs[0][0], dflt[0])
        row = dict(shape=[B, H, Sq, Sk, causal], ordered=ordered, counts_ok=counts_ok, bitwise_over_schedules=bitwise,
                   fa_rule=fa, fa_ok=fa_ok, default_dq_repeats_bitwise=default_repeats, dq_vs_default=vs_default)
        rows.append(row)
        print(json.dumps(row), flush=True)
    res["correctness"] = rows
    json.dump(res, open(os.path.join(OUT, "bwd-s26-ordered-check.json"), "w"), indent=1)

if "B" in PART:
    ARMS = ["default", "ordered", "dqkernel"]
    SHAPES = [(4, 32, 4096, False), (1, 32, 16384, False), (4, 32, 4096, True), (1, 32, 16384, True),
              (8, 16, 2048, False)]
    if os.environ.get("SHAPES"):
        SHAPES = json.loads(os.environ["SHAPES"])
    ROUNDS = int(os.environ.get("ROUNDS", "3"))

    def set_arm(arm):
        PB.ORDERED_DQ = arm != "dqkernel"
        PB.ORDERED_CAUSAL_MAX_SEQLEN = 1 << 30
        PLANS.clear()

    rows = []
    for B, H, S, causal in SHAPES:
        D = 128
        g = torch.Generator(device="cuda").manual_seed(int(time.time()) % 100000 + S + causal)
        mk = lambda: torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        q, k, v, do = mk(), mk(), mk(), mk()
        scale = D ** -0.5
        o, lse = flashcore.attention(q, k, v, causal=causal, layout="bshd", return_lse=True)
        fns = {a: (lambda det: (lambda: ops.dense_backward(do, q, k, v, o, lse, None, causal, scale, True, det)))(
            a != "default") for a in ARMS}
        outs = {}
        for arm in ARMS:
            set_arm(arm)
            captured.clear()
            r = fns[arm]()
            outs[arm] = [t.clone() for t in r]
            r2 = fns[arm]()
            outs[arm + "_repeat_bitwise"] = all(torch.equal(a, b) for a, b in zip(outs[arm], r2))
            outs[arm + "_ordered"] = bool(captured) and captured[0] is not None
        err = {a: [rel(x, y) for x, y in zip(outs[a], outs["dqkernel"])] for a in ("default", "ordered")}
        times = {a: [] for a in ARMS}
        for r in range(ROUNDS):
            for arm in ARMS:
                set_arm(arm)
                fns[arm]()
                times[arm].append(do_bench(fns[arm], rep=120) * 1e3)
        med = {a: sorted(t)[len(t) // 2] for a, t in times.items()}
        row = dict(shape=[B, H, S, D, causal], us=times, median_us=med,
                   det_over_default={a: med["default"] / med[a] for a in ("ordered", "dqkernel")},
                   repeat_bitwise={a: outs[a + "_repeat_bitwise"] for a in ARMS},
                   ran_ordered={a: outs[a + "_ordered"] for a in ARMS}, rel_to_dqkernel=err)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, do, o, lse, outs
        torch.cuda.empty_cache()
    set_arm("ordered")
    res["ab"] = rows
    json.dump(res, open(os.path.join(OUT, os.environ.get("ABNAME", "bwd-s26-ordered-ab.json")), "w"), indent=1)
    print("shape                    default   ordered  dqkernel   speed vs default (ordered, dqkernel)")
    for r in rows:
        m = r["median_us"]
        print(f"{str(r['shape']):24s} {m['default']:8.0f} {m['ordered']:8.0f} {m['dqkernel']:8.0f}   "
              f"{r['det_over_default']['ordered']:.3f} {r['det_over_default']['dqkernel']:.3f}  "
              f"bitwise {r['repeat_bitwise']}")
if "A" in PART:
    for r in res["correctness"]:
        print(r["shape"], "ordered", r["ordered"], "counts", r["counts_ok"], "bitwise", r["bitwise_over_schedules"],
              "fa", r["fa_ok"], "default_repeats", r["default_dq_repeats_bitwise"], f"dq~{r['dq_vs_default']:.1e}")

if "C" in PART:
    import flashcore.launch.sm90_bwd as L2
    BASEFORM = {c: dict(L2.FUSED_FORM[c]) for c in (False, True)}
    ARMS = {"default": (4, None), "ordered": (4, None), "ord_swz128": (4, 128), "ord_chunk8": (8, None),
            "ord_chunk16": (16, None), "ord_chunk2": (2, None)}
    SHAPES = [(4, 32, 4096, False), (1, 32, 16384, False), (8, 16, 2048, False), (4, 32, 4096, True)]
    ROUNDS = int(os.environ.get("ROUNDS", "3"))

    def set_arm(arm):
        chunk, swz = ARMS[arm]
        L2.HEAD_CHUNK = chunk
        L2.FUSED_FORM = {c: {**BASEFORM[c], **({"dq_swizzle": swz} if swz else {})} for c in (False, True)}
        PLANS.clear()

    rows = []
    for B, H, S, causal in SHAPES:
        D = 128
        g = torch.Generator(device="cuda").manual_seed(int(time.time()) % 100000 + S + causal)
        mk = lambda: torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        q, k, v, do = mk(), mk(), mk(), mk()
        scale = D ** -0.5
        o, lse = flashcore.attention(q, k, v, causal=causal, layout="bshd", return_lse=True)
        fns = {a: (lambda det: (lambda: ops.dense_backward(do, q, k, v, o, lse, None, causal, scale, True, det)))(
            a != "default") for a in ARMS}
        first = {}
        for arm in ARMS:
            set_arm(arm)
            r = fns[arm]()
            first[arm] = r[0].clone()
        same = {a: bool(torch.equal(first[a], first["ordered"])) for a in ARMS if a.startswith("ord")}
        times = {a: [] for a in ARMS}
        for r in range(ROUNDS):
            for arm in ARMS:
                set_arm(arm)
                fns[arm]()
                times[arm].append(do_bench(fns[arm], rep=120) * 1e3)
        med = {a: sorted(t)[len(t) // 2] for a, t in times.items()}
        row = dict(shape=[B, H, S, D, causal], us=times, median_us=med, dq_bitwise_as_ordered=same,
                   over_default={a: med["default"] / med[a] for a in ARMS})
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, do, o, lse
        torch.cuda.empty_cache()
    set_arm("ordered")
    res["arms"] = rows
    json.dump(res, open(os.path.join(OUT, "bwd-s26-ordered-arms.json"), "w"), indent=1)
    print("shape                    " + " ".join(f"{a:>11s}" for a in ARMS) + "  (speed / default's)")
    for r in rows:
        print(f"{str(r['shape']):24s} " + " ".join(f"{r['over_default'][a]:11.3f}" for a in ARMS),
              r["dq_bitwise_as_ordered"])

if "D" in PART:
    import flashcore.launch.sm90_bwd as L2
    BASEFORM = {c: dict(L2.FUSED_FORM[c]) for c in (False, True)}
    ARMS = {"default": {}, "writer": dict(dq_writer=True), "writer_swz128": dict(dq_writer=True, dq_swizzle=128),
            "ordered": None}
    SHAPES = [(4, 32, 32, 4096, False), (4, 32, 32, 4096, True), (1, 32, 32, 16384, False), (1, 32, 32, 16384, True),
              (8, 16, 16, 2048, False), (2, 32, 8, 4096, True)]
    ROUNDS = int(os.environ.get("ROUNDS", "3"))

    def set_arm(arm):
        ov = ARMS[arm] or {}
        L2.FUSED_FORM = {c: {**BASEFORM[c], **ov} for c in (False, True)}
        PLANS.clear()

    rows = []
    for B, H, Hkv, S, causal in SHAPES:
        D = 128
        g = torch.Generator(device="cuda").manual_seed(int(time.time()) % 100000 + S + causal + Hkv)
        mk = lambda h: torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16, generator=g)
        q, k, v, do = mk(H), mk(Hkv), mk(Hkv), mk(H)
        scale = D ** -0.5
        o, lse = flashcore.attention(q, k, v, causal=causal, layout="bshd", return_lse=True)
        fns = {a: (lambda det: (lambda: ops.dense_backward(do, q, k, v, o, lse, None, causal, scale, True, det)))(
            a == "ordered") for a in ARMS}
        qt, kt, vt = (t.float().transpose(1, 2).requires_grad_() for t in (q, k, v))
        ro = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale, enable_gqa=H != Hkv)
        ref = [t.transpose(1, 2) for t in torch.autograd.grad(ro, (qt, kt, vt), do.float().transpose(1, 2))]
        del qt, kt, vt, ro
        err = {}
        for arm in ARMS:
            set_arm(arm)
            r = fns[arm]()
            err[arm] = [rel(a, b) for a, b in zip(r, ref)]
        times = {a: [] for a in ARMS}
        for r in range(ROUNDS):
            for arm in ARMS:
                set_arm(arm)
                fns[arm]()
                times[arm].append(do_bench(fns[arm], rep=120) * 1e3)
        med = {a: sorted(t)[len(t) // 2] for a, t in times.items()}
        row = dict(shape=[B, H, Hkv, S, D, causal], us=times, median_us=med, err_vs_fp32=err,
                   time_over_default={a: med[a] / med["default"] for a in ARMS})
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, do, o, lse, ref
        torch.cuda.empty_cache()
    set_arm("default")
    res["writer_arms"] = rows
    json.dump(res, open(os.path.join(OUT, "bwd-s26-writer-arms.json"), "w"), indent=1)
    print("shape                       " + " ".join(f"{a:>13s}" for a in ARMS) + "  (time / default's)")
    for r in rows:
        print(f"{str(r['shape']):27s} " + " ".join(f"{r['time_over_default'][a]:13.3f}" for a in ARMS),
              " maxerr " + " ".join(f"{max(r['err_vs_fp32'][a]):.1e}" for a in ARMS))
