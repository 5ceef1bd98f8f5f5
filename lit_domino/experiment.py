"""One drafter variant, end to end, from the YAML configs: the core of ablation.py, sweeps and dloop.py.

The YAML files under ``experiments/configs/`` are the single source of truth:
``<variant>.yaml`` chooses the LightningModule and its hyper-parameters,
``presets/<preset>.yaml`` the sizes; ``experiments/train.py`` (LightningCLI) reads the
very same files. :func:`load_config` merges them (+ a seed and dotted overrides),
:func:`train_variant` trains one variant through the artifact cache (a finished
drafter with the same config is reused; a killed run resumes from its last
checkpoint) and tracks it in MLflow (a crash leaves the run FAILED).
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from lit_domino import cache
from lit_domino.tracking import MarkFailedOnError, log_config, make_mlflow_logger, mark_failed_on_error, project_root

CONFIG_DIR = project_root() / "experiments" / "configs"
PRESETS = ("smoke", "default", "paper")
_LINKED = ("target", "block_size", "feature_layers", "target_dtype")
"""Model keys that always follow the data section (as the CLI links them)."""


# --------------------------------------------------------------------------- configs


def available_variants(config_dir: Path = CONFIG_DIR) -> list[str]:
    return sorted(p.stem for p in Path(config_dir).glob("*.yaml"))


def _read_yaml(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f) or {}


def deep_merge(base: dict, update: dict) -> dict:
    """``update`` into a copy of ``base``; nested dicts merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def set_dotted(cfg: dict, key: str, value: Any) -> None:
    """``"model.rank"`` or ``"model.init_args.rank"`` → ``cfg["model"]["init_args"]["rank"]``."""
    parts = key.split(".")
    if parts[0] == "model" and len(parts) == 2:
        parts = ["model", "init_args", parts[1]]
    node = cfg
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {key!r}: {part!r} is not a section")
    node[parts[-1]] = value


def load_config(variant: str, preset: str = "default", seed: int = 0, overrides: dict | None = None,
                config_dir: Path = CONFIG_DIR) -> dict:
    """The merged config of ``variant`` under ``preset`` with ``seed`` and dotted ``overrides``."""
    config_dir = Path(config_dir)
    variants = available_variants(config_dir)
    if variant not in variants:
        raise ValueError(f"unknown variant {variant!r}; choose one of {variants} (files in {config_dir})")
    if preset not in PRESETS or not (config_dir / "presets" / f"{preset}.yaml").is_file():
        raise ValueError(f"unknown preset {preset!r}; choose one of {list(PRESETS)}")
    cfg = deep_merge(_read_yaml(config_dir / f"{variant}.yaml"), _read_yaml(config_dir / "presets" / f"{preset}.yaml"))
    cfg["seed_everything"] = int(seed)
    cfg.setdefault("data", {})["seed"] = int(seed)
    for key, value in (overrides or {}).items():
        set_dotted(cfg, key, value)
    init = cfg.setdefault("model", {}).setdefault("init_args", {})
    for key in _LINKED:
        if key in cfg["data"]:
            init[key] = cfg["data"][key]
    cfg.setdefault("tracking", {})["variant"] = variant
    cfg["tracking"]["preset"] = preset
    return cfg


def parse_override(text: str) -> tuple[str, Any]:
    """``"data.batch_size=8"`` → ``("data.batch_size", 8)``: the argparse type of ``--set KEY=VALUE`` (VALUE in YAML)."""
    import argparse

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--set takes KEY=VALUE (e.g. data.batch_size=8), got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise argparse.ArgumentTypeError(f"--set {key}: value is not valid YAML: {err}") from None


def training_key(cfg: dict) -> dict:
    """What determines a trained drafter (its cache key): seed, model, data and the optimisation length."""
    from lit_domino.target import target_identity

    trainer = cfg.get("trainer", {})
    keep = ("max_epochs", "max_steps", "precision", "accumulate_grad_batches", "gradient_clip_val")
    return {
        "target": target_identity(cfg["data"]["target"]),
        "seed": cfg.get("seed_everything"),
        "model": cfg.get("model"),
        "data": cfg.get("data"),
        "trainer": {k: trainer.get(k) for k in keep},
    }


def instantiate(spec: dict, **extra):
    """``{"class_path": "pkg.Class", "init_args": {...}}`` → an instance."""
    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls(**{**(spec.get("init_args") or {}), **extra})


# --------------------------------------------------------------------------- training


