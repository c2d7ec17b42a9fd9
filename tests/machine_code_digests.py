"""sha256 of the sm_90a machine code (every ``.text.*`` section of the cubin) of each kernel configuration that
``flashcore.audit.specs.audit_specs`` lists (secure and fast), plus the Gluon kernel in each of its switch
settings; compiled on the CPU, no GPU needed. ``tests/test_machine_code.py`` compares them with the digests
pinned in ``tests/data/machine_code-triton-<version>.json``.

A change that is meant to alter machine code re-pins deliberately (and says so in its commit):
    python tests/machine_code_digests.py --write
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import sys
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))


def golden_path() -> str:
    import triton

    return os.path.join(HERE, "data", f"machine_code-triton-{triton.__version__}.json")


def text_digest(cubin: bytes) -> str:
    from flashcore.audit.sass import elf

    secs = elf._sections(cubin)
    h = hashlib.sha256()
    for name in sorted(n for n in secs if n.startswith(".text.")):
        off, size, _ = secs[name]
        h.update(name.encode())
        h.update(cubin[off:off + size])
    return h.hexdigest()


def switch_specs() -> list[dict]:
    """The Gluon kernel in every switch setting and layout the fast path can launch (x_ names)."""
    from flashcore.audit.specs import gluon_spec
    from flashcore.plan import knobs, tables

    out = []

    def add(switches, name, hd, causal, secure=False, block_m=None, key_lens=False, page_size=0):
        with knobs.override(**switches):
            cfg = None
            if block_m is not None:
                base = (tables.gluon_secure if secure else tables.gluon_ws)(hd, 4096, causal)
                cfg = replace(base, block_m=block_m)
            spec = gluon_spec(hd, causal, return_lse=True, cfg=cfg, secure=secure, key_lens=key_lens,
                              page_size=page_size)
        spec["name"] = name
        out.append(spec)

    for hd in (64, 128):
        for causal in (False, True):
            c = "causal" if causal else "full"
            add({}, f"x_fast_d{hd}_{c}_lse_default", hd, causal)
            add({"trace": True}, f"x_fast_d{hd}_{c}_trace", hd, causal)
            add({"early_loads": False, "stagger": 0}, f"x_fast_d{hd}_{c}_noearly_nostagger", hd, causal)
            add({"causal_pairs": False}, f"x_fast_d{hd}_{c}_nopairs", hd, causal)
            add({"fast_sum_mma": True}, f"x_fast_d{hd}_{c}_summma", hd, causal)
            add({}, f"x_fast_d{hd}_{c}_keylens", hd, causal, key_lens=True)  # KV-cache prefill (plan.prefill)
            for page in (16, 128):  # ... from a paged cache: pages smaller than a key tile, and a tile's size
                add({}, f"x_fast_d{hd}_{c}_keylens_page{page}", hd, causal, key_lens=True, page_size=page)
            add({}, f"x_secure_d{hd}_{c}_lse", hd, causal, secure=True)
    for causal in (False, True):
        add({}, f"x_fast_d64_{'causal' if causal else 'full'}_1wg", 64, causal, block_m=64)
        add({}, f"x_fast_d64_{'causal' if causal else 'full'}_3wg", 64, causal, block_m=192)
    # secure D=64 non-causal in both layouts whichever one this Triton launches (tables.SECURE_D64_TWO_WG)
    for wg in (2, 3):
        add({}, f"x_secure_d64_full_{wg}wg", 64, False, secure=True, block_m=64 * wg)
    return out


_SPECS: list = []


def _digest(i: int):
    from flashcore.audit.sass import compile_cubin

    s = _SPECS[i]
    c = compile_cubin(s["fn"], s["signature"], s["constexprs"], num_warps=s["num_warps"], num_stages=s["num_stages"],
                      attrs=s["attrs"], maxnreg=s.get("maxnreg"))
    return s["name"], text_digest(c.cubin)


def digests(jobs: int = 2, only: str | None = None) -> dict:
    from flashcore.audit.specs import audit_specs

    specs = audit_specs(secure=True) + audit_specs(secure=False) + switch_specs()
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise RuntimeError("two specs share a name")
    if only is not None:
        specs = [s for s in specs if only in s["name"]]
    _SPECS[:] = specs
    with mp.get_context("fork").Pool(jobs) as pool:
        return dict(sorted(pool.imap(_digest, range(len(specs)))))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="re-pin: write the digests to the golden file")
    p.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    p.add_argument("--only", metavar="TEXT", help="only the configurations whose name contains TEXT (with --write: "
                   "re-pin those and keep every other pinned digest); prints which of them changed")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET=1 (Gluon's front end does not compile after the interpreter)")
    d = digests(a.jobs, a.only)
    if a.only is not None:
        with open(golden_path()) as f:
            pinned = json.load(f)
        changed = sorted(n for n in d if pinned.get(n) != d[n])
        gone = sorted(n for n in pinned if a.only in n and n not in d)
        print(f"{len(d)} configurations match {a.only!r}; {len(changed)} differ from the pins: {changed}; "
              f"{len(gone)} pinned ones are no longer listed: {gone}", file=sys.stderr)
        # the matching pins are replaced as a set: a configuration the list no longer has is dropped
        d = dict(sorted({**{n: v for n, v in pinned.items() if a.only not in n}, **d}.items()))
    if a.write:
        with open(golden_path(), "w") as f:
            json.dump(d, f, indent=1)
            f.write("\n")
    json.dump(d, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
