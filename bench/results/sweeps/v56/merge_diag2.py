import os, torch, statistics
import flashcore
from flashcore.bench.timing import Timer, cuda_graph_us
from torch.profiler import ProfilerActivity, profile
dev="cuda"; S=4096
sets=[]
for i in range(8):
    q=torch.randn(1,1,32,128,device=dev,dtype=torch.bfloat16)
    k=torch.randn(1,S,8,128,device=dev,dtype=torch.bfloat16); v=torch.randn_like(k)
    sets.append((q,k,v,torch.full((1,),S,dtype=torch.int32,device=dev)))
timer=Timer()
for mode in ("off","on","off","on"):
    os.environ["FLASHCORE_DECODE_MERGE"]=mode
    fns=[lambda a=a: flashcore.attention_with_kvcache(a[0],a[1],a[2],cache_seqlens=a[3],validate=False) for a in sets]
    for f in fns: f()
    torch.cuda.synchronize()
    one = timer.stats(fns[:1], flush=False)["median_us"]
    rot = timer.stats(fns, flush=False)["median_us"]
    g = cuda_graph_us(fns, calls=20)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(3_000_000)
        for i in range(48): fns[i%8]()
        torch.cuda.synchronize()
    kinds={}
    evs=sorted([e for e in prof.events() if e.device_type.name=="CUDA" and "sleep" not in e.name.lower()], key=lambda e:e.time_range.start)
    for e in evs: kinds.setdefault(e.name,[]).append(e.device_time)
    span=(evs[-1].time_range.end-evs[8].time_range.start)/40 if len(evs)>10 else None
    print(mode, "timer one-set", round(one,2), "rotating", round(rot,2), "graph", round(g,2), {k_[:24]:(len(v_), round(statistics.median(v_),2)) for k_,v_ in kinds.items()}, "profiled span/call", span, flush=True)
