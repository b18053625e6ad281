"""The package's shape: subpackages by step of the data flow, no import circle, small modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "seq2seq_eval"
MAX_LINES = 400
STEPS = ("inputs", "model", "run", "engines", "outputs", "scoring", "comparison")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every seq2seq_eval module `path` imports, at module level or inside a function: a circle
    through a function-level import is still a circle for the reader."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "seq2seq_eval":
                continue
            for alias in node.names:  # `from . import x` imports the module x
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "seq2seq_eval")
    return {m for m in found if m in MODULES and m != name}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def circles() -> list[list[str]]:
    graph = {name: imports_of(path) for name, path in MODULES.items()}
    # A package's __init__ runs before its submodules; an edge to a package is an edge to its
    # __init__ only, which holds no code here (checked below), so packages are left out.
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def test_no_import_circle():
    assert circles() == []


def test_a_found_circle_is_reported(monkeypatch):
    """The checker itself: a made-up edge from a low module back up is found."""
    real = imports_of
    monkeypatch.setattr(__import__(__name__), "imports_of",
                        lambda p: real(p) | ({"seq2seq_eval.run.runner"} if module_name(p) == "seq2seq_eval.errors" else set()))
    assert any("seq2seq_eval.errors" in c and "seq2seq_eval.run.runner" in c for c in circles())


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_are_small(name):
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(PACKAGE.parent)}: {lines} lines"


def test_the_tree_shows_the_data_flow():
    assert all((PACKAGE / step / "__init__.py").is_file() for step in STEPS)
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    # At the top: the entry points, the config and what every step shares (version: read by the
    # package and by the provenance the outputs step writes, without importing the package;
    # numerics: MKL's mode, set by the run and by a model metric before their models run; pickles:
    # torch files read without running code, by the model step and by the model metrics alike;
    # trainer_view: what the callback reads of a Trainer's own loop; pandas_probe: pandas kept out
    # of the tool's own processes, by __main__, and let back in by the inputs step for datasets).
    assert top == ["__init__", "__main__", "api", "atomic", "callback", "cli", "config", "errors", "legacy", "mapped",
                   "numerics", "options", "pandas_probe", "pickles", "trainer_view", "version"]
    # A subpackage's __init__ says what the step is, and runs no code (engines/__init__ is the
    # registry of engines, which the rest of the package calls).
    for step in (s for s in STEPS if s != "engines"):
        tree = ast.parse((PACKAGE / step / "__init__.py").read_text(encoding="utf-8"))
        assert ast.get_docstring(tree) and all(isinstance(n, ast.Expr) for n in tree.body), step
