"""Where a study lives: storage URLs, :func:`open_storage` (Optuna's heartbeat and retry on RDB
storages), and creating / loading / checking a study against its recorded space and objective.

* ``sqlite:///path.db`` or any SQLAlchemy URL → ``optuna.storages.RDBStorage`` with
  ``heartbeat_interval`` = ``--heartbeat``, ``grace_period`` = 2 intervals and
  ``heartbeat_stale_trial_callback`` = ``RetryHeartbeatStaleTrialCallback(max_retry=--max-retries)``:
  a RUNNING trial whose worker stopped beating is failed (``optuna.storages.fail_stale_trials``,
  which every ``study.optimize`` also runs before each trial) and its parameters re-enqueued;
* ``journal:<path>`` or a path ending ``.journal`` / ``.log`` → ``JournalStorage`` on a file
  (no heartbeat in Optuna 5).

A SQLite storage's schema, and a study in it, are created once, under a file lock beside the database
(``<db>.lock``, as the MLflow store's): sweep workers started together on a new storage do not race in
Optuna's table creation.
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

import optuna
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from lit_domino.runtime.paths import project_root
from lit_domino.runtime.tracking import store_lock
from lit_domino.studies.sweep.space import SearchSpace, StorageError, StudyMismatchError, SweepError

if TYPE_CHECKING:  # settings.py imports default_storage from here
    from lit_domino.studies.sweep.settings import SweepSettings

SPACE_ATTR = "lit_domino:search_space"
SETTINGS_ATTR = "lit_domino:settings"


@contextlib.contextmanager
def quiet_experimental() -> Iterator[None]:
    """Silence Optuna's ExperimentalWarning (heartbeat, retry callback, plots, importances)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def default_storage(study_name: str) -> str:
    return f"sqlite:///{project_root() / 'sweeps' / f'{study_name}.db'}"


def redact(url: str) -> str:
    """``url`` without its password."""
    return re.sub(r"//([^:/@]+):([^@]+)@", r"//\1:***@", url)


def journal_path(url: str) -> Path | None:
    """The journal file of a ``journal:`` / ``*.journal`` / ``*.log`` storage, else None."""
    if url.startswith("journal:"):
        rest = url[len("journal:"):]
        rest = rest[2:] if rest.startswith("//") else rest
        return Path(rest).expanduser()
    if "://" not in url and url.endswith((".journal", ".log")):
        return Path(url).expanduser()
    return None


def has_heartbeat(url: str, heartbeat: int) -> bool:
    """Whether a storage opened by :func:`open_storage` records trial heartbeats (RDB with heartbeat > 0)."""
    return bool(heartbeat) and journal_path(url) is None


def retry_callback(max_retries: int) -> RetryHeartbeatStaleTrialCallback:
    """Optuna's retry of a failed trial: a WAITING copy of its parameters (system attrs ``failed_trial``,
    ``retry_history``), at most ``max_retries`` times per original trial."""
    with quiet_experimental():
        return RetryHeartbeatStaleTrialCallback(max_retry=max_retries)


def retry_history(trial: FrozenTrial) -> list[int]:
    """The trials that ``trial`` retries, the original first (``RetryHeartbeatStaleTrialCallback.retry_history``);
    empty for a trial that retries none."""
    with quiet_experimental():
        return list(RetryHeartbeatStaleTrialCallback.retry_history(trial))


def retried_trials(study: optuna.Study) -> set[int]:
    """Numbers of the trials some other trial already retries."""
    return {n for t in study.get_trials(deepcopy=False) for n in retry_history(t)}


def open_storage(url: str, *, heartbeat: int = 0, max_retries: int = 1, create_dirs: bool = False):
    """An Optuna storage for ``url``, or :class:`StorageError` saying why it cannot be opened.

    ``sqlite:///path.db`` / any SQLAlchemy RDB URL → ``RDBStorage`` (with Optuna's heartbeat when
    ``heartbeat`` > 0: stale after ``2 * heartbeat`` s, retried by :func:`retry_callback`);
    ``journal:<path>`` or a path ending ``.journal``/``.log`` → ``JournalStorage`` on a file.
    """
    if not isinstance(url, str) or not url.strip():
        raise StorageError("the storage URL is empty; use sqlite:///path.db, journal:path.journal or an RDB URL")
    hint = ("use sqlite:///<path>.db, journal:<path>.journal (an Optuna journal file) or an RDB URL such as "
            "postgresql://user:password@host/db")
    journal = journal_path(url)
    if journal is not None:
        journal = journal.resolve()
        if create_dirs:
            journal.parent.mkdir(parents=True, exist_ok=True)
        if not journal.parent.is_dir():
            raise StorageError(f"cannot open the Optuna journal {journal}: directory {journal.parent} does not exist")
        try:
            return JournalStorage(JournalFileBackend(str(journal)))
        except Exception as err:
            raise StorageError(f"cannot open the Optuna journal {journal}: {type(err).__name__}: {err}") from None
    if "://" not in url:
        raise StorageError(f"storage {url!r} is neither a URL nor a journal file; {hint}")
    engine_kwargs = None
    if url.startswith("sqlite:"):
        path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
        if path and path != ":memory:":
            db = Path(path)
            if create_dirs:
                db.parent.mkdir(parents=True, exist_ok=True)
            if not db.parent.is_dir():
                raise StorageError(f"cannot open the Optuna storage {url}: directory {db.parent} does not exist")
        engine_kwargs = {"connect_args": {"timeout": 60}}
    try:
        with quiet_experimental(), store_lock(url):
            return RDBStorage(
                url, engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat or None, grace_period=2 * heartbeat if heartbeat else None,
                heartbeat_stale_trial_callback=retry_callback(max_retries) if heartbeat else None,
            )
    except Exception as err:
        raise StorageError(f"cannot open the Optuna storage {redact(url)}: {type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''}; {hint}") from None


