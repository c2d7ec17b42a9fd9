"""What runs is pinned: for 1,468 problems on each of sm_90, sm_80 and the interpreter, the planner's output
(kernel, grid, scalars, constexprs, warps, stages, options, pre-pass, descriptor geometry) must match the
digests pinned in tests/data/plans.json (taken before the layout move, 9875aa0). A change meant to alter
what runs re-pins deliberately (``python tests/plan_digests.py --write``) and says so."""
import json

from plan_digests import PINNED, digests


def test_plans_match_the_pinned_digests():
    now = digests()
    with open(PINNED) as f:
        pinned = json.load(f)
    for arch, plans in pinned.items():
        assert sorted(now[arch]) == sorted(plans), f"{arch}: problems added or dropped"
        changed = sorted(n for n in plans if now[arch][n] != plans[n])
        assert not changed, f"{arch}: {len(changed)} problems plan differently: {changed[:10]}"
