"""The one training parser: a LightningCLI over the drafter modules and the one DataModule.

``experiments/train.py`` is this CLI on the command line; :func:`lit_domino.training.experiment.train_variant`
(the ablation, the DLoop study, the sweeps) builds the same CLI from a composed config dict, so
every training parses, links, instantiates and lays out its run directory the same way:

* links: ``data.target → model.target``, ``data.block_size → model.block_size``,
  ``data.feature_layers → model.feature_layers``, ``data.target_dtype → model.target_dtype``,
  ``seed_everything → data.seed`` (one seed for weights, anchors and shuffling);
* ``--variant V --preset P`` composes ``experiments/configs`` (``lit_domino.training.configs``) first;
* an MLflow logger by default (``tracking:`` section; runs tagged variant/preset/seed/table),
  the flattened config as params and the YAML as an artifact;
* the run directory (``trainer.default_root_dir``, default ``<project>/results/train/<run name>``)
  holds ``config.yaml``, ``checkpoints/`` (``last.ckpt`` every epoch and every 50 steps, and ``mlflow_run_id`` so a
  resumed run continues the same MLflow run) and ``drafter/`` (the ``save_pretrained`` export); a finished run is
  never reopened: a training in the same directory after it (a rebuilt artifact) starts a new run that supersedes it,
  and a resumed run drops the points logged after its checkpoint (each step once);
* any exception marks the MLflow run FAILED (KILLED for Ctrl-C).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import inspect
import logging
import re
import typing
import warnings
from argparse import ArgumentError
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from lit_domino.runtime import cache
from lit_domino.training import configs
from lit_domino.data.resumable import TrackLoaderPosition
from lit_domino.training.configs import SECTIONS, ConfigError, check_arguments, load_config, variant_arguments
from lit_domino.training.datamodule import DrafterDataModule, regen_options
from lit_domino.lit import DrafterModule, ExportDrafter
from lit_domino.runtime.paths import project_root
from lit_domino.runtime import tracking
from lit_domino.runtime.tracking import (MarkFailedOnError, ResumableRun, TrackingConfig, log_config,
    make_mlflow_logger, mark_failed_on_error)
from lit_domino.runtime.command import DEBUG_FLAG, run_command

RUN_ID_FILE = "mlflow_run_id"
"""Written next to the checkpoints: a resumed run continues the same MLflow run (see :func:`recorded_run`)."""
CHECKPOINT_DIR = "checkpoints"
EXPORT_DIR = "drafter"

log = logging.getLogger(__name__)


def as_seed(value) -> int:
    """``seed_everything`` → ``data.seed`` (``true``/``false`` give 0)."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


