"""A run's config as MLflow params: flattened to one dotted name per setting (``model.lr``, ``data.batch_size``;
``init_args`` levels dropped, the run's output folders left out), logged in batches (a resumed run keeps the values
it has), and the YAML beside them as an artifact."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

log = logging.getLogger(__name__)

MAX_PARAM_CHARS = 500

OUTPUT_KEYS = ("trainer.default_root_dir", "checkpoint.dirpath", "export.dirpath")
"""Config keys that say where a run writes, not how it trains (machine paths): not logged as params (the run's
``drafter_dir`` tag and ``config.yaml`` artifact hold them)."""


def flatten_config(config: Mapping[str, Any], prefix: str = "", sep: str = ".",
                   skip: Iterable[str] = OUTPUT_KEYS) -> dict[str, str]:
    """Nested config → ``{"model.lr": "0.0006", ...}``; ``init_args`` levels dropped, ``class_path`` kept, the keys
    ``skip`` (the run's output folders, :data:`OUTPUT_KEYS`) left out."""
    skip = set(skip)
    flat: dict[str, str] = {}
    for key, value in config.items():
        key = str(key)
        if key == "init_args":
            name = prefix
        else:
            name = f"{prefix}{sep}{key}" if prefix else key
        if name in skip:
            continue
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, name, sep, skip))
        else:
            flat[name] = str(value)[:MAX_PARAM_CHARS]
    return flat


def log_params(client, run_id: str, params: Mapping[str, str]) -> None:
    """Log params in batches; a value that differs from one already logged (a resumed run) is skipped with a warning."""
    from mlflow.entities import Param

    items = [Param(k[:250], str(v)[:MAX_PARAM_CHARS]) for k, v in params.items()]
    existing = client.get_run(run_id).data.params
    fresh = [p for p in items if p.key not in existing]
    changed = [p.key for p in items if p.key in existing and existing[p.key] != p.value]
    if changed:
        log.warning("params already logged with other values are kept as they were: %s", changed)
    for i in range(0, len(fresh), 100):
        client.log_batch(run_id, params=fresh[i : i + 100])


def log_config(logger, config: Mapping[str, Any], yaml_text: str | None = None,
               artifact_name: str = "config.yaml") -> None:
    """Flattened ``config`` as params and ``yaml_text`` as an artifact of ``logger``'s run (an ``MLFlowLogger``)."""
    client, run_id = logger.experiment, logger.run_id
    log_params(client, run_id, flatten_config(config))
    if yaml_text is not None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / artifact_name
            path.write_text(yaml_text)
            client.log_artifact(run_id, str(path))
