"""The package layout: few top-level modules, and packages that import only downward (no cycle between them)."""

from __future__ import annotations

import ast
from pathlib import Path

import lit_domino

PACKAGE = Path(lit_domino.__file__).resolve().parent

# The layers, top to bottom: a package may import from the ones after it, never from one before it.
LAYERS = ["studies", "training", "lit", "decoding", "interop", "models", "target", "data", "runtime"]


def package_imports() -> dict[str, dict[str, set[str]]]:
    """``{package: {imported package: {file, ...}}}`` over every import of ``lit_domino.<package>`` in the
    package's files, function-level (lazy) imports included."""
    edges: dict[str, dict[str, set[str]]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).parts
        if len(rel) == 1:
            continue  # top-level modules (__init__, testing) sit above the layers
        here = rel[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lit_domino"):
                parts = node.module.split(".")
                names = [a.name for a in node.names] if len(parts) == 1 else [parts[1]]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1] for a in node.names if a.name.startswith("lit_domino.")]
            for name in names:
                if name != here:
                    edges.setdefault(here, {}).setdefault(name, set()).add(str(path.relative_to(PACKAGE)))
    return edges


def test_at_most_eight_top_level_modules():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, modules


def test_every_package_is_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(LAYERS), packages ^ set(LAYERS)


def test_packages_import_only_downward():
    upward = [f"{pkg} imports {dep} ({', '.join(sorted(files))})"
              for pkg, deps in package_imports().items() for dep, files in deps.items()
              if dep in LAYERS and LAYERS.index(dep) < LAYERS.index(pkg)]
    assert not upward, "\n".join(upward)


def test_the_checker_sees_imports():
    """The walk finds the imports it should (a checker that saw none would pass the test above)."""
    edges = package_imports()
    assert "models" in edges["decoding"] and "runtime" in edges["target"]
