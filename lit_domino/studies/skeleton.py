"""What every study runs, written once: its plan read from the study file into a frozen dataclass
(:func:`section_fields`, :func:`plan_dict`), then its stages (:class:`Stages`): the target, the trainings, the decode
through the row cache (:func:`lit_domino.studies.common.cached_rows`) with the lossless check, the tables and the
MLflow run, each announced as ``[<study> <seconds>s] stage k/4 ...``. What differs per study is its plan, its rows
and its tables (``ablation``, ``dloop``, ``trees``, ``objectives``; ``acceptance`` builds predictors, not rows: its
plan and stage log only)."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from lit_domino.studies.common import cached_rows, check_lossless, stage_log
from lit_domino.training.configs import check_preset

REUSED = "stage 3/4 decode: nothing changed, reusing the measured rows"
"""The decode stage's line when the rows come from the cache."""


def read_study_file(study_file: Path, preset: str, study: str, error: type[Exception] = ValueError) -> dict:
    """A study file (YAML only: no heavy import), once ``preset`` is a config preset that the file plans; otherwise
    ``error`` in one line naming the file and the presets it plans (``study``: the study's name in that line)."""
    check_preset(preset)  # the presets are the config files' (one place); a study file plans each of them
    data = yaml.safe_load(Path(study_file).read_text())
    if preset not in data["presets"]:
        raise error(f"the {study} ({Path(study_file).name}) has no plan for preset {preset!r}; add a "
                    f"presets.{preset} section (it plans {', '.join(data['presets'])})")
    return data


def count(value, what: str, least: int = 1, error: type[Exception] = ValueError) -> int:
    """``value`` if it is an integer >= ``least`` (a bool is not), else ``error`` in one line naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise error(f"{what} must be an integer >= {least}, got {value!r}")
    return value


def section_fields(cls: type, section: Mapping[str, Any], where: str, error: type[Exception] = ValueError,
                   fixed: tuple[str, ...] = ()) -> dict[str, Any]:
    """A study file's preset section (deep-copied) as keyword arguments of the plan dataclass ``cls``, with ``given``:
    the section's keys in the file's order. A key the plan has no field for, or one of ``fixed`` (what the study sets
    itself), is refused with one line naming ``where`` (``error``: the study's error type)."""
    names = {f.name for f in dataclasses.fields(cls)} - {"given", *fixed}
    unknown = [k for k in section if k not in names]
    if unknown:
        raise error(f"{where}: unknown keys {unknown}; a preset section may set {', '.join(sorted(names))}")
    return {**copy.deepcopy(dict(section)), "given": tuple(section)}


def plan_dict(plan: Any, always: tuple[str, ...]) -> dict[str, Any]:
    """A plan as the dict its JSON (summary files, cache keys) has always held: the keys its preset section set, in
    the file's order, then ``always`` (what the study sets whatever the file says). A setting the section leaves out
    and ``always`` does not name stays out, so a warm cache keyed by the old dicts is reused."""
    keys = list(plan.given) + [k for k in always if k not in plan.given]
    return {k: getattr(plan, k) for k in keys}


class Stages:
    """One study run's stage log and its decode stage: every line ``[<study> <seconds since the start>s] msg``."""

    def __init__(self, study: str, t0: float | None = None):
        self.study = study
        self.t0 = time.time() if t0 is None else t0
        self.reused = False
        """Whether the last :meth:`decode` read its rows from the cache."""
        self._print = stage_log(study)

    def log(self, msg: str) -> None:
        self._print(msg, self.t0)

    def decode(self, key: Any, name: str, measure: Callable[[], list[dict]], lossless: Path | None = None,
               what: str = "") -> list[dict]:
        """The measured rows of ``key``: reused from the cache (logged) or ``measure()``d and cached. With
        ``lossless`` (where the offending rows are written), every drafter row at T = 0 must be the AR baseline's
        (:func:`~lit_domino.studies.common.check_lossless`, ``what``: whose rows), checked before fresh rows are
        cached and again on cached ones (a cache written before the check existed)."""
        self.reused = False

        def fresh() -> list[dict]:
            rows = measure()
            if lossless is not None:
                check_lossless(rows, lossless, what)
            return rows

        def on_reuse() -> None:
            self.reused = True
            self.log(REUSED)

        rows = cached_rows(key, name, fresh, on_reuse=on_reuse)
        if lossless is not None and self.reused:  # fresh rows were checked before they were cached
            check_lossless(rows, lossless, what)
        return rows

    def done(self, seconds: float | None = None) -> float:
        """Log the end of the run (``seconds``: the run's time as the study reported it; now by default)."""
        seconds = time.time() - self.t0 if seconds is None else seconds
        self.log(f"done in {seconds / 60:.1f} min")
        return seconds