class TrainStats:
    """Lightning callback: tokens/s over the fit and the process's peak resident memory."""

    def __new__(cls, *args, **kwargs):  # subclass Callback lazily (importing lightning is slow)
        from lightning.pytorch.callbacks import Callback

        class _TrainStats(Callback):
            def __init__(self):
                self.tokens, self.seconds, self.peak_rss_mb = 0, 0.0, 0.0

            def _rss(self):
                import psutil

                self.peak_rss_mb = max(self.peak_rss_mb, psutil.Process().memory_info().rss / 2**20)

            def on_train_start(self, trainer, pl_module):
                self._t0 = time.perf_counter()
                self._rss()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                self.tokens += int(batch["attention_mask"].sum())
                if batch_idx % 10 == 0:
                    self._rss()

            def on_train_end(self, trainer, pl_module):
                self.seconds = time.perf_counter() - self._t0
                self._rss()

        return _TrainStats()


@dataclass
class TrainedDrafter:
    """A trained (or cached) drafter: where it is, how it was made, how training went."""

    variant: str
    preset: str
    seed: int
    drafter_dir: Path
    report: dict = field(default_factory=dict)
    run_id: str | None = None
    from_cache: bool = False


def drafter_artifact(cfg: dict, root: Path | None = None) -> Path:
    t = cfg["tracking"]
    return cache.artifact_dir("drafters", training_key(cfg), name=f"{t['variant']}-s{cfg['seed_everything']}",
                              root=root)


def train_variant(
    cfg: dict,
    *,
    experiment: str = "train",
    run_name: str | None = None,
    table: str | None = None,
    callbacks: Iterable = (),
    parent_run_id: str | None = None,
    progress: bool = True,
    root: Path | None = None,
) -> TrainedDrafter:
    """Train the variant of ``cfg`` (or reuse the cached drafter) and export it with ``save_pretrained``."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    t = cfg["tracking"]
    variant, preset, seed = t["variant"], t.get("preset"), int(cfg["seed_everything"])
    path = drafter_artifact(cfg, root)
    if cache.is_complete(path):
        report = json.loads((path / "report.json").read_text())
        return TrainedDrafter(variant, preset, seed, path / "drafter", report, report.get("run_id"), True)
    path.mkdir(parents=True, exist_ok=True)
    run_id_file = path / "mlflow_run_id"
    tags = {"mlflow.parentRunId": parent_run_id} if parent_run_id else None
    logger = make_mlflow_logger(
        experiment, run_name or f"{variant}-{preset}-s{seed}", variant=variant, preset=preset, seed=seed,
        table=table, tags=tags, run_id=run_id_file.read_text().strip() if run_id_file.exists() else None,
    )
    with mark_failed_on_error([logger]):
        L.seed_everything(seed, workers=True, verbose=False)
        datamodule = instantiate({"class_path": "lit_domino.data.datamodule.DrafterDataModule",
                                  "init_args": cfg["data"]})
        module = instantiate(cfg["model"])
        stats = TrainStats()
        trainer_kwargs = {k: v for k, v in cfg.get("trainer", {}).items() if k != "default_root_dir"}
        trainer_kwargs["enable_progress_bar"] = progress and trainer_kwargs.get("enable_progress_bar", True)
        trainer = L.Trainer(
            **trainer_kwargs,
            default_root_dir=str(path),
            logger=logger,
            enable_model_summary=False,
            # save_top_k=1, not 0: Lightning writes last.ckpt only in a step that saved a top-k checkpoint
            callbacks=[ModelCheckpoint(dirpath=path / "ckpt", save_last=True, every_n_epochs=1, save_top_k=1,
                                       enable_version_counter=False),
                       MarkFailedOnError(), stats, *callbacks],
        )
        run_id_file.write_text(logger.run_id)
        log_config(logger, cfg, yaml.safe_dump(cfg, sort_keys=False))
        last = path / "ckpt" / "last.ckpt"
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(last) if last.exists() else None)
        if trainer.interrupted:
            raise KeyboardInterrupt(f"training of {variant} was interrupted")
        module.save_drafter(path / "drafter")
        own = sum(p.numel() for p in module.drafter.parameters())
        report = {
            "variant": variant, "preset": preset, "seed": seed, "run_id": logger.run_id,
            "drafter_parameters": int(own),
            "train_seconds": round(stats.seconds, 1),
            "train_tokens_per_s": round(stats.tokens / stats.seconds, 1) if stats.seconds else None,
            "peak_rss_mb": round(stats.peak_rss_mb, 1),
            "optimizer_steps": int(trainer.global_step),
            **{k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")},
        }
        for key in ("drafter_parameters", "train_seconds", "train_tokens_per_s", "peak_rss_mb"):
            if report[key] is not None:
                logger.experiment.log_metric(logger.run_id, f"train/{key}", report[key])
        logger.experiment.set_tag(logger.run_id, "drafter_dir", str(path / "drafter"))
    (path / "report.json").write_text(json.dumps(report, indent=2))
    cache.mark_complete(path, training_key(cfg))
    for ckpt in (path / "ckpt").glob("*.ckpt"):  # resume state, useless once finished
        os.remove(ckpt)
    return TrainedDrafter(variant, preset, seed, path / "drafter", report, logger.run_id, False)
