"""``flashcore audit sass [--out DIR] [--json PATH] [--include-fast] [--jobs N] [--show N] [--no-progress]
[--reuse REPORT [--verify N]]``: audit every configuration that ``flashcore.audit.specs.audit_specs`` lists and
print the results (the secure configurations gate, the fast ones, with ``--include-fast``, are information).

``--reuse REPORT`` takes the clean analyses of an earlier JSON report for kernels whose machine code, inputs and
analyser are the same as the ones it analysed (every non-debug section of the cubin: :mod:`.memo`); every kernel is still compiled and its launch
checked. ``--verify N`` then analyses N of the reused kernels again, picked at random, and fails the gate if any
result differs.

The table goes to stdout; the JSON report to ``--json PATH`` (``flashcore audit sass`` defaults it to
``<out>/sass.json``; ``python -m flashcore.audit.sass`` writes none without it). Progress goes to stderr:
a ``rich`` progress bar on a terminal, otherwise one plain line every ``--progress-every`` kernels (CI
logs); ``--no-progress`` turns it off."""
from __future__ import annotations

import argparse
import os
import sys
import time

from . import memo
from .analyze import audit_kernels
from .report import Report


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="write the full JSON report to the file PATH, gzip-compressed where PATH ends in .gz (the "
                             "table is printed either way)")
    parser.add_argument("--include-fast", action="store_true",
                        help="also audit the fast (non-DHP) kernels; their findings are reported, never fatal")
    parser.add_argument("--jobs", "-j", type=int, default=min(8, os.cpu_count() or 1), metavar="N",
                        help="parallel compile/analysis processes (default: CPU count, at most 8)")
    parser.add_argument("--show", type=int, default=8, metavar="N",
                        help="violations to print per kernel (default 8; 0 = none)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress on stderr (default: a progress bar on a terminal, else a line every "
                             "--progress-every kernels)")
    parser.add_argument("--progress-every", type=_positive_int, default=PROGRESS_EVERY, metavar="N",
                        help=f"not on a terminal: print a progress line every N kernels (default {PROGRESS_EVERY})")
    parser.add_argument("--reuse", metavar="REPORT", default=None,
                        help="take the clean analyses of this earlier JSON report (gzip where its name ends in "
                             ".gz) for the same machine code under the same analyser (its analysis keys); "
                             "everything else is analysed")
    parser.add_argument("--verify", type=int, default=0, metavar="N",
                        help="with --reuse: analyse N reused kernels again, picked at random, and fail on any "
                             "difference (default 0)")
    return parser


PROGRESS_EVERY = 10


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--progress-every must be a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"--progress-every must be a positive integer, got {n}")
    return n


def _stderr_console():
    """A rich console on stderr, or None when rich is unavailable."""
    try:
        from rich.console import Console
    except Exception:  # pragma: no cover
        return None
    return Console(stderr=True)


class _Progress:
    """Progress over ``total`` kernels on stderr: a rich bar on a terminal, else a plain line every ``every``
    kernels and at the end (CI logs). Use as a context manager; ``update`` is ``audit_kernels``' callback."""

    def __init__(self, label: str, total: int, every: int, enabled: bool = True):
        self.label, self.total, self.every, self.t0 = label, total, max(1, every), time.perf_counter()
        self.bar = self.task = None
        self.enabled = enabled and total > 0
        console = _stderr_console() if self.enabled else None
        if console is not None and console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=console, transient=True)

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
            self.task = self.bar.add_task(f"audit sass: {self.label}", total=self.total)
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False

    def update(self, done: int, total: int, report: Report) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=done, description=f"audit sass: {self.label} ({report.name or report.kernel})")
        elif done % self.every == 0 or done == total:
            print(f"flashcore audit sass: {self.label}: {done}/{total} kernels analysed "
                  f"({time.perf_counter() - self.t0:.0f}s)", file=sys.stderr, flush=True)


def _table(title: str, reports: list[Report], console, informational: bool = False) -> None:
    if console is not None:
        from rich.table import Table

        t = Table(title=title, show_lines=False, pad_edge=False, box=None, header_style="bold")
        t.add_column("config", no_wrap=True)
        t.add_column("w/s", no_wrap=True)
        t.add_column("instrs", justify="right", no_wrap=True)
        t.add_column("blocks", justify="right", no_wrap=True)
        t.add_column("violations", no_wrap=True)
        t.add_column("unk", justify="right", no_wrap=True)
        t.add_column("status", no_wrap=True)
        for r in reports:
            status = "[green]OK[/]" if r.ok else ("[red]ERROR[/]" if r.error else
                                                  ("[yellow]findings[/]" if informational else "[red]FAIL[/]"))
            viol = ", ".join(f"{k}={v}" for k, v in r.counts().items()) or "-"
            label = r.name or r.kernel
            if r.name and r.kernel and r.kernel not in r.name:
                label += f" ({r.kernel})"
            t.add_row(label, f"{r.num_warps}/{r.num_stages}", str(r.n_instructions), str(r.n_blocks), viol,
                      str(sum(r.unknown_opcodes.values())), status)
        console.print(t)
    else:
        print(title)
        for r in reports:
            status = "OK" if r.ok else ("ERROR" if r.error else ("findings" if informational else "FAIL"))
            viol = ", ".join(f"{k}={v}" for k, v in r.counts().items()) or "-"
            print(f"  {status:<5} {(r.name or r.kernel):<40} w{r.num_warps}/s{r.num_stages} "
                  f"{r.n_instructions:>6} instrs {r.n_blocks:>4} blocks  {viol}")


