"""What runs is pinned: for 1,468 problems on each of sm_90, sm_80 and the interpreter, the planner's output
(kernel, grid, scalars, constexprs, warps, stages, options, pre-pass, descriptor geometry) must match the
digests pinned in tests/data/plans.json (taken before the layout move, 9875aa0). A change meant to alter
what runs re-pins deliberately (``python tests/plan_digests.py --write``) and says so. Under another Triton than
3.6, that version's differences (tests/data/plans-triton-<major.minor>.json) are pinned on top."""
from plan_digests import digests, pinned


def test_plans_match_the_pinned_digests():
    now = digests()
    for arch, plans in pinned().items():
        assert sorted(now[arch]) == sorted(plans), f"{arch}: problems added or dropped"
        changed = sorted(n for n in plans if now[arch][n] != plans[n])
        assert not changed, f"{arch}: {len(changed)} problems plan differently: {changed[:10]}"
