"""The study layer shared by the ablation, the DLoop study, the sweep, the eval callback and the bench command
(``lit_domino.bench``).

* strict JSON: :func:`to_json` / :func:`write_json` (NaN and ±inf → ``null``, numpy/torch numbers → Python);
* :func:`pinned_threads`: torch's intra-op threads for a block, restored after;
* :func:`cached_rows`: measured benchmark rows cached in the artifact cache (kind ``evals``);
* benchmark rows → MLflow metrics: :func:`drafter_metrics` (the documented names ``{benchmark}/tau``,
  ``{benchmark}/speedup``, ..., ``acc_rate_pos_{k:02d}``, and their means over benchmarks under the bare
  names), :func:`row_metrics` (one metric per row and key, any naming) and :func:`log_metrics`;
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

from lit_domino import cache  # torch and MLflow are imported where used: the commands import this module to parse

# --------------------------------------------------------------------------- strict JSON


def _key(k) -> str:
    """A dict key as JSON names it (``None`` → ``"null"``, ``True`` → ``"true"``, ``3`` → ``"3"``)."""
    if isinstance(k, str):
        return k
    return json.dumps(k) if k is None or isinstance(k, bool) else str(k)  # as json.dumps names them


def _plain(obj, convert: Callable | None, finite_only: bool):
    """:func:`to_json`'s walk; ``finite_only=False`` keeps NaN/±inf (to find where they are)."""
    if convert is not None:
        obj = convert(obj)
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) or not finite_only else None
    if isinstance(obj, Mapping):
        return {_key(k): _plain(v, convert, finite_only) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v, convert, finite_only) for v in obj]
    if isinstance(obj, PurePath):
        return str(obj)
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy / torch scalars and arrays
        return _plain(obj.tolist(), convert, finite_only)
    return obj  # anything else: json.dumps says it cannot encode it


def to_json(obj: Any, convert: Callable[[Any], Any] | None = None) -> Any:
    """``obj`` as plain JSON types: NaN and ±inf → None, numpy/torch numbers → Python, Paths → str,
    tuples → lists, dict keys → str. ``convert`` is applied to every value first (e.g. table cells → dicts)."""
    return _plain(obj, convert, finite_only=True)


def write_json(obj: Any, path: str | Path, indent: int = 1, convert: Callable[[Any], Any] | None = None) -> Path:
    """Write :func:`to_json` of ``obj`` to ``path`` as strict JSON (no bare NaN/Infinity), atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return cache.write_text_atomic(path, json.dumps(to_json(obj, convert), indent=indent, allow_nan=False))


# --------------------------------------------------------------------------- threads


@contextlib.contextmanager
def pinned_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads, restoring the previous count after (None: leave as is)."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


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


def cached_rows(key: Any, name: str, compute: Callable[[], list[dict]], *,
                on_reuse: Callable[[], None] | None = None) -> list[dict]:
    """Rows measured once per ``key``: reused from ``evals/<name>-<hash of key>/rows.json`` when that artifact
    is complete (``on_reuse`` is called first), else ``compute()``d, written as strict JSON and marked complete.

    Rows come back as computed: ``nonfinite.json`` beside ``rows.json`` says where the NaN/±inf were
    (``rows.json`` holds ``null`` there); files written before it existed (bare ``NaN``) are read as they are.
    """

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


# --------------------------------------------------------------------------- benchmark rows → metrics

POSITIONS = "acc_rate_pos_*"
"""Every per-position acceptance rate of a row (``acc_rate_pos_01``, ``acc_rate_pos_02``, ...)."""
DECODE_KEYS = ("tau", "speedup", "speedup_vs_hf_generate", "tpot_ms", "accepted_per_round", "backbone_tau",
               POSITIONS)
"""Keys logged per benchmark (``{benchmark}/{key}``)."""
MEAN_KEYS = ("tau", "speedup", "speedup_vs_hf_generate", "tpot_ms", "accepted_per_round", POSITIONS)
"""Keys logged as their mean over benchmarks under the bare name (``backbone_tau`` only per benchmark)."""


def finite(x) -> bool:
    """True for a real, finite number (not None, NaN, ±inf, a bool or a string)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _expand(keys: Iterable[str], rows: Iterable[Mapping]) -> list[str]:
    """``keys`` with each ``prefix*`` replaced by the rows' keys of that prefix (sorted)."""
    rows = list(rows)
    out = []
    for key in keys:
        if key.endswith("*"):
            out += sorted({k for r in rows for k in r if k.startswith(key[:-1])})
        else:
            out.append(key)
    return out


def row_metrics(rows: Iterable[Mapping], keys: Sequence[str], by: str | Callable[[Mapping], Any] = "benchmark",
                sep: str = "/") -> dict[str, float]:
    """One metric per row and key: ``sep.join(by(row) parts + [key])`` → float, non-finite values skipped.

    ``by``: a row key (``"benchmark"``) or a function of the row giving a name part or a tuple of parts;
    a key ending in ``*`` stands for every key of the row with that prefix. Rows that share a name: last wins.
    """
    out: dict[str, float] = {}
    for r in rows:
        parts = r[by] if isinstance(by, str) else by(r)
        parts = tuple(parts) if isinstance(parts, (tuple, list)) else (parts,)
        for key in _expand(keys, [r]):
            if finite(r.get(key)):
                out[sep.join(str(p) for p in (*parts, key))] = float(r[key])
    return out


def drafter_metrics(rows: Iterable[Mapping], *, keys: Sequence[str] = DECODE_KEYS,
                    mean_keys: Sequence[str] = MEAN_KEYS, overall: Mapping | None = None,
                    by: str | Callable[[Mapping], Any] = "benchmark") -> dict[str, float]:
    """One drafter's benchmark rows → its MLflow metrics, non-finite values skipped.

    ``{benchmark}/{key}`` for ``keys`` (per-position rates included), then the bare ``mean_keys``: the mean
    over the rows (one per benchmark) of the finite values, or, with ``overall`` (a summary pooled over all
    prompts), that row's values. Pass only the drafter's rows (one temperature, one row per benchmark).
    """
    rows = list(rows)
    metrics = row_metrics(rows, keys, by)
    source = rows if overall is None else [overall]
    for key in _expand(mean_keys, source):
        values = [float(r[key]) for r in source if finite(r.get(key))]
        if values:
            metrics[key] = sum(values) / len(values)
    return metrics


def mlflow_name(name: str) -> str:
    """``name`` with the characters MLflow refuses in metric names replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-./ :]", "_", name)


def log_command_run(experiment: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, Any],
                    metrics: Mapping[str, float], files: Sequence[Path]) -> str:
    """One MLflow run of a measuring command (bench, serve_bench): its options as params (values cut to
    MLflow's 500 characters), ``metrics`` under MLflow-safe names, ``files`` as artifacts; returns the run id."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from lit_domino.tracking import default_tracking_uri, mlflow_run  # tracking imports MLflow lazily, so here too

    with mlflow_run(experiment, run_name=run_name, tags=dict(tags)) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        log_metrics(MlflowClient(default_tracking_uri()), run.info.run_id,
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
