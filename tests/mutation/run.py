"""A small mutation-testing runner for flashcore: does the test suite notice when the code is wrong?

    python -m tests.mutation.run --target kernels --budget 40
    python -m tests.mutation.run --target checks --files src/flashcore/_checks.py --budget 60
    python -m tests.mutation.run --target sass --budget 80 --seed 1
    python -m tests.mutation.run --target transformers --budget 40
    python -m tests.mutation.run --target kernels --list            # the candidate mutants, nothing run
    python -m tests.mutation.run --target sass --only ID [ID ...]   # re-run chosen mutants

How it works
------------
1. Mutants are generated automatically from the AST of the target's files (restricted to the functions,
   classes and module-level tables its ``scopes`` name; the whole module when a scope is None). The
   operators (``OPERATORS``):

   * ``cmp``: a comparison's boundary or sense (``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``in``/``not in``,
     ``is``/``is not``): off-by-one bounds and inverted checks;
   * ``binop``: an arithmetic/bitwise operator (``+``/``-``, ``*`` -> ``+``, ``//`` -> ``*``, ``&``/``|``, shifts), also in
     augmented assignments;
   * ``const``: an integer constant +1 and -1, a float constant doubled (0 -> 1), a boolean negated;
   * ``bool``: ``and``/``or`` swapped, a ``not`` or unary minus dropped, an ``if`` condition negated;
   * ``drop-select``: ``tl.where(c, a, b)`` -> ``a`` or ``b`` (a dropped mask), ``tl.minimum/maximum(a, b)``
     and ``min/max(a, b)`` -> ``a`` or ``b`` (a dropped clamp);
   * ``drop-kwarg``: a ``mask=``/``other=`` argument of a load/store removed;
   * ``drop-stmt``: a ``raise`` or a call statement replaced by ``pass`` (a dropped check or update);
   * ``drop-entry``: one string removed from a set/tuple/list literal, or one key from a dict literal (the
     analyser's opcode tables).

   Each mutant is one textual replacement of one AST node's source span (the rest of the file keeps its
   bytes), parenthesised, and must parse and change the AST. Its id is ``file:line:col:operator:n``.
2. The target's files and ``tests/`` are copied to a scratch directory once; the unmutated tests run there
   first (the baseline, which must pass, and whose time sets the default timeout: 3x, at least 60 s).
3. A seeded sample of ``--budget`` mutants is applied one at a time in the copy; the target's test subset
   runs with ``pytest -x`` (ordered so the fast, most specific tests run first) under a timeout, with
   ``TRITON_INTERPRET=1``. Exit code 1 (a test failed) or a timeout: **killed**; 0: **survived**; a
   collection or internal error (the mutant does not import): **killed (error)**.
4. Results go to ``tests/mutation/results-<target>.json`` (every mutant, its diff, status, time, the first
   failing test) and a summary is printed; ``--markdown`` prints the survivors as a table for
   docs/mutation.md, where each survivor is judged (equivalent or not, and which test now kills it).
"""
from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Target:
    name: str
    files: tuple
    #: file -> names (functions, classes, ``Class.method``, module-level assignments) whose code is mutated;
    #: None: the whole module (minus ``exclude``)
    scopes: dict
    #: the test subset, in the order it runs (``pytest -x``: the fastest, most specific tests first)
    tests: tuple
    exclude: dict = field(default_factory=dict)
    note: str = ""


KERNEL = "src/flashcore/kernels/triton/fwd.py"
CHECKS = "src/flashcore/_checks.py"
TAINT = "src/flashcore/audit/sass/taint.py"
ISA = "src/flashcore/audit/sass/isa.py"
HF = "src/flashcore/integrations/transformers.py"

