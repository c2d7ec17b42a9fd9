"""timing_ab.py with the secure Gluon kernel forced to two consumer warpgroups (block_m=128) at every D."""
import sys, runpy
from dataclasses import replace
sys.path.insert(0, "src")
from flashcore.plan import tables
_orig = tables.gluon_secure
tables.gluon_secure = lambda hd, s=0, c=False: replace(_orig(hd, s, c), block_m=128)
sys.argv = [".dev/timing_ab.py", *sys.argv[1:]]
runpy.run_path(".dev/timing_ab.py", run_name="__main__")
