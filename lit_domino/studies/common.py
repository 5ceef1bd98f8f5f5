"""What the studies share: measured benchmark rows cached in the artifact cache (:func:`cached_rows`, kind
``evals``) and MLflow logging for the measuring commands (:func:`log_command_run`, :func:`log_metrics`,
:func:`mlflow_name`). Rows → metric names live with the harness (``lit_domino.decoding.harness``)."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lit_domino.runtime import cache  # torch and MLflow are imported where used: the commands import this module
from lit_domino.runtime.jsonio import _plain, finite, write_json

# --------------------------------------------------------------------------- cached evaluation

ROWS_FILE = "rows.json"
NONFINITE_FILE = "nonfinite.json"
"""Where the NaN/±inf of the cached rows were (rows.json itself holds ``null`` there)."""


def _nonfinite(obj, path=()) -> Iterator[list]:
    """``[path, "nan" | "inf" | "-inf"]`` of every non-finite float in plain JSON data."""
    if isinstance(obj, float):
        if not math.isfinite(obj):
            yield [list(path), str(obj)]
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nonfinite(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nonfinite(v, (*path, i))


def _restore_nonfinite(obj, holes: list) -> None:
    """Put the floats :func:`_nonfinite` listed back into ``obj`` (in place)."""
    for path, value in holes:
        node = obj
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = float(value)


DECODE_PACKAGES = ("decoding", "models", "target")
"""The packages whose code produces a study's decoded rows (the engine, the drafters, the target's loading)."""


@functools.lru_cache(maxsize=1)
def decode_code_version() -> str:
    """A hash of the source of :data:`DECODE_PACKAGES`: part of every cached rows' key, so a warm cache never serves
    rows that older decoding code measured (it did until 2026-12-05: the key named only drafters and settings)."""
    import lit_domino

    root = Path(lit_domino.__file__).resolve().parent
    h = hashlib.sha256()
    for package in DECODE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def rows_key(key: Any) -> dict:
    """The artifact key :func:`cached_rows` stores a study's ``key`` under: with the decoding code's version."""
    return {"rows": key, "code": decode_code_version()}


def cached_rows(key: Any, name: str, compute: Callable[[], list[dict]], *,
                on_reuse: Callable[[], None] | None = None) -> list[dict]:
    """Rows measured once per ``key`` and decoding code (:func:`decode_code_version`): reused from
    ``evals/<name>-<hash>/rows.json`` when that artifact is complete (``on_reuse`` is called first), else
    ``compute()``d, written as strict JSON and marked complete.

    Rows come back as computed: ``nonfinite.json`` beside ``rows.json`` says where the NaN/±inf were
    (``rows.json`` holds ``null`` there); files written before it existed (bare ``NaN``) are read as they are.
    """

    key = rows_key(key)
    directory = cache.artifact_dir("evals", key, name=name)
    if cache.is_complete(directory):
        if on_reuse is not None:
            on_reuse()
        rows = json.loads((directory / ROWS_FILE).read_text())  # json.loads also reads the old bare NaN
        holes = directory / NONFINITE_FILE
        if holes.is_file():
            _restore_nonfinite(rows, json.loads(holes.read_text()))
        return rows
    rows = compute()
    write_json(rows, directory / ROWS_FILE)
    write_json(list(_nonfinite(_plain(rows, None, finite_only=False))), directory / NONFINITE_FILE)
    cache.mark_complete(directory, key)
    return rows


def mlflow_name(name: str) -> str:
    """``name`` with the characters MLflow refuses in metric names replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-./ :]", "_", name)


def log_command_run(experiment: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, Any],
                    metrics: Mapping[str, float], files: Sequence[Path]) -> str:
    """One MLflow run of a measuring command (bench, serve_bench): its options as params (values cut to
    MLflow's 500 characters), ``metrics`` under MLflow-safe names, ``files`` as artifacts; returns the run id."""
    import mlflow
    from lit_domino.runtime.tracking import mlflow_run, open_client  # tracking imports MLflow lazily, so here too

    with mlflow_run(experiment, run_name=run_name, tags=dict(tags)) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        log_metrics(open_client(), run.info.run_id,
                    {mlflow_name(k): v for k, v in metrics.items()})
        for path in files:
            mlflow.log_artifact(str(path))
        return run.info.run_id


def log_metrics(client, run_id: str, metrics: Mapping[str, float], step: int = 0) -> int:
    """Log ``metrics`` (non-finite values skipped) to run ``run_id`` with an ``MlflowClient``, in batches of
    at most 1000 (MLflow's limit); returns how many were logged."""
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    items = [Metric(k, float(v), stamp, step) for k, v in metrics.items() if finite(v)]
    for i in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[i:i + 1000])
    return len(items)


class NotLosslessError(RuntimeError):
    """A decoded row whose output differs from the AR baseline at T = 0: the study stops (nothing is cached)."""


def check_lossless(rows: list[dict], path: Path, study: str) -> None:
    """Every drafter row at T = 0 must reproduce the AR baseline token for token (``match_baseline`` 1); else the
    rows are written to ``path`` and :class:`NotLosslessError` names the first offenders (``study``: whose rows)."""
    bad = [r for r in rows if r.get("kind") == "drafter" and float(r.get("temperature", 0.0)) == 0.0
           and not (finite(r.get("match_baseline")) and r["match_baseline"] == 1.0)]
    if bad:
        write_json(rows, path)
        where = ", ".join(f"{r['method']} on {r['benchmark']}" + (f" (B = {r['sweep']})" if r.get("sweep") else "")
                          + f": {r.get('match_baseline')}" for r in bad[:8])
        raise NotLosslessError(f"{len(bad)} {study} rows are not lossless at T = 0 (fraction of prompts whose "
                               f"output is the AR baseline's, must be 1): {where}; every row is in {path}")


def flat_verify_speedup(row: Mapping[str, Any], verify_ms: float) -> float:
    """A projection, labelled so wherever it is shown: the row's speedup had each of its rounds verified in
    ``verify_ms`` instead of the measured verify time, draft and other time as measured. A GPU verifies a few dozen
    tokens in about the time of one (the forward is bound by reading the weights), so the tree study projects with
    a verify cost flat in the nodes and the DLoop study with a verify cost flat in the stages; NaN when the row lacks
    its per-round times."""
    d, v, o = (row.get(k) for k in ("draft_ms_per_round", "verify_ms_per_round", "other_ms_per_round"))
    s = row.get("speedup")
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (d, v, o, s, verify_ms)):
        return float("nan")
    return s * (d + v + o) / (d + verify_ms + o)


# --------------------------------------------------------------------------- row statistics and logs, shared


def finite_mean(values) -> float:
    """The mean of the finite values (NaN when there is none): a cell some rows could not fill."""
    vals = [float(v) for v in values if finite(v)]
    return statistics.fmean(vals) if vals else float("nan")


def fmt(x, digits: int = 2, suffix: str = "") -> str:
    """``x`` for a table cell: ``digits`` decimals and ``suffix``, or ``–`` when it is not finite."""
    return f"{x:.{digits}f}{suffix}" if finite(x) else "–"


def stage_log(study: str) -> Callable[[str, float], None]:
    """The study's log line printer: ``[study  <seconds since t0>s] msg``, flushed at once."""

    def log(msg: str, t0: float) -> None:
        print(f"[{study} {time.time() - t0:6.0f}s] {msg}", flush=True)
    return log
