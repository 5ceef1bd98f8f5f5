"""Are two runs of a study the same? Its output folders (tables, JSON, figures) and its MLflow study runs,
compared file by file and value by value; what a refactor of a study must leave unchanged.

    python -m lit_domino.studies.same_outputs results-before results-after
    python -m lit_domino.studies.same_outputs results-before results-after --mlflow sqlite:///a.db sqlite:///b.db

Markdown, text and figures must be byte-identical; JSON equal value by value (floats exactly: "to the last
decimal"), except the keys that time the run itself (:data:`TIMING_KEYS`) and the files that only time it
(:data:`TIMING_FILES`), which two runs never share. MLflow:
every study run (:func:`study_runs`) of one store has a run of the same experiment and name in the other,
with equal params and equal final metrics (timing metrics aside). The protocol that makes decoded rows comparable:
both runs on one artifact cache (decoded rows are cached under the decoding code's hash, which a study's refactor
leaves alone), so the second reuses the first's drafters and rows, and any difference is the study's own code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TIMING_KEYS = frozenset({"seconds", "wall_seconds", "train_seconds", "decode_seconds", "reference_seconds",
                         "seconds_by_stage", "started", "finished", "elapsed"})
"""JSON keys (at any depth) that time the run that wrote them: left out of the comparison."""

TIMING_FILES = frozenset({"stage_times.json"})
"""Files that only time the run and describe the machine it ran on (load, speed): compared for presence only."""

BYTE_EXACT = frozenset({".md", ".txt", ".csv", ".png", ".svg", ".pdf", ".yaml"})
"""Suffixes compared byte for byte; ``.json`` is compared as values; other files by bytes as well."""


def _drop_timings(value):
    if isinstance(value, dict):
        return {k: _drop_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_drop_timings(v) for v in value]
    return value


def _first_difference(a, b, path: str = "") -> str | None:
    """Where two JSON values first differ (a path like ``rows[3].tau``), or None."""
    if type(a) is not type(b):
        return f"{path or '.'}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'after' if k not in a else 'before'}"
            where = _first_difference(a[k], b[k], f"{path}.{k}")
            if where:
                return where
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        return next((w for i, (x, y) in enumerate(zip(a, b)) if (w := _first_difference(x, y, f"{path}[{i}]"))), None)
    return None if a == b else f"{path or '.'}: {a!r} vs {b!r}"


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def compare_files(before: Path, after: Path) -> list[str]:
    """One line per difference between two output folders (empty: the same)."""
    old, new = _files(before), _files(after)
    problems = [f"{name}: only {'before' if name in old else 'after'}" for name in sorted(old ^ new)]
    for name in sorted(old & new):
        a, b = before / name, after / name
        if a.name in TIMING_FILES:
            continue
        if a.suffix == ".json":
            where = _first_difference(_drop_timings(json.loads(a.read_text())), _drop_timings(json.loads(b.read_text())))
            if where:
                problems.append(f"{name}: {where}")
        elif a.read_bytes() != b.read_bytes():
            problems.append(f"{name}: bytes differ")
    return problems


def study_runs(uri: str) -> dict[tuple[str, str], dict]:
    """``(experiment, run name) -> {"params", "metrics"}`` of every study run in the store at ``uri``: the runs that
    carry a study's tables (tag ``table``: the ablation's and the objectives study's ``study_role=study`` run, the
    DLoop, tree and acceptance studies' table runs); the trainings' runs (tag ``variant``) are left out."""
    from lit_domino.runtime.tracking import open_client

    client = open_client(uri)
    runs = {}
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            tags = run.data.tags
            if "variant" in tags or ("table" not in tags and tags.get("study_role") != "study"):
                continue  # a training's run (tag variant): its metrics include its own timed evaluations
            metrics = {k: v for k, v in run.data.metrics.items() if "seconds" not in k}
            runs[(exp.name, run.info.run_name)] = {"params": dict(run.data.params), "metrics": metrics}
    return runs


def compare_mlflow(before_uri: str, after_uri: str) -> list[str]:
    """One line per study run missing from one store or differing in params or final metrics."""
    old, new = study_runs(before_uri), study_runs(after_uri)
    problems = [f"mlflow {exp}/{name}: only {'before' if (exp, name) in old else 'after'}"
                for exp, name in sorted(set(old) ^ set(new))]
    for key in sorted(set(old) & set(new)):
        where = _first_difference(old[key], new[key])
        if where:
            problems.append(f"mlflow {key[0]}/{key[1]}: {where}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="same_outputs", description=__doc__.split("\n")[0])
    p.add_argument("before", type=Path, help="a study's output folder (or a folder of several)")
    p.add_argument("after", type=Path, help="the same study's output folder from the other run")
    p.add_argument("--mlflow", nargs=2, metavar=("BEFORE_URI", "AFTER_URI"),
                   help="also compare the study runs of two MLflow stores")
    args = p.parse_args(argv)
    for folder in (args.before, args.after):
        if not folder.is_dir():
            p.error(f"{folder}: not a folder")
    problems = compare_files(args.before, args.after)
    what = f"{len(_files(args.before))} files"
    if args.mlflow:
        problems += compare_mlflow(*args.mlflow)
        what += f" and {len(study_runs(args.mlflow[0]))} study runs"
    for line in problems:
        print(line)
    print(f"{what}: {'the same' if not problems else f'{len(problems)} difference(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