def _details(reports: list[Report], show: int, out) -> None:
    for r in reports:
        if r.error:
            print(f"{r.name or r.kernel}: ERROR {r.error}", file=out)
            continue
        if not r.violations or show <= 0:
            continue
        print(f"{r.name or r.kernel}: {len(r.violations)} violation(s)", file=out)
        for k, v in enumerate(r.violations[:show]):
            print(f"    {v}", file=out)
            if k == 0:
                for t in v.trace:
                    print(f"        {t}", file=out)
        if len(r.violations) > show:
            print(f"    ... {len(r.violations) - show} more (see --json)", file=out)


def _verify(specs: list[dict], reports: list[Report], n: int, jobs: int) -> list[str]:
    """Analyse ``n`` of the reused reports again (fresh, no memo), picked at random; the names whose analysis
    differs from the one taken, each with the fields that differ."""
    import random

    reused = [i for i, r in enumerate(reports) if r.reused]
    if n <= 0 or not reused:
        return []
    seed = random.SystemRandom().randrange(1 << 32)
    picked = sorted(random.Random(seed).sample(reused, min(n, len(reused))))
    print(f"flashcore audit sass: --verify: analysing {len(picked)} reused kernels again (seed {seed})",
          file=sys.stderr)
    fresh = audit_kernels([specs[i] for i in picked], jobs=jobs)
    failures = []
    for i, rep in zip(picked, fresh):
        diff = memo.differences(reports[i], rep)
        if diff:
            failures.append(f"{reports[i].name}: {', '.join(diff)}")
            print(f"flashcore audit sass: --verify: {reports[i].name}: the reused analysis differs from a fresh one "
                  f"in {diff}", file=sys.stderr)
    return failures


def run(args: argparse.Namespace) -> int:
    try:
        from flashcore.audit.specs import audit_specs  # lazy: imports the kernels
    except Exception as e:  # noqa: BLE001
        print(f"flashcore audit sass: cannot import flashcore.audit.specs.audit_specs: {e}", file=sys.stderr)
        return 2
    try:
        from rich.console import Console

        console = Console()
        if not console.is_terminal:
            console = Console(width=200)
    except Exception:  # pragma: no cover
        console = None
    verify, reuse = int(getattr(args, "verify", 0) or 0), getattr(args, "reuse", None)
    if verify < 0 or (verify and not reuse):
        print(f"flashcore audit sass: --verify must be a count >= 0 and needs --reuse REPORT (got --verify {verify}"
              f"{'' if reuse else ' without --reuse'})", file=sys.stderr)
        return 2
    if reuse and not os.path.isfile(reuse):
        print(f"flashcore audit sass: --reuse {reuse}: no such file", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        secure_specs = list(audit_specs(secure=True))
        fast_specs = list(audit_specs(secure=False)) if getattr(args, "include_fast", False) else []
    except Exception as e:  # noqa: BLE001
        print(f"flashcore audit sass: audit_specs() failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    jobs = max(1, int(getattr(args, "jobs", 1) or 1))
    show_progress = not getattr(args, "no_progress", False)
    every = getattr(args, "progress_every", PROGRESS_EVERY)
    taken = memo.load(reuse) if reuse else {}
    if reuse:
        print(f"flashcore audit sass: --reuse {reuse}: {len(taken)} clean analyses with keys", file=sys.stderr)
    memo.activate(taken)
    try:
        with _Progress("secure", len(secure_specs), every, show_progress) as prog:
            secure = audit_kernels(secure_specs, jobs=jobs, progress=prog.update)
        fast: list[Report] = []
        if fast_specs:
            with _Progress("fast", len(fast_specs), every, show_progress) as prog:
                fast = audit_kernels(fast_specs, jobs=jobs, progress=prog.update)
    finally:
        memo.activate(None)
    verify_failures = _verify(secure_specs + fast_specs, secure + fast, verify, jobs)
    show = getattr(args, "show", 8)
    _table("DHP-safe (secure) kernels - must be violation-free", secure, console)
    _details(secure, show, sys.stdout)
    if fast:
        _table("fast kernels - informational (secret-dependent behaviour expected)", fast, console, informational=True)
        _details(fast, min(show, 3), sys.stdout)
    gate_ok = bool(secure) and all(r.ok for r in secure) and not verify_failures
    if not secure:
        print("flashcore audit sass: audit_specs(secure=True) returned no kernels - refusing to pass an empty gate",
              file=sys.stderr)
    elapsed = time.perf_counter() - t0
    n_reused = sum(r.reused for r in secure + fast)
    summary = (f"secure: {sum(r.ok for r in secure)}/{len(secure)} clean"
               + (f"; fast: {sum(not r.ok for r in fast)}/{len(fast)} with findings" if fast else "")
               + (f"; {n_reused} analyses reused from {reuse}" if reuse else "")
               + (f", {verify} re-analysed: {len(verify_failures)} differ" if reuse and verify else "")
               + f" ({elapsed:.1f}s)")
    print(("PASS " if gate_ok else "FAIL ") + summary)
    if getattr(args, "json", None):
        doc = {"ok": gate_ok, "secure": [r.to_dict() for r in secure], "fast": [r.to_dict() for r in fast],
               "elapsed_s": round(elapsed, 3), "reused_from": reuse, "reused": n_reused,
               "verify_failures": verify_failures, "analyser": memo.analyser_fingerprint()}
        memo.write_report(args.json, doc)
    return 0 if gate_ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashcore audit sass",
                                     description="Static SASS taint audit of the DHP-safe kernels (sm_90a, no GPU).")
    add_arguments(parser)
    return run(parser.parse_args(argv))

