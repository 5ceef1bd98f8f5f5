"""The README's recipes (train a drafter for your own target, decode with it, export it), run as written.

Each recipe is a fenced block after a ``<!-- recipe: NAME -->`` marker in README.md; the test reads the blocks
from the README and runs them in a fresh working directory, so the README and the test cannot drift. "Your own
target" is the shipped smoke target saved as a plain Hugging Face directory, ``./my-target`` (no ``embedded:`` name
left: the commands see a model folder as a user's own); the only additions to the commands are
the tiny settings in :data:`TINY` (a few prompts, one epoch), appended to the command line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- recipe: ([\w-]+) -->\s*\n```(\w+)\n(.*?)\n```", re.S)
RECIPES = ("mask-error", "train", "decode-python", "decode-cli", "export", "reload")
TINY = {
    "train": ["--set", "data.train_examples={math: 8}", "--set", "data.val_examples={math: 2}",
              "--set", "data.max_new_tokens=16", "--set", "trainer.max_epochs=1",
              "--set", "trainer.enable_progress_bar=false"],
    "decode-cli": ["--benchmarks", "embedded-math:2", "--max-new-tokens", "16", "--no-hf-baseline", "--no-progress"],
}
"""Test-only settings appended to a shell recipe (argparse and ``--set``: the last value of a key wins)."""


def recipes() -> dict[str, tuple[str, str]]:
    """``name → (language, code)`` of every marked block of README.md."""
    return {m.group(1): (m.group(2), m.group(3)) for m in MARKER.finditer((ROOT / "README.md").read_text())}


def test_the_readme_has_every_recipe_and_its_snippets_run_alone():
    found = recipes()
    assert set(RECIPES) <= set(found), f"README.md lacks the recipe block(s) {set(RECIPES) - set(found)}"
    for name, (lang, code) in found.items():
        if lang == "python":  # a snippet copied alone runs: its imports are in it
            assert re.search(r"^import torch$", code, re.M) and re.search(r"^import lit_domino$", code, re.M), name
        if lang == "bash":  # one command, so the tiny settings can be appended to it
            assert code.startswith("python experiments/") and "\n" not in code and "#" not in code, name


# --------------------------------------------------------------------------- running them


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory as a user has it: ``./my-target`` (a plain HF model directory), ``experiments/`` of this
    checkout, and ``python`` on the PATH being this interpreter."""
    from lit_domino.target.load import load_target

    work = tmp_path_factory.mktemp("recipes")
    built = load_target("embedded:smoke")  # the shipped smoke target, saved as a user's own model directory
    built.model.save_pretrained(work / "my-target")
    built.tokenizer.save_pretrained(work / "my-target")
    (work / "experiments").symlink_to(ROOT / "experiments")
    (work / "bin").mkdir()
    shim = work / "bin" / "python"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    shim.chmod(0o755)
    return work


def run(work: Path, name: str, extra: list[str] = ()) -> subprocess.CompletedProcess:
    """Run README recipe ``name`` in ``work`` (a shell command with ``extra`` appended, or a Python snippet)."""
    lang, code = recipes()[name]
    env = {**os.environ, "PATH": f"{work / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    if lang == "python":
        (work / f"{name}.py").write_text(code + "\n")
        cmd = ["python", f"{name}.py"]
    else:
        cmd = ["bash", "-c", code + "".join(" " + shlex.quote(a) for a in [*TINY.get(name, []), *extra])]
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_train_decode_and_export_your_own_target_as_the_readme_says(workdir):
    from mlflow.tracking import MlflowClient

    # 1. train: the drafter lands where the README says, the command prints it, MLflow tags it
    out = ok(run(workdir, "train"))
    drafter = (workdir / "runs" / "my-domino" / "drafter").resolve()
    assert (drafter / "config.json").is_file() and (drafter / "model.safetensors").is_file()
    assert f"drafter saved to {drafter}" in out
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])  # the store the commands wrote to (conftest)
    experiment = client.get_experiment_by_name("train")
    runs = client.search_runs([experiment.experiment_id], f"tags.drafter_dir = '{drafter}'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"

    # 2. decode: the Python snippet (its own assert checks T = 0 decoding against the target's) and bench.py
    out = ok(run(workdir, "decode-python"))
    tau = float(re.match(r"tau (\S+):", out).group(1))
    assert 1.0 <= tau <= 8.0  # τ counts the bonus token: 1 <= τ <= B (8, the default preset's block)
    ok(run(workdir, "decode-cli"))
    tables = list((workdir / "results" / "my-bench").glob("bench-*.md"))
    assert len(tables) == 1 and "domino" in tables[0].read_text()

    # 3. export, then the exported layout loads back and decodes the same tokens (the snippet's assert)
    out = ok(run(workdir, "export"))
    assert "wrote specforge-domino drafter to exported/my-domino" in out
    assert (workdir / "exported" / "my-domino" / "config.json").is_file()
    ok(run(workdir, "reload"))


@pytest.mark.slow
def test_a_target_without_a_mask_row_is_the_error_the_readme_shows(workdir):
    """A GPT-2-like target (its embedding table ends at its vocabulary, no mask token) stops the training
    recipe with the README's one-line error, before anything is trained."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from lit_domino.testing import random_target

    words = ["a", "b", "c", "d", "e", "[UNK]", "<eos>"]
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)},
                                                                            unk_token="[UNK]")),
                                  unk_token="[UNK]", eos_token="<eos>")
    target = random_target(vocab_size=len(tok), hidden_size=32, num_layers=4, num_heads=2, num_kv_heads=1,
                           intermediate_size=64)
    target.model.save_pretrained(workdir / "gpt2-like")
    tok.save_pretrained(workdir / "gpt2-like")

    proc = run(workdir, "train", ["--set", "data.target=./gpt2-like", "--set", "trainer.default_root_dir=runs/no-mask"])
    assert proc.returncode == 2
    shown = recipes()["mask-error"][1].strip()
    pattern = re.escape(shown).replace(re.escape("'./gpt2-like'"), "'(.+)'")
    pattern = re.sub(r"\d+", r"\\d+", pattern)
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(pattern, last), f"the error reads\n{last}\nthe README shows\n{shown}"
    assert not (workdir / "runs" / "no-mask" / "drafter").exists()