TARGETS = {
    "kernels": Target(
        "kernels", (KERNEL,),
        {KERNEL: ("_load_rows", "_load_kv", "_attn_step", "attn_fwd_kernel")},
        ("tests/test_kernel_memory.py", "tests/test_causal_tiles.py", "tests/test_secure_tiles.py",
         "tests/test_kernel_interpreter.py", "tests/test_compile_and_ops.py", "tests/test_audit_gate.py"),
        note="the portable Triton kernel, run by the interpreter; the static gate for the secure forms"),
    "checks": Target(
        "checks", (CHECKS,), {CHECKS: None},
        ("tests/test_api_errors.py", "tests/test_check_messages.py", "tests/test_kvcache_errors.py",
         "tests/test_call_cache.py", "tests/test_compile_and_ops.py",
         "tests/test_secure_tiles.py", "tests/test_kernel_interpreter.py", "tests/test_kvcache.py"),
        note="the validation layer"),
    "sass": Target(
        "sass", (TAINT, ISA), {TAINT: None, ISA: None},
        ("tests/test_audit_sass_semantics.py", "tests/test_audit_sass_survivors.py", "tests/test_audit_sass_opcodes.py",
         "tests/test_audit_sass.py", "tests/test_audit_gate.py"),
        # explanation only (violation traces and messages, report ordering): not the analysis
        exclude={TAINT: ("_Analyzer._record_why", "_Analyzer._read_reason", "_Analyzer.trace", "_reg_sort_key",
                         "_Env.const_secret_name")},
        note="the SASS taint analyser: abstract interpreter and opcode tables / instruction semantics"),
    "transformers": Target(
        "transformers", (HF,), {HF: None},
        ("tests/test_transformers_integration.py",),
        note="the transformers integration (mask mapping, routing, refusals); needs transformers installed"),
}

OPERATORS = ("cmp", "binop", "const", "bool", "drop-select", "drop-kwarg", "drop-stmt", "drop-entry")

_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mult, ast.Div: ast.Mult,
             ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr,
             ast.LShift: ast.RShift, ast.RShift: ast.LShift}
_SELECTS = {"where": (1, 2), "minimum": (0, 1), "maximum": (0, 1)}  # tl.<name>: the arguments that may replace it
_PY_CLAMPS = {"min", "max"}
_DROPPABLE_KW = {"mask", "other"}


@dataclass
class Mutant:
    id: str
    file: str
    line: int
    col: int
    operator: str
    before: str
    after: str
    start: int  # byte offsets of the replaced span
    end: int
    scope: str


# ------------------------------------------------------------------------------------------------
# generation
# ------------------------------------------------------------------------------------------------


def _line_starts(data: bytes) -> list[int]:
    starts, pos = [0], 0
    for line in data.splitlines(keepends=True):
        pos += len(line)
        starts.append(pos)
    return starts


def _span(node, starts) -> tuple[int, int]:
    return starts[node.lineno - 1] + node.col_offset, starts[node.end_lineno - 1] + node.end_col_offset


def _is_docstring(node, parent) -> bool:
    body = getattr(parent, "body", None)
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            and isinstance(body, list) and body and body[0] is node)


