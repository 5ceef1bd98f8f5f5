"""Every doc names only files inside the repository: the paths and links in README.md, docs/*.md and the
analysis notebook's Markdown exist (a moved module shows up here, not in a user's shell)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("lit_domino", "experiments", "tests", "docs", "sweeps", "notebooks")
"""The repository folders whose paths the docs cite (``results/``, ``artifacts/`` are made by runs)."""
PATH = re.compile(r"(?<![\w/.<-])((?:%s)/[\w./<>*{}|-]*)" % "|".join(TOP))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
MODULE = re.compile(r"\blit_domino(?:\.[A-Za-z_]\w*)+")
PLACEHOLDER = re.compile(r"[<*{|]|\.\.\.")
"""A path with ``<name>``, a glob, ``{a,b}`` or ``...`` names a family of files: its folder must exist."""


def docs() -> dict[str, str]:
    """Each doc's Markdown text by its repository path."""
    out = {"README.md": (ROOT / "README.md").read_text()}
    out.update({f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))})
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        out[f"notebooks/{nb.name}"] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return out


def cited_paths(text: str) -> set[str]:
    """The repository paths a Markdown text names: ``lit_domino/target/load.py``, ``tests/decoding/``, ..."""
    out = set()
    for m in PATH.finditer(text):
        path = m.group(1).split("::")[0].rstrip(".,:;")
        if PLACEHOLDER.search(path):
            path = PLACEHOLDER.split(path, 1)[0].rsplit("/", 1)[0]  # the folder before the placeholder
        out.add(path.rstrip("/"))
    return out


def stale_name(dotted: str) -> bool:
    """Whether ``lit_domino.a.b.name`` names no module of the package, or a name its module never mentions."""
    path, parts = ROOT / "lit_domino", dotted.split(".")[1:]
    while parts and (path / parts[0]).is_dir():
        path = path / parts.pop(0)
    if parts and path.joinpath(parts[0] + ".py").is_file():
        path = path / (parts.pop(0) + ".py")
    source = path / "__init__.py" if path.is_dir() else path
    if not parts:
        return False
    return not re.search(rf"\b{re.escape(parts[0])}\b", source.read_text())


def missing(doc: str, text: str) -> list[str]:
    bad = sorted(p for p in cited_paths(text) if not (ROOT / p).exists())
    bad += sorted({m for m in MODULE.findall(text) if stale_name(m)})
    base = (ROOT / doc).parent
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http://, mailto:
            continue
        path = (base / target).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(f"link {target}")
    return bad


@pytest.mark.parametrize("doc", sorted(docs()))
def test_every_path_a_doc_names_exists(doc):
    assert not missing(doc, docs()[doc]), f"{doc} names files that are not in the repository"


@pytest.mark.parametrize("doc", sorted(docs()))
def test_no_doc_points_outside_the_repository(doc):
    """Users do not have the project's shared folder: the method's account is docs/METHOD.md."""
    text = docs()[doc]
    assert not re.findall(r"\.\./shared|shared/METHOD|(?<![\w/])seeds/", text)


def test_the_path_finder_sees_real_and_stale_paths():
    text = ("see `lit_domino/target.py` and `lit_domino/target/load.py`, "
            "`lit_domino/models/<method>.py`, tests/decoding/, `experiments/train.py fit`.")
    assert cited_paths(text) == {"lit_domino/target.py", "lit_domino/target/load.py", "lit_domino/models",
                                 "tests/decoding", "experiments/train.py"}
    assert missing("README.md", text) == ["lit_domino/target.py"]
    assert missing("README.md", "`lit_domino.target.load.load_target`, lit_domino.generate, "
                   "`lit_domino.study.run`, lit_domino.decoding.nosuch") == ["lit_domino.decoding.nosuch",
                                                                          "lit_domino.study.run"]
    assert missing("docs/x.md", "[a](../docs/nothing.md) [b](results.md) [c](https://x.org/a)") == [
        "link ../docs/nothing.md"]
