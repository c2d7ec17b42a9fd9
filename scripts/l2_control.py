"""Hardware control for the counters gate: does the H100's L2 sector count depend on the *values*
being copied? A plain torch elementwise kernel, y = |x| (no flashcore code), of one bf16 buffer, filled per class, profiled
under ncu with the counters gate's flags. Run:

    ncu --target-processes all --profile-from-start off --clock-control none --cache-control all \\
        --metrics lts__t_sectors.sum,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_ltcfabric.sum,dram__bytes_read.sum --csv \\
        python scripts/l2_control.py
"""
import torch

N = 1 << 22  # 8 MiB of bf16
REPS = 8
CLASSES = ("random", "zeros", "pm_inf", "nan", "ones")
x = torch.empty(N, dtype=torch.bfloat16, device="cuda")
y = torch.empty_like(x)
g = torch.Generator(device="cuda").manual_seed(0)


def fill(name):
    if name == "random":
        x.normal_(generator=g)
    elif name == "zeros":
        x.zero_()
    elif name == "pm_inf":
        x.copy_(torch.where(torch.rand(N, device="cuda", generator=g) < 0.5, float("inf"), float("-inf")))
    elif name == "nan":
        x.fill_(float("nan"))
    else:
        x.fill_(1.0)


for rep in range(REPS):
    for name in CLASSES:
        fill(name)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        torch.abs(x, out=y)  # a kernel (y.copy_(x) would be a copy-engine memcpy)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"launch rep={rep} class={name}", flush=True)