def _scoped_roots(tree: ast.Module, scope, exclude) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of the code to mutate."""
    roots = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [(node.name, node)]
            if isinstance(node, ast.ClassDef):
                names += [(f"{node.name}.{m.name}", m) for m in node.body
                          if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [(t.id, node) for t in targets if isinstance(t, ast.Name)]
        else:
            continue
        for name, n in names:
            if scope is None:
                if name in exclude or "." in name:
                    continue  # methods come with their class (then excluded ones are skipped below)
                roots.append((name, n))
            elif name in scope:
                roots.append((name, n))
    return roots


class _Collector:
    def __init__(self, rel: str, data: bytes, excluded_nodes: set):
        self.rel, self.data, self.starts = rel, data, _line_starts(data)
        self.excluded = excluded_nodes
        self.out: list[tuple[str, ast.AST, str, str]] = []  # (operator, node, replacement text, scope)

    def seg(self, node) -> str:
        a, b = _span(node, self.starts)
        return self.data[a:b].decode()

    def add(self, op, node, text, scope):
        self.out.append((op, node, text, scope))

    def expr(self, op, node, new, scope):
        self.add(op, node, "(" + ast.unparse(new) + ")", scope)

    def visit(self, node, parent, scope, in_skip=False):
        if node in self.excluded:
            return
        if isinstance(node, ast.JoinedStr):
            return  # f-strings: positions inside are unreliable, and messages are not behaviour
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for child in node.body:
                if not _is_docstring(child, node):
                    self.visit(child, node, scope)
            return  # arguments, defaults, annotations, decorators: not mutated
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                if not _is_docstring(child, node):
                    inner = f"{node.name}.{child.name}" if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        else scope
                    self.visit(child, node, inner)
            return
        if isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.visit(node.value, node, scope)
            return
        self.mutate(node, parent, scope)
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.Call) and child is node.func:
                continue
            if isinstance(node, ast.Attribute):
                continue  # ``tl.float32``, ``self.x``: names, not values
            if isinstance(child, (ast.expr_context, ast.operator, ast.cmpop, ast.boolop, ast.unaryop)):
                continue
            self.visit(child, node, scope)

    def mutate(self, node, parent, scope):
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                alt = _CMP_SWAP.get(type(op))
                if alt:
                    new = copy.deepcopy(node)
                    new.ops[i] = alt()
                    self.expr("cmp", node, new, scope)
        elif isinstance(node, ast.BinOp):
            alt = _BIN_SWAP.get(type(node.op))
            if alt:
                new = copy.deepcopy(node)
                new.op = alt()
                self.expr("binop", node, new, scope)
        elif isinstance(node, ast.AugAssign):
            alt = _BIN_SWAP.get(type(node.op))
            if alt:
                new = copy.deepcopy(node)
                new.op = alt()
                self.add("binop", node, ast.unparse(new), scope)
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                self.expr("const", node, ast.Constant(not v), scope)
            elif isinstance(v, int):
                for d in (1, -1):
                    self.expr("const", node, ast.Constant(v + d), scope)
            elif isinstance(v, float):
                self.expr("const", node, ast.Constant(v * 2 if v else 1.0), scope)
        elif isinstance(node, ast.BoolOp):
            new = copy.deepcopy(node)
            new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            self.expr("bool", node, new, scope)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            self.expr("bool" if isinstance(node.op, ast.Not) else "binop", node, node.operand, scope)
        elif isinstance(node, (ast.If, ast.While)) and not isinstance(node.test, ast.Constant):
            self.expr("bool", node.test, ast.UnaryOp(ast.Not(), node.test), scope)
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else None)
            is_tl = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("tl", "gl")
            if is_tl and name in _SELECTS and not node.keywords:
                for i in _SELECTS[name]:
                    if i < len(node.args):
                        self.expr("drop-select", node, node.args[i], scope)
            elif isinstance(f, ast.Name) and name in _PY_CLAMPS and len(node.args) == 2 and not node.keywords:
                for a in node.args:
                    self.expr("drop-select", node, a, scope)
            for k, kw in enumerate(node.keywords):
                if kw.arg in _DROPPABLE_KW:
                    new = copy.deepcopy(node)
                    del new.keywords[k]
                    self.expr("drop-kwarg", node, new, scope)
        elif isinstance(node, (ast.Set, ast.Tuple, ast.List)) and node.elts and \
                all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts) and len(node.elts) > 1:
            for i in range(len(node.elts)):
                new = copy.deepcopy(node)
                del new.elts[i]
                self.expr("drop-entry", node, new, scope)
        elif isinstance(node, ast.Dict) and len(node.keys) > 1 and \
                all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
            for i in range(len(node.keys)):
                new = copy.deepcopy(node)
                del new.keys[i], new.values[i]
                self.expr("drop-entry", node, new, scope)
        if isinstance(node, ast.Raise) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            self.add("drop-stmt", node, "pass", scope)


def generate(rel: str, scope, exclude=()) -> list[Mutant]:
    data = open(os.path.join(ROOT, rel), "rb").read()
    tree = ast.parse(data)
    # methods named in ``exclude`` ("Class.method") are skipped inside their class
    excluded = {m for node in tree.body if isinstance(node, ast.ClassDef) for m in node.body
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and f"{node.name}.{m.name}" in exclude}
    col = _Collector(rel, data, excluded)
    for name, node in _scoped_roots(tree, scope, exclude):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            col.visit(node.value, node, name)
        else:
            col.visit(node, tree, name)
    original = ast.dump(tree)
    mutants, seen = [], set()
    counter: dict = {}
    for op, node, text, scope_name in col.out:
        a, b = _span(node, col.starts)
        new_data = data[:a] + text.encode() + data[b:]
        if new_data in seen:
            continue
        try:
            new_tree = ast.parse(new_data)
        except SyntaxError:
            continue
        if ast.dump(new_tree) == original:
            continue
        seen.add(new_data)
        key = (node.lineno, node.col_offset, op)
        counter[key] = counter.get(key, 0) + 1
        mid = f"{rel}:{node.lineno}:{node.col_offset}:{op}:{counter[key]}"
        mutants.append(Mutant(mid, rel, node.lineno, node.col_offset, op, data[a:b].decode(), text, a, b, scope_name))
    return mutants


_ORIGINALS: dict[str, bytes] = {}  # the unmutated bytes of each target file, read once


def mutated_source(m: Mutant) -> bytes:
    data = _ORIGINALS.get(m.file) or open(os.path.join(ROOT, m.file), "rb").read()
    return data[:m.start] + m.after.encode() + data[m.end:]


def apply(m: Mutant, root: str) -> None:
    """Write the mutant into the copy of the repository at ``root`` (never into the repository itself)."""
    if os.path.abspath(root) == ROOT:
        raise ValueError("mutants are applied to a scratch copy only")
    with open(os.path.join(root, m.file), "wb") as f:
        f.write(mutated_source(m))


# ------------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------------


def _scratch_copy() -> str:
    d = tempfile.mkdtemp(prefix="flashcore-mutation-")
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".hypothesis", "results-*.json", "*.pyc")
    shutil.copytree(os.path.join(ROOT, "src"), os.path.join(d, "src"), ignore=ignore)
    shutil.copytree(os.path.join(ROOT, "tests"), os.path.join(d, "tests"), ignore=ignore)
    for f in ("pyproject.toml",):
        if os.path.exists(os.path.join(ROOT, f)):
            shutil.copy(os.path.join(ROOT, f), d)
    return d


def _run_tests(root: str, tests, timeout: float, extra=()) -> tuple[str, float, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=os.path.join(root, "src"), TRITON_INTERPRET="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONHASHSEED="0")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-W", "ignore",
           "--no-header", "-rN", *extra, *tests]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the pytest run we started, and its children
        proc.communicate()
        return "timeout", time.perf_counter() - t0, f"no result in {timeout:.0f} s"
    dt = time.perf_counter() - t0
    detail = ""
    for line in out.splitlines():
        if re.match(r"^(FAILED|ERROR) ", line) or re.match(r"^tests/\S+ [F]", line):
            detail = line.strip()[:300]
            break
    if not detail:
        m = re.search(r"^(tests/\S+::\S+) FAILED", out, re.M)
        if m:
            detail = m.group(1)
    if proc.returncode == 0:
        return "survived", dt, ""
    if proc.returncode == 1:
        if not detail:
            fails = re.findall(r"^_{3,} (.+?) _{3,}$", out, re.M)
            detail = fails[0] if fails else out.strip().splitlines()[-1][:300]
        return "killed", dt, detail
    tail = " | ".join(out.strip().splitlines()[-3:])[:300]
    return "error", dt, f"pytest exit {proc.returncode}: {tail}"


def _relative(path: str) -> str:
    p = os.path.abspath(path)
    if not p.startswith(ROOT + os.sep):
        raise SystemExit(f"{path}: not inside the repository {ROOT}")
    return os.path.relpath(p, ROOT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.mutation.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, choices=sorted(TARGETS))
    ap.add_argument("--files", nargs="+", help="source files to mutate instead of the target's (whole modules)")
    ap.add_argument("--tests", nargs="+", help="test files / node ids to run instead of the target's")
    ap.add_argument("--budget", type=int, default=30, help="mutants to run, a seeded sample (default 30; 0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--operators", nargs="+", choices=OPERATORS, help="only these mutation operators")
    ap.add_argument("--only", nargs="+", metavar="ID", help="run exactly these mutant ids")
    ap.add_argument("--timeout", type=float, default=None, help="per mutant, seconds (default: 3x baseline, >= 60)")
    ap.add_argument("--list", action="store_true", help="print the candidate mutants and exit")
    ap.add_argument("--out", default=None, help="results JSON (default tests/mutation/results-<target>.json)")
    ap.add_argument("--markdown", action="store_true", help="print the survivors as a markdown table")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy")
    args = ap.parse_args(argv)

    target = TARGETS[args.target]
    files = tuple(_relative(f) for f in args.files) if args.files else target.files
    tests = tuple(args.tests) if args.tests else target.tests
    candidates: list[Mutant] = []
    for rel in files:
        scope = target.scopes.get(rel) if not args.files else None
        candidates += generate(rel, scope, target.exclude.get(rel, ()))
    if args.operators:
        candidates = [m for m in candidates if m.operator in args.operators]
    if args.only:
        by_id = {m.id: m for m in candidates}
        missing = [i for i in args.only if i not in by_id]
        if missing:
            raise SystemExit(f"unknown mutant ids: {missing}")
        chosen = [by_id[i] for i in args.only]
    elif args.budget and args.budget < len(candidates):
        chosen = sorted(random.Random(args.seed).sample(candidates, args.budget), key=lambda m: (m.file, m.start))
    else:
        chosen = candidates
    ops: dict = {}
    for m in candidates:
        ops[m.operator] = ops.get(m.operator, 0) + 1
    print(f"target {target.name}: {len(candidates)} candidate mutants in {', '.join(files)} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(ops.items()))}); running {len(chosen)}", flush=True)
    if args.list:
        for m in (chosen if (args.only or args.budget) else candidates):
            print(f"{m.id}  [{m.scope}]  {m.before[:60]!r} -> {m.after[:60]!r}")
        return 0

    for rel in files:
        _ORIGINALS[rel] = open(os.path.join(ROOT, rel), "rb").read()
    scratch = _scratch_copy()
    results = []
    try:
        status, base_s, detail = _run_tests(scratch, tests, timeout=args.timeout or 1800)
        print(f"baseline: {status} in {base_s:.1f} s {detail}", flush=True)
        if status != "survived":
            raise SystemExit(f"the unmutated tests do not pass in the scratch copy ({status}: {detail})")
        timeout = args.timeout or max(60.0, 3 * base_s)
        t_all = time.perf_counter()
        for i, m in enumerate(chosen, 1):
            apply(m, scratch)
            try:
                status, dt, detail = _run_tests(scratch, tests, timeout)
            finally:
                with open(os.path.join(scratch, m.file), "wb") as f:
                    f.write(_ORIGINALS[m.file])
            results.append(dict(id=m.id, file=m.file, line=m.line, scope=m.scope, operator=m.operator,
                                before=m.before, after=m.after, status=status, seconds=round(dt, 1), detail=detail))
            mark = {"killed": "K", "survived": "S", "timeout": "T", "error": "E"}[status]
            print(f"[{i}/{len(chosen)}] {mark} {dt:6.1f}s {m.id}  {m.before[:50]!r} -> {m.after[:50]!r}"
                  + (f"  :: {detail[:120]}" if status != "survived" else ""), flush=True)
        total_s = time.perf_counter() - t_all
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"scratch copy kept: {scratch}")
    counts = {s: sum(r["status"] == s for r in results) for s in ("killed", "timeout", "error", "survived")}
    killed = counts["killed"] + counts["timeout"] + counts["error"]
    doc = dict(target=target.name, note=target.note, files=list(files), tests=list(tests), seed=args.seed,
               budget=args.budget, operators=args.operators or list(OPERATORS), candidates=len(candidates),
               candidates_by_operator=ops, run=len(results), counts=counts,
               score=round(killed / len(results), 3) if results else None, baseline_s=round(base_s, 1),
               timeout_s=round(timeout, 1), total_s=round(total_s, 1), python=sys.version.split()[0],
               mutants=results)
    out = args.out or os.path.join(HERE, f"results-{target.name}.json")
    if args.only and os.path.exists(out) and not args.out:
        out = os.path.join(HERE, f"results-{target.name}-only.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{target.name}: {killed}/{len(results)} killed ({counts}); {total_s:.0f} s; results in "
          f"{os.path.relpath(out, ROOT)}")
    survivors = [r for r in results if r["status"] == "survived"]
    for r in survivors:
        print(f"  SURVIVED {r['id']}  [{r['scope']}]  {r['before'][:70]!r} -> {r['after'][:70]!r}")
    if args.markdown and survivors:
        print("\n| mutant | scope | before | after |\n|---|---|---|---|")
        for r in survivors:
            b = r["before"].replace("|", "\\|").replace("\n", " ")[:80]
            a = r["after"].replace("|", "\\|").replace("\n", " ")[:80]
            print(f"| `{r['id']}` | {r['scope']} | `{b}` | `{a}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