class MLflowConfig(SaveConfigCallback):
    """Saves config.yaml in the run dir (``trainer.default_root_dir``) and, for MLflow loggers,
    logs the flattened config as params and the YAML as an artifact."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved:
            return
        if trainer.is_global_zero:
            run_dir = Path(trainer.default_root_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            self.parser.save(self.config, run_dir / self.config_filename, skip_none=False, overwrite=True)
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True

    def save_config(self, trainer, pl_module, stage: str) -> None:
        text = self.parser.dump(self.config, skip_none=False)
        as_dict = yaml.safe_load(text) or {}
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                log_config(logger, as_dict, text)
                ckpt = trainer.checkpoint_callback
                if ckpt is not None and ckpt.dirpath:
                    Path(ckpt.dirpath).mkdir(parents=True, exist_ok=True)
                    (Path(ckpt.dirpath) / RUN_ID_FILE).write_text(logger.run_id)
                old = (logger.tags or {}).get(tracking.SUPERSEDES_TAG)
                if old:  # the finished run this one rebuilds: linked both ways once the new run exists
                    tracking.mark_superseded(logger.experiment, old, logger.run_id)


def recorded_run(folder: str | Path, tracking_uri: str | None = None, *, warn: bool = False) -> tuple[str | None, str | None]:
    """What the run id recorded in ``folder`` (``<folder>/mlflow_run_id``) means for a training there:
    ``(run to continue, finished run to supersede)``.

    Only the run of an interrupted training (``RUNNING``, ``KILLED``, ``FAILED``) is continued. The run of a
    completed training (``FINISHED``, or tagged ``training_complete``: :func:`tracking.training_finished`) is
    never reopened, though the record outlives it (a rebuilt artifact, a ``--ckpt_path`` continuation): a new
    run supersedes it. A run the store does not have (a deleted ``mlflow.db``, another ``MLFLOW_TRACKING_URI``)
    or that was deleted is neither (a new run; a warning with ``warn``)."""
    marker = Path(folder) / RUN_ID_FILE
    run_id = marker.read_text().strip() if marker.is_file() else ""
    if not run_id:
        return None, None
    finished = tracking.training_finished(run_id, tracking_uri)
    if finished is None:
        if warn:
            log.warning("the MLflow run %s recorded in %s is not in the tracking store (deleted, or another "
                        "MLFLOW_TRACKING_URI?); this training logs to a new run", run_id, marker)
        return None, None
    return (None, run_id) if finished else (run_id, None)


class ResumableCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` that also refreshes ``last.ckpt`` every ``resume_every_n_steps``
    optimizer steps (Lightning makes step and epoch intervals exclusive; a resume wants both). The
    train loader is resumable, so a resume from a mid-epoch checkpoint continues with the next unseen
    batch and an interrupted training ends with the weights of an uninterrupted one.

    Args:
        resume_every_n_steps: steps between refreshes of ``last.ckpt`` (None or 0: epoch checkpoints only).
    """

    def __init__(self, *args, resume_every_n_steps: int | None = 50, **kwargs):
        super().__init__(*args, **kwargs)
        if resume_every_n_steps is not None and (isinstance(resume_every_n_steps, bool) or resume_every_n_steps < 0):
            raise ValueError(f"checkpoint.resume_every_n_steps must be >= 0 or null, got {resume_every_n_steps!r}")
        self.resume_every_n_steps = resume_every_n_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        n = self.resume_every_n_steps
        if self.save_last and n and trainer.global_step % n == 0 and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class DrafterCLI(LightningCLI):
    """LightningCLI for ``DrafterModule`` subclasses on the one ``DrafterDataModule``.

    Args (beyond LightningCLI's ``args``/``run``):
        resume: continue the MLflow run recorded beside the checkpoints (the library's resume; on the
            command line ``--ckpt_path`` says it).
        logger_tags: extra MLflow tags of the run (e.g. ``mlflow.parentRunId`` for a sweep trial).
        callbacks: extra Trainer callbacks besides the config's.
    """

    def __init__(self, args=None, run: bool = True, *, resume: bool = False, logger_tags: dict | None = None,
                 callbacks: list | None = None, **kwargs):
        self.resume = resume
        self.logger_tags = dict(logger_tags or {})
        kwargs.setdefault("trainer_defaults", {"callbacks": [MarkFailedOnError(), ResumableRun(),
                                                             TrackLoaderPosition(), *(callbacks or [])]})
        super().__init__(
            DrafterModule,
            DrafterDataModule,
            subclass_mode_model=True,
            save_config_callback=MLflowConfig,
            save_config_kwargs={"overwrite": True},
            seed_everything_default=0,
            auto_configure_optimizers=False,
            args=args,
            run=run,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_class_arguments(TrackingConfig, "tracking")
        parser.add_lightning_class_args(ResumableCheckpoint, "checkpoint")
        # last.ckpt every epoch and every 50 steps, always the newest (no last-v1.ckpt); save_top_k=1,
        # not 0: Lightning writes last.ckpt only in a step that saved a top-k checkpoint
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.every_n_epochs": 1,
                             "checkpoint.save_top_k": 1, "checkpoint.enable_version_counter": False})
        parser.add_lightning_class_args(ExportDrafter, "export")
        parser.link_arguments("data.target", "model.init_args.target")
        parser.link_arguments("data.block_size", "model.init_args.block_size")
        parser.link_arguments("data.feature_layers", "model.init_args.feature_layers")
        parser.link_arguments("data.target_dtype", "model.init_args.target_dtype")
        parser.link_arguments("seed_everything", "data.seed", compute_fn=as_seed)

    # ------------------------------------------------------------------ derived defaults

    def _cfg(self):
        return self.config[self.subcommand] if self.subcommand else self.config

    def variant(self) -> str:
        """The MLflow ``variant`` tag: the config's, else the module class's name for it."""
        cfg = self._cfg()
        return cfg.tracking.variant or getattr(type(self.model), "variant", None) or str(cfg.model.class_path)

    def before_instantiate_classes(self) -> None:
        cfg = self._cfg()
        seed = cfg.get("seed_everything")
        module, _, name = str(cfg.model.class_path).rpartition(".")
        module_cls = getattr(importlib.import_module(module), name)
        variant = cfg.tracking.variant or getattr(module_cls, "variant", name)
        cfg.data.feature_rule = configs.resolve_feature_rule(dict(feature_rule=cfg.data.get("feature_rule")),
                                                             module_cls, cfg.model.init_args.get("objective"))[
            "feature_rule"]
        run_name = cfg.tracking.run_name or f"{variant}-{cfg.tracking.preset or 'custom'}-s{as_seed(seed)}"
        cfg.tracking.run_name = run_name
        if not cfg.trainer.get("default_root_dir"):
            cfg.trainer.default_root_dir = str(project_root() / "results" / "train" / run_name)
        run_dir = Path(cfg.trainer.default_root_dir)
        if not cfg.checkpoint.get("dirpath"):
            cfg.checkpoint.dirpath = str(run_dir / CHECKPOINT_DIR)
        if not cfg.export.get("dirpath"):
            cfg.export.dirpath = str(run_dir / EXPORT_DIR)

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        cfg = self._cfg()
        if isinstance(self.datamodule, DrafterDataModule):  # its missing-set error names this run's regenerate.py line
            self.datamodule.regen_options = regen_options(cfg.tracking.variant or self.variant(), cfg.tracking.preset,
                                                          cfg.get("seed_everything"))

    def instantiate_trainer(self, **kwargs):
        cfg = self._cfg()
        if cfg.tracking.enabled and cfg.trainer.get("logger") in (None, True):
            run_id, supersedes = self._resume_run_id(cfg)
            kwargs["logger"] = make_mlflow_logger(
                cfg.tracking.experiment,
                cfg.tracking.run_name,
                variant=self.variant(),
                preset=cfg.tracking.preset,
                seed=as_seed(cfg.get("seed_everything")),
                table=cfg.tracking.table,
                tags=self.logger_tags,
                tracking_uri=cfg.tracking.tracking_uri,
                run_id=run_id,
                supersedes=supersedes,
            )
        try:
            return super().instantiate_trainer(**kwargs)
        except (ValueError, MisconfigurationException) as err:  # the strategy/accelerator/devices the Trainer refused
            t = cfg.trainer
            setting = (f"trainer.strategy={t.get('strategy', 'auto')!r} with accelerator={t.get('accelerator')!r}, "
                       f"devices={t.get('devices')!r}, num_nodes={t.get('num_nodes', 1)!r}")
            raise ConfigError(f"{setting} cannot run here: {err}") from err

    def _resume_run_id(self, cfg) -> tuple[str | None, str | None]:
        """``(run to continue, finished run to supersede)`` for a resumed training (:func:`recorded_run`)."""
        ckpt_path = cfg.get("ckpt_path")
        if ckpt_path and ckpt_path != "last":
            folder = Path(ckpt_path).parent
        elif ckpt_path == "last" or self.resume:
            folder = Path(cfg.checkpoint.dirpath)
        else:
            return None, None
        return recorded_run(folder, cfg.tracking.tracking_uri, warn=True)

    @property
    def last_checkpoint(self) -> Path:
        """Where ``last.ckpt`` is written (and a resume reads it)."""
        return Path(self._cfg().checkpoint.dirpath) / "last.ckpt"

    def _run_subcommand(self, subcommand: str) -> None:
        for logger in self.trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                _ = logger.run_id  # start the run now: a crash in data preparation is recorded FAILED too
        with mark_failed_on_error(lambda: self.trainer.loggers):
            super()._run_subcommand(subcommand)


