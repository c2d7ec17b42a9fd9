"""Hardware control for the counters gate's FP8 decode class effect (docs/security.md §5.17): do the L2's counts of
the SMs' requests depend on the *values* an FP8 cache holds, when the kernel that reads it does nothing with them?

A Triton kernel streams two FP8 caches shaped as gate 2's decode case (4,096 positions x 8 K/V heads x 128 bytes) in
the secure split form's pattern: a program per (K/V head, split of 256 positions), 128-position tiles through a
3-stage cp.async pipeline, 4 warps. It folds the bytes together by XOR, whose time does not depend on them, and
stores one tile per program. So its requests, their addresses and its instruction counts are fixed; only the data
differ by class. Classes as gate 2's padding family: every class has the same first 2,048 positions (N(0,1) as
e4m3); the other 2,048 hold N(0,1) of another seed (`random_pad`), 0x7F (`nan_pad`), +448/-448 alternating along
the row (`inf_pad`: what gate 2's +-Inf padding becomes in e4m3) or zeros (`zeros_pad`). `--pages` reads the
positions through a shuffled table of 128-position pages, as gate 2's page-128 run does.

Run under ncu with the counters gate's flags (one launch per class and repetition, classes interleaved):

    ncu --target-processes all --profile-from-start off --clock-control none --cache-control all --csv \\
        --log-file OUT.csv --metrics lts__t_requests_srcunit_tex.sum,lts__t_sectors_srcunit_tex.sum,\\
        lts__t_sectors.sum,lts__t_sectors_srcunit_ltcfabric.sum,dram__bytes_read.sum,smsp__inst_executed.sum \\
        python scripts/l2_control_fp8.py [--pages]
    python scripts/l2_control_fp8.py --summarize OUT.csv
"""
import argparse
import csv
import statistics
import sys

CLASSES = ("random_pad", "nan_pad", "inf_pad", "zeros_pad", "random_pad_b")
REPS = 6
S, HKV, D, SPLIT, TILE = 4096, 8, 128, 256, 128


def run(pages: bool) -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def stream_kernel(k_ptr, v_ptr, table_ptr, out_ptr, ROW_BYTES: tl.constexpr, TILE: tl.constexpr,
                      SPLIT: tl.constexpr, D: tl.constexpr, STAGES: tl.constexpr):
        head = tl.program_id(0)
        split = tl.program_id(1)
        acc = tl.zeros([TILE, D], dtype=tl.int32)
        rows = tl.arange(0, TILE)
        cols = tl.arange(0, D)
        for t in tl.range(0, SPLIT // TILE, num_stages=STAGES):
            page = tl.load(table_ptr + split * (SPLIT // TILE) + t)  # a public page per 128-position tile
            offs = (page * TILE + rows)[:, None] * ROW_BYTES + head * D + cols[None, :]
            k = tl.load(k_ptr + offs)
            v = tl.load(v_ptr + offs)
            acc ^= k.to(tl.int32) ^ v.to(tl.int32)
        out = out_ptr + ((head * tl.num_programs(1) + split) * TILE + rows)[:, None] * D + cols[None, :]
        tl.store(out, acc)

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    head_rows = torch.randn(S // 2, HKV, D, device=dev, generator=g)  # the valid half, every class
    k = torch.empty(S, HKV, D, dtype=torch.uint8, device=dev)
    v = torch.empty_like(k)
    n_pages = S // TILE
    order = torch.arange(n_pages, device=dev)
    if pages:
        order = torch.randperm(n_pages, device=dev, generator=g)
    table = order.to(torch.int32)
    out = torch.empty(HKV * (S // SPLIT) * TILE, D, dtype=torch.int32, device=dev)
    sign = torch.where(torch.arange(D, device=dev) % 2 == 0, 448.0, -448.0)

    def e4m3(x):
        return x.to(torch.float8_e4m3fn).view(torch.uint8)

    def fill(name: str, t: "torch.Tensor", salt: int) -> None:
        t[: S // 2] = e4m3(head_rows * (1 + salt))
        gen = torch.Generator(device=dev).manual_seed(1 + salt + (100 if name.endswith("_b") else 0))
        if name.startswith("random_pad"):
            t[S // 2:] = e4m3(torch.randn(S // 2, HKV, D, device=dev, generator=gen))
        elif name == "nan_pad":
            t[S // 2:] = 0x7F
        elif name == "inf_pad":
            t[S // 2:] = e4m3(sign.expand(S // 2, HKV, D))
        else:
            t[S // 2:] = 0

    grid = (HKV, S // SPLIT)
    args = dict(ROW_BYTES=HKV * D, TILE=TILE, SPLIT=SPLIT, D=D, STAGES=3, num_warps=4)
    stream_kernel[grid](k, v, table, out, **args)  # compile outside the profiled range
    torch.cuda.synchronize()
    for rep in range(REPS):
        for name in CLASSES:
            fill(name, k, 0)
            fill(name, v, 1)
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            stream_kernel[grid](k, v, table, out, **args)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"launch rep={rep} class={name}", flush=True)


def summarize(path: str) -> None:
    """Per class: mean and spread of each metric, launches taken in the order run() made them."""
    with open(path) as f:
        rows = [r for r in csv.reader(f) if len(r) > 5]
    head = rows[0]
    idx = {name: head.index(name) for name in ("ID", "Metric Name", "Metric Value")}
    values = {}
    for r in rows[1:]:
        if r[idx["ID"]].isdigit():
            value = float(r[idx["Metric Value"]].replace(",", ""))
            values.setdefault(r[idx["Metric Name"]], {})[int(r[idx["ID"]])] = value
    for metric, by_id in sorted(values.items()):
        ids = sorted(by_id)
        per = {c: [by_id[i] for n, i in enumerate(ids) if CLASSES[n % len(CLASSES)] == c] for c in CLASSES}
        cells = "  ".join(f"{c} {statistics.mean(x):,.0f}±{(max(x) - min(x)):,.0f}" for c, x in per.items() if x)
        print(f"{metric}: {cells}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", action="store_true", help="read through a shuffled table of 128-position pages")
    p.add_argument("--summarize", metavar="CSV", help="print per-class statistics of an ncu CSV log instead")
    a = p.parse_args()
    summarize(a.summarize) if a.summarize else run(a.pages)
    sys.exit(0)
