import os, torch, statistics, json
import flashcore
from flashcore.ops import PLANS
from torch.profiler import ProfilerActivity, profile
dev="cuda"
S=4096
q=torch.randn(1,1,32,128,device=dev,dtype=torch.bfloat16)
k=torch.randn(1,S,8,128,device=dev,dtype=torch.bfloat16); v=torch.randn_like(k)
lens=torch.full((1,),S,dtype=torch.int32,device=dev)
for mode in ("off","on:3","on:1"):
    os.environ["FLASHCORE_DECODE_MERGE"]=mode.split(":")[0]
    if ":" in mode: os.environ["FLASHCORE_DECODE_MERGE_FORM"]=mode.split(":")[1]
    f=lambda: flashcore.attention_with_kvcache(q,k,v,cache_seqlens=lens,validate=False)
    for _ in range(5): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(3_000_000)
        for i in range(50): f()
        torch.cuda.synchronize()
    kinds={}
    for e in prof.events():
        if e.device_type.name=="CUDA" and "sleep" not in e.name.lower():
            kinds.setdefault(e.name,[]).append(e.device_time)
    print(mode, {k_:(len(v_), round(statistics.median(v_),2)) for k_,v_ in kinds.items()})
# the compiled kernels of the plans
for key, plan in list(PLANS._data.items()) if hasattr(PLANS,'_data') else []:
    pass
from flashcore.runtime.launcher import _LAUNCHED
for cls,(kern,tail) in _LAUNCHED.items():
    name = kern.name if hasattr(kern,'name') else str(kern)
    print(name, "regs", getattr(kern,'n_regs',None), "spills", getattr(kern,'n_spills',None), "smem", getattr(kern.metadata,'shared',None), "warps", getattr(kern.metadata,'num_warps',None))