def expand_variant_args(argv: list[str]) -> list[str]:
    """``fit --variant V [--preset P] [--seed S] [--set K=V ...] REST`` → ``fit --config <composed YAML> REST``.

    The composed config (``lit_domino.training.configs.load_config``) goes first, so the usual LightningCLI
    flags after it (``--trainer.max_epochs 3``, ``--config more.yaml``, ``--ckpt_path last``) still win.
    The ``--set`` keys are checked here (:func:`check_config`, the Trainer aside: a later
    ``--trainer.accelerator`` may still change it), so a mistyped one is one line, not the parser's usage.
    """
    known, rest = variant_arguments(argv)
    for i, arg in enumerate(argv[:-1]):  # a user's YAML with a flat head key: one line naming the new key
        path = Path(argv[i + 1]) if arg == "--config" else None
        if path is not None and path.suffix in (".yaml", ".yml") and path.is_file():
            data = yaml.safe_load(path.read_text()) or {}
            if known.variant is not None and isinstance(data.get("model"), dict) and "class_path" not in data["model"]:
                # a delta over the variant (model.init_args only): checked against the variant's module
                data = {**data, "model": {"class_path": configs.compose(known.variant, known.preset)["model"][
                    "class_path"], **data["model"]}}
            configs.check_flat_head_keys(data)
    if known.variant is None:
        return [a for a in argv if a != DEBUG_FLAG]
    overrides = dict(known.set)
    check_arguments(known.preset, overrides, [known.variant])
    cfg = load_config(known.variant, known.preset, known.seed, overrides)
    if overrides:
        check_config(cfg, trainer=False)
    subcommand = [a for a in rest[:1] if not a.startswith("-")]
    return [*subcommand, "--config", yaml.safe_dump(cfg, sort_keys=False), *rest[len(subcommand):]]


