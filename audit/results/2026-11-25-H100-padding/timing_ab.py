"""Timing A/B of the secure padding variants (FLASHCORE_SECURE_PAD), one process; JSON per run under $OUT."""
import argparse, json, os, sys, time
sys.path.insert(0, "src")
from flashcore.audit import timing

OUT = os.environ.get("OUT", "/tmp/out")
runs = json.loads(sys.argv[1])  # [[label, pad_env, shape_args(list), tests, pairs], ...]
budget_end = time.time() + float(sys.argv[2]) if len(sys.argv) > 2 else 1e18
summary = []
for label, pad, shape, tests, pairs in runs:
    if time.time() > budget_end:
        print(f"## skip {label}: budget", flush=True); continue
    os.environ["FLASHCORE_SECURE_PAD"] = pad
    p = argparse.ArgumentParser(); p.add_argument("--out"); p.add_argument("--json", action="store_true")
    timing.add_arguments(p)
    a = p.parse_args(["--out", f"{OUT}/{label}", *shape, "--tests", tests, "--pairs", str(pairs), "--min-pairs",
                      str(pairs), "--contrast", "none", "--control", "none", "--power-block-s", "0",
                      "--no-save-samples", "--budget-s", "400"])
    t0 = time.time()
    timing.run(a)
    rep = json.load(open(f"{OUT}/{label}/timing.json")) if os.path.exists(f"{OUT}/{label}/timing.json") else None
    if rep is None:
        import glob; print(glob.glob(f"{OUT}/{label}/*")); continue
    for t in rep["tests"]:
        summary.append((label, t["name"], t.get("n_pairs"), t.get("mean_diff_ns"), t.get("max_abs_t"), t.get("paired_t"),
                        (t.get("a") or {}).get("median"), t.get("error")))
    print(f"## {label} done in {time.time()-t0:.0f} s", flush=True)
json.dump(summary, open(f"{OUT}/summary.json", "w"), indent=1)
for r in summary:
    print(f"{r[0]:<14} {r[1]:<40} n={r[2]} diff={r[3] if r[3] is None else round(r[3],1)} |t|={r[4] if r[4] is None else round(r[4],1)} paired={r[5] if r[5] is None else round(r[5],1)} medA={r[6]} err={r[7]}")
