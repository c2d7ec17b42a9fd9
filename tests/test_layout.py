"""The layout's rules (docs/design.md), checked on the source: no import cycles (function-level imports
included), host and device code apart, one architecture test, no script that edits sys.path or clears a
cache, and the docs' capability table generated from the kernels' declarations."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
PKG = os.path.join(SRC, "flashcore")


def _modules():
    """{module name: path} of every module in the package."""
    out = {}
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), SRC)[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


def _imports(name, path, modules):
    """flashcore modules that ``name`` imports anywhere (module level or inside functions)."""
    tree = ast.parse(open(path).read())
    is_pkg = path.endswith("__init__.py")
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t.startswith("flashcore") and t != name:
                found.add(t)
    return found


def _graph():
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def _cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _ancestor_packages(m):
    parts = m.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_cycles():
    graph = _graph()
    # a module importing its own parent package is how Python loads it, not a cycle of ours
    graph = {m: {t for t in ts if t not in _ancestor_packages(m)} for m, ts in graph.items()}
    assert _cycles(graph) == []


def test_the_cycle_check_sees_function_level_imports(tmp_path):
    """The check above must catch a cycle closed by an import inside a function (a lazy import that dodges
    a cycle at load time)."""
    a = tmp_path / "a.py"
    a.write_text("from . import b\n")
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from . import a\n")
    mods = {"flashcore.x.a": str(a), "flashcore.x.b": str(b), "flashcore.x": str(tmp_path / "__init__.py")}
    graph = {m: _imports(m, p, mods) for m, p in mods.items() if m != "flashcore.x"}
    assert _cycles(graph) == [["flashcore.x.a", "flashcore.x.b"]]


def _is_jit(node) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr == "jit" for d in getattr(node, "decorator_list", ()))


def test_host_and_device_code_live_in_different_modules():
    """A module with kernels holds kernels and constants only (and, in flashcore.kernels, its capability
    declaration); flashcore.kernels imports nothing outside itself and no torch (host code)."""
    mods = _modules()
    for name, path in mods.items():
        text = open(path).read()
        tree = ast.parse(text)
        defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        if any(_is_jit(n) for n in defs):
            host = [n.name for n in defs if not _is_jit(n)]
            assert not host, f"{name} mixes host code ({host}) with device code"
        if name.startswith("flashcore.kernels"):
            deps = _imports(name, path, mods)
            assert all(d.startswith("flashcore.kernels") for d in deps), (name, deps)
            assert not re.search(r"^\s*(import torch|from torch)", text, re.M), f"{name} imports torch (host code)"
        elif any(_is_jit(n) for n in defs):
            assert name.startswith("flashcore.bench.unfused"), f"{name}: flashcore's kernels live in flashcore.kernels"


def test_one_architecture_test():
    """``arch[0] == 9`` is decided in one place (plan.tables.is_hopper)."""
    hits = [n for n, p in _modules().items() if re.search(r"arch\[0\]\s*==", open(p).read())]
    assert hits == ["flashcore.plan.tables"]


def test_no_script_edits_sys_path_or_clears_caches():
    offenders = []
    for base in (os.path.join(ROOT, "scripts"), PKG):
        for dirpath, _, files in os.walk(base):
            for f in files:
                if f.endswith(".py"):
                    text = open(os.path.join(dirpath, f)).read()
                    if "sys.path" in text or re.search(r"PLANS\.clear\(|\b_PLANS\b|\b_CALLS\b", text):
                        offenders.append(os.path.relpath(os.path.join(dirpath, f), ROOT))
    assert offenders == ["src/flashcore/plan/cache.py"] or offenders == [], offenders


def test_design_doc_carries_the_declared_capabilities():
    from flashcore.kernels import capability_table

    doc = open(os.path.join(ROOT, "docs", "design.md")).read()
    block = re.search(r"<!-- capability-table[^>]*-->\n(.*?)\n<!-- /capability-table -->", doc, re.S)
    assert block and block.group(1).strip() == capability_table().strip(), \
        "docs/design.md's capability table is stale: paste flashcore.kernels.capability_table()"


def test_validation_reads_the_declarations():
    """The head dims and dtypes the entry points accept are the union of what the forward kernels declare."""
    from flashcore import _checks
    from flashcore.kernels import FORWARD

    assert set(_checks.SUPPORTED_HEAD_DIMS) == {d for c in FORWARD for d in c.head_dims}
    names = {str(d).rpartition(".")[2] for d in _checks.FLOAT_DTYPES}
    assert names == {"float16", "bfloat16", "float32"}


def test_readme_layout_lists_every_package():
    readme = open(os.path.join(ROOT, "README.md")).read()
    layout = readme[readme.index("## Layout"):]
    for dirpath, dirs, files in os.walk(PKG):
        if "__init__.py" in files and dirpath != PKG:
            rel = os.path.relpath(dirpath, PKG).replace(os.sep, "/")
            assert f"{rel}/" in layout or f"{rel.rpartition('/')[2]}/" in layout, f"README's Layout misses {rel}/"