def main(argv: list[str] | None = None, run: bool = True) -> DrafterCLI:
    """``experiments/train.py``: the CLI, after ``--variant/--preset`` composition; errors in the
    composition or a ``--set`` key are one line (``train: error: ...``, rc 2). A finished ``fit`` ends with
    the line ``drafter saved to <directory>`` (what ``lit_domino.load_drafter`` and ``experiments/export.py``
    take; the MLflow run's tag ``drafter_dir``)."""

    def train(args: list[str]) -> DrafterCLI:
        cli = DrafterCLI(args=expand_variant_args(args), run=run)
        if run and cli.trainer.is_global_zero:
            exported = [cb.exported for cb in cli.trainer.callbacks if isinstance(cb, ExportDrafter) and cb.exported]
            for path in exported:
                print(f"drafter saved to {path}", flush=True)
        return cli

    return run_command("train", train, argv)




def _params(*fns) -> dict[str, inspect.Parameter]:
    out = {}
    for fn in fns:
        out.update({n: p for n, p in inspect.signature(fn).parameters.items() if n not in ("self", "args", "kwargs")})
    return out


def _known_keys(cfg: dict, section: str) -> list[str]:
    """The keys the training parser accepts in ``section`` (``model.curriculum`` too): for close-match hints."""
    model = configs.model_parameters(configs.module_class(cfg))
    top = {"model": model, "data": _params(DrafterDataModule.__init__), "trainer": _params(L.Trainer.__init__),
           "tracking": _params(TrackingConfig), "checkpoint": {**_params(ModelCheckpoint.__init__), **_params(ResumableCheckpoint.__init__)},
           "export": _params(ExportDrafter.__init__)}
    head, _, group = section.partition(".")
    if not group:
        return list(top.get(head, {}))
    kind = top.get(head, {}).get(group)
    annotation = typing.get_type_hints(type(model[group].default)).keys() if kind is not None and dataclasses.is_dataclass(
        kind.default) else ()
    return list(annotation)


_CHECKED: set[str] = set()
"""Hashes of the configs :func:`check_config` accepted in this process (with the Trainer or without)."""

_TYPE_NAMES = configs.TYPE_NAMES  # the same words as the static check of model keys (configs.check_number)


def _type_name(text: str) -> str:
    """``<class 'float'>`` → ``a float``; ``typing.Literal['a', 'b']`` → ``one of 'a', 'b'``."""
    literal = re.fullmatch(r"typing\.Literal\[(.*)\]", text)
    if literal:
        return f"one of {literal.group(1)}"
    name = re.fullmatch(r"<class '([\w.]+)'>", text)
    name = name.group(1).rsplit(".", 1)[-1] if name else text
    return _TYPE_NAMES.get(name, f"a {name}")


