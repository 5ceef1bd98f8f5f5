"""Every entry point in ``experiments/`` and ``sweeps/`` has one shape (docs/ARCHITECTURE.md): its usage docstring,
the ``sys.path`` line, one ``from lit_domino.<module> import main`` and the ``__main__`` call, nothing else; the
parser and the logic live in that library module, which imports no torch and answers a bad flag before loading
it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("experiments/*.py"), *ROOT.glob("sweeps/*.py")])
SYS_PATH_LINE = "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))"
ALLOWED_IMPORTS = {"import sys", "from pathlib import Path", "from __future__ import annotations"}
MAIN_CALLS = {"main()", "sys.exit(main())"}  # sys.exit where main returns the exit status (the sweep's workers)


def shape_problems(source: str) -> list[str]:
    """What in a script's source breaks the entry-point shape (empty: none)."""
    body = ast.parse(source).body
    problems = []
    if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        problems.append("no docstring first")
    else:
        body = body[1:]
    mains = [n for n in body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("lit_domino.")]
    if len(mains) != 1 or [a.name for a in mains[0].names] != ["main"] or mains[0].names[0].asname:
        problems.append("not exactly one `from lit_domino.<module> import main`")
    paths = [n for n in body if isinstance(n, ast.Expr) and ast.unparse(n) == SYS_PATH_LINE]
    if len(paths) != 1:
        problems.append(f"not exactly one `{SYS_PATH_LINE}`")
    guards = [n for n in body if isinstance(n, ast.If)]
    if (not body or body[-1] not in guards or len(guards) != 1
            or ast.unparse(guards[0].test) != "__name__ == '__main__'" or guards[0].orelse
            or [ast.unparse(n) for n in guards[0].body] not in ([c] for c in MAIN_CALLS)):
        problems.append("the last statement is not `if __name__ == \"__main__\": main()`")
    for node in body:
        if node in mains or node in paths or node in guards:
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)) and ast.unparse(node) in ALLOWED_IMPORTS:
            continue
        problems.append(f"line {node.lineno}: {type(node).__name__} `{ast.unparse(node).splitlines()[0]}`")
    return problems


def entry_module(script: Path) -> str:
    """The library module a script imports ``main`` from."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lit_domino."):
            return node.module
    raise AssertionError(f"{script} imports no lit_domino module")


def module_path(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def test_there_are_entry_points():
    names = {str(p.relative_to(ROOT)) for p in SCRIPTS}
    assert {"experiments/bench.py", "experiments/train.py", "sweeps/domino.py"} <= names, names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_entry_point_is_docstring_path_import_and_main(script):
    assert shape_problems(script.read_text()) == []
    doc = ast.get_docstring(ast.parse(script.read_text()), clean=False)
    assert f"python {script.relative_to(ROOT)}" in doc, "the docstring shows how to run the script"
    assert module_path(entry_module(script)).is_file()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_help_text_kept_in_the_library_is_the_scripts_docstring(script):
    """A command whose ``--help`` shows its usage (description, epilog) holds the text as ``COMMAND_DOC``: it is the
    script's docstring, so the two cannot drift apart."""
    library = ast.parse(module_path(entry_module(script)).read_text())
    docs = [ast.literal_eval(n.value) for n in library.body if isinstance(n, ast.Assign)
            and [ast.unparse(t) for t in n.targets] == ["COMMAND_DOC"]]
    if docs:
        assert docs[0] == ast.get_docstring(ast.parse(script.read_text()), clean=False)


def test_the_shape_check_sees_logic():
    """The checker refuses what used to be in the scripts (a checker that passed everything would pass above)."""
    good = ('"""Usage."""\nimport sys\nfrom pathlib import Path\n\n' + SYS_PATH_LINE + "\n\n"
            'from lit_domino.studies.bench import main\n\nif __name__ == "__main__":\n    main()\n')
    assert shape_problems(good) == []
    assert shape_problems(good.replace("import sys\n", "import sys\nimport argparse\n"))
    assert shape_problems(good + "\ndef parse_args(argv):\n    return argv\n")
    assert shape_problems(good.replace('"""Usage."""\n', ""))
    assert shape_problems(good.replace("import main", "import main, parse_args"))
    assert shape_problems(good.replace("    main()", "    run_command('bench', main)"))
    assert shape_problems(good.replace(SYS_PATH_LINE, "ROOT = Path(__file__).resolve().parents[1]"))


# bad input each command answers by parsing alone (train's flags beyond --variant/--preset/--set are LightningCLI's)
BAD_ARGV = {"lit_domino.training.train": ["fit", "--variant", "nosuch"]}
PROBE = r"""
import contextlib, io, json, sys
out = {}
for module, argv in json.loads(sys.argv[1]):
    __import__(module)
    imported = "torch" in sys.modules
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = sys.modules[module].main(argv)
        except SystemExit as done:
            rc = done.code
    out[module] = {"torch_on_import": imported, "rc": rc, "stderr": err.getvalue(), "torch": "torch" in sys.modules}
    if out[module]["torch"]:
        break  # the modules after it would all look guilty
print(json.dumps(out))
"""


def test_library_mains_import_no_torch_and_refuse_a_bad_flag_before_it():
    """In one fresh process, module after module: importing it loads no torch, and its ``main`` answers a
    mistyped flag with one line ``prog: error: ...`` (rc 2) still without torch."""
    modules = sorted({entry_module(s) for s in SCRIPTS})
    probes = [(m, BAD_ARGV.get(m, ["--no-such-flag"])) for m in modules]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(probes)], capture_output=True, text=True,
                          cwd=ROOT, env={**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME")},
                                         "PYTHONPATH": str(ROOT)},
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(seen) == modules, f"stopped at the first module that loaded torch: {seen}"
    for module, result in seen.items():
        lines = result["stderr"].strip().splitlines()
        assert not result["torch_on_import"] and not result["torch"], module
        assert result["rc"] == 2 and len(lines) == 1 and ": error: " in lines[0], (module, lines)