def make_pruner(settings: SweepSettings) -> optuna.pruners.BasePruner:
    if isinstance(settings.pruner, optuna.pruners.BasePruner):
        return settings.pruner
    if settings.pruner == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=settings.n_startup_trials,
                                       n_warmup_steps=settings.n_warmup_steps)


def make_sampler(settings: SweepSettings) -> optuna.samplers.BaseSampler:
    with quiet_experimental():
        return optuna.samplers.TPESampler(seed=settings.sampler_seed, constant_liar=True,
                                          n_startup_trials=max(1, settings.n_startup_trials))


def _diff(stored: Mapping, mine: Mapping) -> list[str]:
    keys = sorted(set(stored) | set(mine))
    return [f"{k}: study has {stored.get(k, '<absent>')!r}, you gave {mine.get(k, '<absent>')!r}"
            for k in keys if stored.get(k, "<absent>") != mine.get(k, "<absent>")]


def check_study(study: optuna.Study, space: SearchSpace, settings: SweepSettings) -> None:
    """Raise :class:`StudyMismatchError` if ``study`` was created with another space or objective settings."""
    attrs = study.user_attrs
    stored = attrs.get(SPACE_ATTR)
    if stored is None:
        if study.trials:
            raise StudyMismatchError(
                f"study {study.study_name!r} exists in this storage with {len(study.trials)} trials but was not "
                "created by lit_domino's sweep (no search space recorded); pick another --study-name")
        return
    stored = json.loads(stored)
    mine = space.to_dict()
    if stored != mine:
        lines = []
        if stored.get("variant") != mine["variant"]:
            lines.append(f"variant: study has {stored.get('variant')!r}, you gave {mine['variant']!r}")
        lines += _diff({k: json.dumps(v, sort_keys=True) for k, v in stored.get("params", {}).items()},
                       {k: json.dumps(v, sort_keys=True) for k, v in mine["params"].items()})
        raise StudyMismatchError(
            f"study {study.study_name!r} exists with a DIFFERENT search space:\n  " + "\n  ".join(lines)
            + "\nuse a new --study-name for a new space, or pass the study's own space file "
              "(`sweeps/domino.py summary` prints it)")
    stored_settings = json.loads(attrs.get(SETTINGS_ATTR, "{}"))
    diff = _diff(stored_settings, json.loads(json.dumps(settings.fingerprint())))
    if diff:
        raise StudyMismatchError(
            f"study {study.study_name!r} was created with other objective settings (every worker of a study must "
            "measure the same objective):\n  " + "\n  ".join(diff))


def create_or_load_study(settings: SweepSettings, space: SearchSpace, *, create: bool = True) -> optuna.Study:
    """Open (or create) the study, recording / checking its search space and objective settings."""
    settings.check()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = settings.storage_url()
    storage = open_storage(url, heartbeat=settings.heartbeat, max_retries=settings.max_retries,
                           create_dirs=settings.storage is None)
    with store_lock(url):  # a study and its recorded space made by one worker, checked by the others
        try:
            study = optuna.load_study(study_name=settings.study_name, storage=storage,
                                      sampler=make_sampler(settings), pruner=make_pruner(settings))
        except KeyError:
            if not create:
                raise SweepError(f"no study {settings.study_name!r} in {redact(url)}") from None
            study = optuna.create_study(study_name=settings.study_name, storage=storage, direction="maximize",
                                        sampler=make_sampler(settings), pruner=make_pruner(settings),
                                        load_if_exists=True)
        check_study(study, space, settings)
        if SPACE_ATTR not in study.user_attrs:
            study.set_user_attr(SPACE_ATTR, space.to_json())
            study.set_user_attr(SETTINGS_ATTR, json.dumps(settings.fingerprint(), sort_keys=True))
            study.set_user_attr("objective", settings.objective)
            study.set_user_attr("variant", space.variant)
    return study


def load_existing_study(study_name: str, storage: str | None = None) -> optuna.Study:
    """An existing study (for ``summary``), with a clear error when it is not there."""
    url = storage or default_storage(study_name)
    store = open_storage(url)
    try:
        return optuna.load_study(study_name=study_name, storage=store)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(store)]
        raise SweepError(f"no study {study_name!r} in {redact(url)}; studies there: {names or 'none'}") from None


def trial_counts(study: optuna.Study) -> dict[str, int]:
    """``{state name: number of trials}`` over every :class:`~optuna.trial.TrialState`."""
    out = {s.name: 0 for s in TrialState}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] += 1
    return out


def finished_trials(study: optuna.Study) -> int:
    """COMPLETE + PRUNED trials: what ``n_trials`` counts."""
    c = trial_counts(study)
    return c["COMPLETE"] + c["PRUNED"]


def get_trial(study: optuna.Study, number: int) -> FrozenTrial:
    """Trial ``number`` of ``study`` (not a copy)."""
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)
