"""The machine code that runs is pinned: every configuration the audit lists (secure and fast forms of the
Triton kernel, the pre-passes, the Gluon kernel) and the Gluon kernel in each switch setting, compiled for
sm_90a on the CPU, must be byte-identical to the digests in tests/data/ for this Triton version. A refactor
must not move a single instruction; a change meant to alter machine code re-pins deliberately
(``python tests/machine_code_digests.py --write``) and says so."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def test_machine_code_matches_the_pinned_digests():
    import triton

    golden = os.path.join(HERE, "data", f"machine_code-triton-{triton.__version__}.json")
    if not os.path.exists(golden):
        pytest.skip(f"no pinned machine code for triton {triton.__version__}: "
                    f"tests/data/{os.path.basename(golden)} is missing (pin it with "
                    f"`python tests/machine_code_digests.py --write`)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, do not interpret
    src = os.path.join(os.path.dirname(HERE), "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, os.path.join(HERE, "machine_code_digests.py")], capture_output=True,
                         text=True, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    now = json.loads(res.stdout)
    with open(golden) as f:
        pinned = json.load(f)
    assert sorted(now) == sorted(pinned), (f"configurations added {sorted(set(now) - set(pinned))}, "
                                           f"dropped {sorted(set(pinned) - set(now))}")
    changed = sorted(n for n in pinned if now[n] != pinned[n])
    assert not changed, f"{len(changed)} configurations compile to different machine code: {changed[:20]}"
