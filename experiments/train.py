"""Train one drafter variant: a thin LightningCLI over the lit_domino modules.

    python experiments/train.py fit --config experiments/configs/domino.yaml \
        --config experiments/configs/presets/smoke.yaml [--trainer.max_epochs 3 ...]
    # resume a killed run (same configs): continues from <run dir>/checkpoints/last.ckpt
    python experiments/train.py fit --config ... --ckpt_path last
    # inspect the full, commented-by-type config
    python experiments/train.py fit --config experiments/configs/domino.yaml --print_config

Variant YAMLs come first (they choose the module class), a preset YAML second (sizes).
What this adds to LightningCLI:

* links: ``data.target → model.target``, ``data.block_size → model.block_size``,
  ``data.feature_layers → model.feature_layers``, ``seed_everything → data.seed``
  (one seed for weights, anchors and shuffling);
* an MLflow logger by default (``tracking:`` section; runs tagged variant/preset/seed/table),
  the flattened config as params and the YAML as an artifact;
* ``checkpoint:`` a ModelCheckpoint writing ``last.ckpt`` every epoch into
  ``<run dir>/checkpoints`` so ``--ckpt_path last`` resumes (in the same MLflow run);
* ``export:`` the trained drafter saved with ``save_pretrained`` at the end of the fit
  (default ``<run dir>/drafter``);
* the run dir (``trainer.default_root_dir``) defaults to ``<project>/results/train/<run name>``;
* any exception marks the MLflow run FAILED (KILLED for Ctrl-C).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from lit_domino.data.datamodule import DrafterDataModule  # noqa: E402
from lit_domino.lit import DrafterModule, ExportDrafter  # noqa: E402
from lit_domino.tracking import (  # noqa: E402
    MarkFailedOnError,
    TrackingConfig,
    log_config,
    make_mlflow_logger,
    mark_failed_on_error,
    project_root,
)

CONFIG_DIR = ROOT / "experiments" / "configs"
RUN_ID_FILE = "mlflow_run_id"
"""Written next to the checkpoints: a resumed run continues the same MLflow run."""


def _as_seed(value) -> int:
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


class DrafterCLI(LightningCLI):
    """LightningCLI for ``DrafterModule`` subclasses on the one ``DrafterDataModule``."""

    def __init__(self, args=None, run: bool = True, **kwargs):
        kwargs.setdefault("trainer_defaults", {"callbacks": [MarkFailedOnError()]})
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
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.every_n_epochs": 1,
                             "checkpoint.enable_version_counter": False})  # last.ckpt is always the newest
        parser.add_lightning_class_args(ExportDrafter, "export")
        parser.link_arguments("data.target", "model.init_args.target")
        parser.link_arguments("data.block_size", "model.init_args.block_size")
        parser.link_arguments("data.feature_layers", "model.init_args.feature_layers")
        parser.link_arguments("data.target_dtype", "model.init_args.target_dtype")
        parser.link_arguments("seed_everything", "data.seed", compute_fn=_as_seed)

    # ------------------------------------------------------------------ derived defaults

    def _cfg(self):
        return self.config[self.subcommand] if self.subcommand else self.config

    def _variant(self, cfg) -> str:
        if cfg.tracking.variant:
            return cfg.tracking.variant
        module, _, name = str(cfg.model.class_path).rpartition(".")
        return getattr(getattr(importlib.import_module(module), name), "variant", name)

    def before_instantiate_classes(self) -> None:
        cfg = self._cfg()
        seed = cfg.get("seed_everything")
        run_name = cfg.tracking.run_name or f"{self._variant(cfg)}-{cfg.tracking.preset or 'custom'}-s{_as_seed(seed)}"
        cfg.tracking.run_name = run_name
        if not cfg.trainer.get("default_root_dir"):
            cfg.trainer.default_root_dir = str(project_root() / "results" / "train" / run_name)
        if not cfg.checkpoint.get("dirpath"):
            cfg.checkpoint.dirpath = str(Path(cfg.trainer.default_root_dir) / "checkpoints")

    def instantiate_trainer(self, **kwargs):
        cfg = self._cfg()
        if cfg.tracking.enabled and cfg.trainer.get("logger") in (None, True):
            kwargs["logger"] = make_mlflow_logger(
                cfg.tracking.experiment,
                cfg.tracking.run_name,
                variant=self._variant(cfg),
                preset=cfg.tracking.preset,
                seed=_as_seed(cfg.get("seed_everything")),
                table=cfg.tracking.table,
                tracking_uri=cfg.tracking.tracking_uri,
                run_id=self._resume_run_id(cfg),
            )
        return super().instantiate_trainer(**kwargs)

    def _resume_run_id(self, cfg) -> str | None:
        ckpt_path = cfg.get("ckpt_path")
        if not ckpt_path:
            return None
        folder = Path(cfg.checkpoint.dirpath) if ckpt_path == "last" else Path(ckpt_path).parent
        marker = folder / RUN_ID_FILE
        return marker.read_text().strip() if marker.is_file() else None

    def _run_subcommand(self, subcommand: str) -> None:
        for logger in self.trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                _ = logger.run_id  # start the run now: a crash in data preparation is recorded FAILED too
        with mark_failed_on_error(lambda: self.trainer.loggers):
            super()._run_subcommand(subcommand)


def main(args=None, run: bool = True) -> DrafterCLI:
    return DrafterCLI(args=args, run=run)


if __name__ == "__main__":
    main()