def _type_error(text: str) -> str | None:
    """jsonargparse's nested type error (a value of the wrong type, wrapped in the model's Union and a dump of
    the whole section) → ``model.lr: expected a float, got 'abc'``; None when ``text`` is not one."""
    lines = text.rstrip().splitlines()
    at = [i for i, line in enumerate(lines) if re.match(r'\s*Parser key "[\w.]+"', line)]
    if not at:
        return None
    keys = [re.search(r'Parser key "([\w.]+)"', lines[i]).group(1) for i in at]
    key = ".".join(keys)  # model + lr, or data.batch_size alone
    indent = len(lines[at[-1]]) - len(lines[at[-1]].lstrip())
    block = []
    for line in lines[at[-1] + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line.strip())
    text = "\n".join(block)
    subtypes = re.search(r"Subtypes: \[(.*)\]", text)
    expected = re.search(r"Expected a (.+?)\. Got value: (.*)", text)
    given = re.search(r"Given value: (.*)", text)
    if subtypes and given:
        types = re.findall(r"<class '[\w.]+'>|typing\.Literal\[[^\]]*\]", subtypes.group(1))
        value = given.group(1)
    elif expected:
        types, value = [expected.group(1)], expected.group(2)
    else:
        return None
    names = [n for n in dict.fromkeys(_type_name(t) for t in types)]
    return f"{key}: expected {' or '.join(names)}, got {value!r}"


def check_config(cfg: dict[str, Any], trainer: bool = True) -> None:
    """Parse a composed config with the training parser before anything is trained or reused from the cache:
    an unknown or mistyped key (``--set model.rnak=3``, ``trainer.max_step``) raises :class:`ConfigError`
    naming it and its close matches; a value of the wrong type names the key and the type it takes.

    ``trainer=False``: parse the Trainer's settings but do not build it (``train.py`` checks its ``--set`` keys
    so, and a later ``--trainer.accelerator cpu`` may still make a GPU preset's Trainer buildable)."""
    digest = cache.config_hash(cfg if trainer else {"parse_only": cfg})
    if digest in _CHECKED:  # parsed already in this process (the ablation checks every config up front)
        return
    unknown = [k for k in cfg if k not in SECTIONS]
    if unknown:
        close = {k: difflib.get_close_matches(k, SECTIONS, n=1) for k in unknown}
        raise ConfigError("unknown config section(s) " + ", ".join(
            f"{k!r}" + (f" (did you mean {c[0]!r}?)" if c else "") for k, c in close.items())
            + f"; a training config has {', '.join(SECTIONS)}")
    args = cli_args(cfg)
    args["tracking"] = {**args.get("tracking", {}), "enabled": False}
    try:
        with _quiet():
            (DrafterCLI if trainer else _ParseOnlyCLI)(args=args, run=False, parser_kwargs={"exit_on_error": False})
    except ValueError as err:  # a module or DataModule refused a value: its own message, not jsonargparse's wrapping
        text = str(err)
        reason = re.search(r"Errors:\s*\n\s*- ([^\n]+)", text)
        raise ConfigError(reason.group(1) if reason else text.strip().splitlines()[0]) from None
    except ArgumentError as err:
        text = str(err)
        in_model = text.startswith('Parser key "model"')
        group = re.search(r"Group '([\w.]+)' does not accept option '([\w.]+)'", text)
        option = re.search(r"Option '([\w.]+)' is not accepted", text)
        if group:
            section, key = (f"model.{group.group(1)}" if in_model else group.group(1)), group.group(2)
        elif option:
            section, key = "model", option.group(1)
        else:
            typed = _type_error(text)
            if typed:
                raise ConfigError(typed) from None
            lines = [l.strip() for l in text.strip().splitlines() if l.strip() and not l.strip().startswith("Given value")]
            raise ConfigError(f"the training parser refuses this config: {lines[0]} {lines[-1]}") from None
        sections = configs.model_sections(cfg) if section == "model" else None  # model.rank: now model.head.rank
        raise configs.unknown_key(section, key, _known_keys(cfg, section), sections) from None
    _CHECKED.add(digest)


@contextlib.contextmanager
def _quiet():
    """Lightning's info lines and warnings off while a config is only checked (the training prints them)."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [log.level for log in loggers]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for log in loggers:
                log.setLevel(logging.WARNING)
            yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


class _ParseOnlyCLI(DrafterCLI):
    """:class:`DrafterCLI` that parses and builds the model and the DataModule, not the Trainer."""

    def instantiate_trainer(self, **kwargs):
        return None


def cli_args(cfg: dict[str, Any]) -> dict[str, Any]:
    """A composed config (``load_config``) as the CLI's structured ``args`` (no subcommand)."""
    return {k: v for k, v in cfg.items() if k in ("seed_everything", "model", "data", "trainer", "tracking",
                                                      "checkpoint", "export")}
