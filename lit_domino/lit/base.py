"""The LightningModule every drafter variant shares.

:class:`DrafterModule` owns what all variants have in common:

* the frozen target, obtained from the DataModule when there is one (so the
  DataModule and the module hold the *same* object) or from
  :func:`lit_domino.target.load.load_target` (memoised per process). It is a plain
  attribute, not a registered submodule: it is in neither checkpoints nor the
  optimizer, and it follows the module to its device at the start of each stage;
* the drafter (``self.drafter``), built from ``DrafterConfig.from_target`` in
  :meth:`setup` / :meth:`configure_model` and bound to the target;
* AdamW with linear warmup + cosine decay counted in optimizer steps
  (``trainer.estimated_stepping_batches``); gradient clipping is the Trainer's;
* position weights, ``train/loss`` + ``train/lr`` logging, validation metrics
  (``val/loss``, ``val/acc_pos_{k:02d}``, ``val/tau_sim``, ``val/tau_prefix``);
* :meth:`save_drafter` (``save_pretrained`` export) and checkpoint extras
  (drafter config, target fingerprint, RNG states) so a run resumes exactly.

A variant names its drafter class (``drafter_class``, a registered method of
``lit_domino.models``), maps its own hyper-parameters to the method's config
(:meth:`drafter_options`) and calls the method's forward and loss in
:meth:`forward_step`; nothing else.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.loggers import MLFlowLogger

from lit_domino.lit.metrics import PositionAccuracy, PrefixAcceptance, tau_sim
from lit_domino.models import Drafter, build_drafter
from lit_domino.models.layers import TrainOptions
from lit_domino.models.objectives import (DEFAULT_CHUNK_SIZE, LossSettings, check_block_size, check_chunk_size,
    position_weights)
from lit_domino.lit import objective as _objective
# The checkpoint's extras and load_module live apart; their names stay importable from here.
from lit_domino.lit.checkpoints import EXTRA_KEY, rng_states, set_rng_states, load_module  # noqa: F401
from lit_domino.target.load import Target, load_target

log = logging.getLogger(__name__)

@dataclass
class StepOutput:
    """What a variant's :meth:`DrafterModule.forward_step` returns.

    ``loss`` is optimised; ``logs`` are logged as ``{stage}/{name}``; ``preds``
    (logits ``[..., B, V]`` or ids ``[..., B]``) and ``labels`` (``[..., B]``,
    -100 = none) feed the per-position validation metrics.
    """

    loss: torch.Tensor
    logs: dict[str, Any] = field(default_factory=dict)
    preds: torch.Tensor | None = None
    labels: torch.Tensor | None = None


def resolve_target(spec, dtype: str = "float32"):
    """A :class:`~lit_domino.target.load.Target` object as is, else ``load_target(spec, dtype)`` (memoised,
    on the GPU when there is one: the same copy the DataModule gets)."""
    if isinstance(spec, Target):
        return spec
    return load_target(spec, dtype=dtype, device="auto")


def check_positive(**values) -> None:
    """Raise ``ValueError`` naming the first hyper-parameter that is not a positive integer."""
    for name, value in values.items():
        if value is None or isinstance(value, bool) or int(value) < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")


def method_config(config_class: type, value, name: str = "head"):
    """``value`` as a ``config_class`` dataclass (a method's section, e.g. ``DominoHeadConfig``): a copy of an
    instance (the signature's default is shared), a mapping of its fields (a checkpoint's hparams, a dict in
    code), None = its defaults. The dataclass checks its own fields (``__post_init__``, the copy too); an unknown
    field is a ``ValueError`` naming it."""
    if value is None:
        return config_class()
    if isinstance(value, config_class):
        return dataclasses.replace(value)
    if isinstance(value, dict):
        known = [f.name for f in dataclasses.fields(config_class)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"{name}: unknown {config_class.__name__} field(s) {unknown}; it has {', '.join(known)}")
        return config_class(**value)
    raise ValueError(f"{name}: expected a {config_class.__name__} or a mapping of its fields, got {value!r}")


def refuse_moved(kwargs: dict, config_class: type, name: str = "head") -> None:
    """A former flat argument that is now a field of the ``name`` section (``rank=8``, or a checkpoint written
    before the move) → ``ValueError`` naming its new place, instead of Python's bare unexpected-keyword error."""
    moved = [f.name for f in dataclasses.fields(config_class) if f.name in kwargs]
    if moved:
        raise ValueError(", ".join(f"{k} moved to {name}.{k}" for k in moved)
                         + f": pass {name}={config_class.__name__}(...) in Python, model.{name}.<field> in a config "
                         "(a checkpoint with them flat was written by an older lit_domino: retrain it)")


def warmup_cosine(step: int, total: int, warmup_ratio: float, min_lr_ratio: float) -> float:
    """LR multiplier: linear warmup over ``round(warmup_ratio·total)`` steps, then cosine to ``min_lr_ratio``."""
    total = max(1, int(total))
    warmup = int(round(warmup_ratio * total))
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class DrafterModule(L.LightningModule):
    """Shared training logic for the drafter variants (see the module docstring).

    Args:
        target: the target: a model directory, a hub id or ``embedded:<preset>``
            (linked from ``data.target`` by the CLI); a ``Target`` object is
            accepted in code (tests) and recorded by its name.
        num_layers: draft decoder layers (EAGLE-3 always has one).
        block_size: drafting block size B (positions 1..B-1 are drafted); for the
            chain drafters (EAGLE-3 uses ``ttt_steps``, the small LM) it sizes the metrics.
        gamma: decay of the position weights ``exp(-(k-1)/γ)``; None = 7 for B = 16,
            4 for B = 8 (``objectives.default_gamma``).
        lr: peak AdamW learning rate.
        betas: AdamW betas.
        weight_decay: AdamW weight decay (decoupled).
        warmup_ratio: fraction of the optimizer steps spent in linear warmup.
        min_lr_ratio: the cosine decays to ``lr·min_lr_ratio``.
        feature_layers: target decoder layers the drafter reads; None = the
            DataModule's (or, without one, the variant's default rule).
        drafter_options: extra fields of the method's config (e.g. ``{"num_heads": 4}``).
        target_dtype: the frozen target's dtype (linked from ``data.target_dtype``).
        loss_chunk_size: labelled positions the LM head runs on at once in the loss, each chunk's logits
            recomputed in the backward pass (the lean training step: no full-vocabulary logits of every
            position); None = one chunk, the full logits materialised as before (reference, memory-hungry).
        attention: training attention masks: ``auto`` (flex-attention block masks on CUDA, dense on CPU),
            ``dense`` (boolean mask tensors) or ``flex`` (CUDA only). Same results either way.
        activation_checkpointing: recompute each draft layer's activations in the backward pass.
        objective: the training objective (``lit_domino.models.objectives``: a name or ``{name: ..., <setting>:
            ...}``); None = the method's own loss, as before objectives were selectable (``docs/objectives.md``).
    """

    variant: str = "drafter"
    """Name of the variant (MLflow tag ``variant``)."""

    drafter_class: type[Drafter] = Drafter
    """The method this module trains (a registered class of ``lit_domino.models``)."""

    def __init__(
        self,
        target: Any = "embedded:default",
        num_layers: int = 1,
        block_size: int = 16,
        gamma: float | None = None,
        lr: float = 6e-4,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
        warmup_ratio: float = 0.04,
        min_lr_ratio: float = 0.0,
        feature_layers: list[int] | None = None,
        drafter_options: dict[str, Any] | None = None,
        target_dtype: str = "float32",
        loss_chunk_size: int | None = DEFAULT_CHUNK_SIZE,
        attention: Literal["auto", "dense", "flex"] = "auto",
        activation_checkpointing: bool = False,
        objective: dict[str, Any] | str | None = None,
    ):
        super().__init__()
        check_chunk_size(loss_chunk_size)
        TrainOptions(attention=attention)  # validated at construction
        check_block_size(block_size)
        check_positive(num_layers=num_layers)
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not 0.0 <= warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self._target_obj = None if isinstance(target, (str, Path)) else target
        self.save_hyperparameters(ignore=["target"])
        self.hparams["target"] = str(target) if isinstance(target, (str, Path)) else getattr(target, "name", "target")
        self.hparams["betas"] = tuple(float(b) for b in betas)
        self.set_objective(objective)  # checked here: a bad objective fails at construction
        # validated here: γ ≤ 0 fails at construction, not at the first step
        self.register_buffer("position_weights", position_weights(block_size, gamma), persistent=False)
        self.drafter: Drafter | None = None
        self.drafter_config = None
        self._target = None
        self.val_acc = PositionAccuracy(self.metric_block_size)
        self.val_prefix = PrefixAcceptance(self.metric_block_size)

    # ------------------------------------------------------------------ the selected objective (lit/objective.py)

    supports_objective: bool = False
    """Whether the method's loss takes a selected objective (the block drafters and EAGLE-3 do)."""
    set_objective = _objective.set_objective
    reads_target_layer = _objective.reads_target_layer
    drafter_feature_layers = _objective.drafter_feature_layers
    data_feature_layers = _objective.data_feature_layers
    split_target_layer = _objective.split_target_layer
    attach_target = _objective.attach_target

    # ------------------------------------------------------------------ variant hooks

    def drafter_options(self) -> dict[str, Any]:
        """The method's config fields from this variant's hyper-parameters (beyond num_layers, block_size,
        feature_layers); none by default."""
        return {}

    def check_drafter_options(self) -> None:
        """The ``drafter_options`` argument may not repeat a field this module sets itself (``head``: the
        module's own argument, the one place it is set)."""
        clash = sorted(set(self.hparams.drafter_options or {}) & set(self.drafter_options()))
        if clash:
            raise ValueError(f"drafter_options {clash}: set by {type(self).__name__}'s own argument(s) of that name "
                             f"(model.{clash[0]} in a config), not in drafter_options")

    def forward_step(self, batch: dict, stage: str) -> StepOutput:
        """Loss, logs and metric inputs of one batch (``stage`` is ``train`` or ``val``)."""
        raise NotImplementedError

    def create_drafter(self, target, options: dict[str, Any]) -> Drafter:
        """A fresh drafter bound to ``target``, its config ``<method config>.from_target(target, **options)``."""
        config = self.drafter_class.config_class.from_target(target, **options)
        return build_drafter(config, target)

    def loss_settings(self, lam: float = 0.0) -> LossSettings:
        """What the method's ``block_loss`` needs from this module (position weights; λ for Domino; chunking)."""
        return LossSettings(self.position_weights, lam=lam, chunk_size=self.hparams.loss_chunk_size,
                            objective=self.objective)

    @property
    def with_logits(self) -> bool:
        """Whether forwards materialise full logits (only for ``loss_chunk_size: null``, the reference path)."""
        return self.hparams.loss_chunk_size is None

    def apply_train_options(self, drafter: Drafter) -> Drafter:
        """Set the drafter's training-forward options (attention masks, layer checkpointing, chunking)."""
        h = self.hparams
        drafter.train_options = TrainOptions(attention=h.attention, checkpoint_layers=bool(h.activation_checkpointing),
                                             chunk_size=h.loss_chunk_size)
        return drafter

    @property
    def uses_features(self) -> bool:
        """Whether the drafter reads target features (False for the small LM)."""
        return self.drafter_class.config_class.feature_rule is not None

    uses_blocks: bool = True
    """Whether training uses the DataModule's anchored blocks of ``block_size`` (False for EAGLE-3)."""

    @property
    def metric_block_size(self) -> int:
        """Block size of the per-position metrics (the drafting block by default)."""
        return int(self.hparams.block_size)

    # ------------------------------------------------------------------ target + drafter

    @property
    def target(self):
        """The frozen target (not a submodule)."""
        if self._target is None:
            dm = self._datamodule()
            if self._target_obj is not None:
                self._target = self._target_obj
            elif dm is not None and callable(getattr(dm, "load_target", None)):
                self._target = dm.load_target()  # the DataModule's copy (its dtype and device)
            else:
                self._target = resolve_target(self.hparams.target, self.hparams.target_dtype)
        return self._target

    def _datamodule(self):
        trainer = self._trainer
        return getattr(trainer, "datamodule", None) if trainer is not None else None

    def setup(self, stage: str) -> None:
        dm = self._datamodule()
        target = layers = None
        if dm is not None:
            if callable(getattr(dm, "load_target", None)):
                target = dm.load_target()
            elif getattr(dm, "target", None) is not None:
                target = dm.target
            layers = getattr(dm, "feature_layers", None)
        if target is not None:
            self._target = target
        if dm is not None:
            self._check_datamodule(dm)
        if layers is not None:
            layers = [int(j) for j in layers]
            mine = self.hparams.feature_layers
            if self.uses_features and mine is not None and list(mine) != layers and self.drafter is None:
                raise ValueError(
                    f"model feature_layers {list(mine)} differ from the DataModule's {layers}; set them on the data "
                    "side only (the CLI links them)"
                )
        self.build_drafter(feature_layers=layers)

    def _check_datamodule(self, dm) -> None:
        """Fail early on hyper-parameters the module shares with the DataModule but disagree on."""
        dm_hp = getattr(dm, "hparams", {}) or {}
        if "block_size" in dm_hp and int(dm_hp["block_size"]) != int(self.hparams.block_size) and self.uses_blocks:
            raise ValueError(
                f"model block_size {self.hparams.block_size} != data block_size {dm_hp['block_size']}: the anchors' "
                "blocks and the drafter must agree (the CLI links data.block_size to the model)"
            )
        # the module's own feature_layers default (None) means "the DataModule's": log it as the DataModule's
        # value so Lightning's hparam merge (module vs DataModule) does not see a conflict
        initial = getattr(self, "_hparams_initial", None)
        if "feature_layers" in dm_hp and initial is not None and initial.get("feature_layers") is None:
            initial["feature_layers"] = dm_hp["feature_layers"]

    def configure_model(self) -> None:
        self.build_drafter()

    def build_drafter(self, feature_layers: list[int] | None = None) -> Drafter:
        """Build (once) the drafter from the target and this module's hyper-parameters, bound to the target."""
        if self.drafter is not None:
            return self.drafter
        target = self.target
        if feature_layers is None:
            feature_layers = self.hparams.feature_layers
        options = {
            "num_layers": int(self.hparams.num_layers),
            "block_size": int(self.hparams.block_size),
            **self.drafter_options(),
            **dict(self.hparams.drafter_options or {}),
        }
        if feature_layers is not None and self.uses_features:
            options["feature_layers"] = self.drafter_feature_layers([int(j) for j in feature_layers], target)
        # without them, the method config's from_target applies its rule (DFlash / EAGLE-3 / none)
        drafter = self.apply_train_options(self.create_drafter(target, options))
        config = drafter.config
        self.drafter_config = config
        self.drafter = drafter
        # recorded: a checkpoint (load_from_checkpoint) rebuilds the same drafter
        self.hparams["feature_layers"] = self.data_feature_layers(config, target) if self.uses_features else None
        return drafter

    def _target_to_device(self) -> None:
        target = self.target
        if target.device != self.device:
            target.model.to(self.device)

    def on_fit_start(self) -> None:
        self._target_to_device()

    def on_validation_start(self) -> None:
        self._target_to_device()

    def on_test_start(self) -> None:
        self._target_to_device()

    def on_predict_start(self) -> None:
        self._target_to_device()

    def train(self, mode: bool = True):
        super().train(mode)
        if self._target is not None:  # the frozen target never leaves eval mode
            self._target.model.eval()
        return self

    # ------------------------------------------------------------------ optimisation

    def configure_optimizers(self):
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        if not params:
            raise RuntimeError("the drafter has no trainable parameters")
        h = self.hparams
        optimizer = torch.optim.AdamW(params, lr=h.lr, betas=tuple(h.betas), weight_decay=h.weight_decay)
        total = self.total_steps()
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, total, h.warmup_ratio, h.min_lr_ratio)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}

    def total_steps(self) -> int:
        """Optimizer steps of the whole fit (``trainer.estimated_stepping_batches``)."""
        if self._trainer is None:
            return 1
        total = self.trainer.estimated_stepping_batches
        if total is None or not math.isfinite(total) or total <= 0:
            raise ValueError(
                "the LR schedule and λ curriculum need a finite number of optimizer steps: set trainer.max_epochs "
                "or trainer.max_steps"
            )
        return int(total)

    # ------------------------------------------------------------------ steps

    @staticmethod
    def _batch_size(batch: dict) -> int:
        return int(batch["input_ids"].shape[0])

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self.forward_step(batch, "train")
        if not self._logs_this_step():
            return out.loss
        bs = self._batch_size(batch)
        self.log("train/loss", out.loss.detach(), on_step=True, on_epoch=False, prog_bar=True, batch_size=bs)
        for name, value in out.logs.items():
            self.log(f"train/{name}", value, on_step=True, on_epoch=False, batch_size=bs)
        if self._trainer is not None and self.trainer.optimizers:
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False,
                     batch_size=bs)
        return out.loss

    def _logs_this_step(self) -> bool:
        """Whether this training step's ``train/*`` metrics reach the logger: on the steps Lightning writes
        (every ``trainer.log_every_n_steps``-th optimizer step) and without a trainer. A ``self.log`` call costs
        Lightning's bookkeeping whether or not the step is written (a measurable share of a small drafter's step:
        docs/results.md, 2026-12-07 (evening)), so the other steps make none; the metrics shown (progress bar,
        ``callback_metrics``) are then those of the last written step."""
        if self._trainer is None:
            return True
        every = self.trainer.log_every_n_steps
        return every > 0 and (self.global_step + 1) % every == 0

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out = self.forward_step(batch, "val")
        bs = self._batch_size(batch)
        # sync_dist: under DDP each rank validates its shard; the epoch value is the mean over ranks
        self.log("val/loss", out.loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=bs, sync_dist=True)
        for name, value in out.logs.items():
            self.log(f"val/{name}", value, on_step=False, on_epoch=True, batch_size=bs, sync_dist=True)
        if out.preds is not None and out.labels is not None:
            self.val_acc.update(out.preds, out.labels)
            self.val_prefix.update(out.preds, out.labels)

    def on_validation_epoch_end(self) -> None:
        # the metrics' states are sums that compute() reduces over ranks; decide on the reduced count too,
        # so that every rank takes the same branch (a rank with no labels must still join the reduction)
        total = self.val_acc.total.sum()
        if self._trainer is not None:
            total = self.trainer.strategy.reduce(total.float(), reduce_op="sum")
        if int(total) == 0:
            return
        acc = self.val_acc.compute()
        metrics = {f"val/acc_pos_{k:02d}": float(a) for k, a in enumerate(acc.tolist(), start=1)}
        metrics["val/tau_sim"] = tau_sim(acc)
        metrics["val/tau_prefix"] = float(self.val_prefix.compute())
        self.log_dict(metrics, on_step=False, on_epoch=True, sync_dist=True)  # equal on every rank already
        self.val_acc.reset()
        self.val_prefix.reset()

    # ------------------------------------------------------------------ export + checkpoints

    def save_drafter(self, directory: str | Path) -> Path:
        """Export the drafter with ``save_pretrained`` (loads with ``lit_domino.load_drafter``, no Lightning)."""
        if self.drafter is None:
            raise RuntimeError("the drafter has not been built yet (call build_drafter or fit first)")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.drafter.save_pretrained(directory)
        return directory

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        cls = type(self)
        extra = {"variant": self.variant, "module": f"{cls.__module__}.{cls.__qualname__}",
                 "drafter_config": self.drafter_config.to_dict() if self.drafter_config is not None else None,
                 "rng": rng_states()}
        if self._target is not None:
            extra["target_fingerprint"] = self._target.fingerprint()
        checkpoint[EXTRA_KEY] = extra

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        extra = checkpoint.get(EXTRA_KEY) or {}
        saved = extra.get("target_fingerprint")
        if saved is not None:
            current = self.target.fingerprint()
            diff = {k: (saved.get(k), current.get(k)) for k in current if saved.get(k) != current.get(k)}
            if diff:
                raise ValueError(
                    f"checkpoint was trained against a different target (field: (checkpoint, current)) {diff}; "
                    f"resume with the target it was trained on ({self.hparams.target!r})"
                )
        if extra.get("rng") is not None and self._trainer is not None and self.trainer.state.fn == "fit":
            set_rng_states(extra["rng"])  # a resumed fit continues the same random streams


class ExportDrafter(L.Callback):
    """At the end of a successful fit, export the drafter with ``save_pretrained``.

    Args:
        dirpath: export directory; None = ``<trainer.default_root_dir>/drafter``.
        log_to_mlflow: also upload it as an MLflow artifact (``drafter/``); the
            directory is always recorded as the run tag ``drafter_dir``.
    """

    def __init__(self, dirpath: str | None = None, log_to_mlflow: bool = False):
        self.dirpath = dirpath
        self.log_to_mlflow = log_to_mlflow
        self.exported: Path | None = None

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or not isinstance(pl_module, DrafterModule):
            return
        path = Path(self.dirpath) if self.dirpath else Path(trainer.default_root_dir) / "drafter"
        self.exported = pl_module.save_drafter(path.expanduser().resolve())
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.set_tag(logger.run_id, "drafter_dir", str(self.exported))
                if self.log_to_mlflow:
                    logger.experiment.log_artifacts(logger.run_id, str(self.exported), "drafter")
