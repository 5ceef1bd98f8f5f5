"""DLoop's loop-aware training: fine-tune a trained backbone / Domino / EAGLE-3 / DSpark / DFlash 2 drafter to draft
well when its context holds its own unverified drafts.

Per optimizer step a stage depth ``S`` is drawn (uniform over ``min_stages..max_stages``, seeded by
``seed`` and the global step, so a resumed run draws the same depths); every anchor of the batch
unrolls ``S`` drafting stages (:func:`lit_domino.models.loop.loop_forward`: stage 1 sees target
features, stage ``s > 1`` sees the drafter's own hidden states of the earlier stages in place of
them, exactly as the sessions draft at inference), and the loss is ``½(L_stage1 + L_stageS)``
with each drafter's usual per-stage loss:

* backbone: the position-weighted block CE;
* Domino: its curriculum loss ``λ·CE(base) + (1-λ)·CE(final)`` (default ``λ = 0``: the drafter
  already finished its curriculum; any :class:`~lit_domino.models.objectives.LambdaSchedule` works);
* EAGLE-3: ``Σ_k decay^(k-1)·CE_k`` over the stage's ``K`` chain steps (its TTT loss per stage);
* DSpark: DeepSpec's ``0.1·CE + 0.9·TV(q, p) + 1.0·BCE(conf, 1 − TV)`` per stage, p the target's
  distribution at the stage's (ground-truth) positions, from the same cached features.
* DFlash 2: ``KL(p ‖ q_unary) + 1.0·CE(selector)`` per stage, p as for DSpark
  (:class:`~lit_domino.models.distill.DistilledDrafter` reads it for every stage).

With ``S = 1`` the loss is exactly the variant's ordinary training loss. The module starts from a
``save_pretrained`` directory (``init_from``; a :class:`~lit_domino.training.experiment.TrainedDrafter` works
too), binds it to the target (``DrafterMismatchError`` when the target's fingerprint differs) and
adds no parameters: the exported drafter loads and decodes like the original.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import torch

from lit_domino.lit.base import DrafterModule, StepOutput
from lit_domino.models import read_config, registry
from lit_domino.interop import load_drafter
from lit_domino.models.domino import CAUSAL_INPUTS
from lit_domino.models.loop import check_stages, loop_forward
from lit_domino.models.objectives import IGNORE_INDEX, LambdaSchedule, LossSettings


def _drafter_dir(init_from) -> Path:
    path = getattr(init_from, "drafter_dir", init_from)  # a TrainedDrafter or a path
    if path is None:
        raise ValueError("init_from is required: the save_pretrained directory of the drafter to fine-tune")
    return Path(path).expanduser()


def read_drafter_config(init_from):
    """The config of the drafter directory ``init_from`` (clear errors for a missing or corrupt one)."""
    try:
        return read_config(_drafter_dir(init_from))
    except FileNotFoundError as err:
        raise FileNotFoundError(f"init_from: {err}; give the save_pretrained directory of a trained drafter "
                                "(e.g. TrainedDrafter.drafter_dir)") from None


class LoopModule(DrafterModule):
    """Loop-aware fine-tuning of an existing drafter (DLoop; see the module docstring).

    Args (beyond :class:`~lit_domino.lit.base.DrafterModule`'s optimisation arguments; its
    architecture arguments are ignored, the architecture is the checkpoint's):
        init_from: ``save_pretrained`` directory (or ``TrainedDrafter``) of the drafter to fine-tune.
        max_stages: N, the deepest unroll (>= 1; 1 = ordinary training, a control).
        min_stages: the smallest depth drawn (clipped to N). Default 2: ``L_stage1`` is in every
            step's loss already, so S = 1 would only re-weight it.
        detach_stage_context: stop gradients through the substituted hidden states (the stage
            context) or let stage S's loss train the earlier stages that produced them. Default True:
            on the smoke study detaching gave equal or higher τ for every drafter (results/dloop/detach-*).
        seed: seeds the per-step depth draws (with the global step).
        causal_inputs: Domino only, the GRU inputs in training (``teacher_forced`` | ``training_time_test``).
        curriculum: Domino only, λ of ``λ·CE(base) + (1-λ)·CE(final)`` per stage. Default ``none`` (λ = 0).
        step_decay: EAGLE-3 only, chain step k of a stage weighs ``step_decay**(k-1)``.
        stage_tokens: EAGLE-3 only, chain steps per stage; None = ``block_size - 1`` (what the engine
            drafts per stage). Parallel drafters always draft ``block_size - 1``.

    Logs ``train/stage_depth``, ``train/loss_stage1``, ``train/loss_stageS``; validation unrolls all
    N stages (``val/loss`` = ``½(L_1 + L_N)``, ``val/loss_stage{s}``, ``val/acc_stage{s}``) and feeds
    stage 1 to the per-position metrics.
    """

    variant = "loop"

    def __init__(
        self,
        init_from: Any = None,
        max_stages: int = 3,
        min_stages: int = 2,
        detach_stage_context: bool = True,
        seed: int = 0,
        causal_inputs: Literal["teacher_forced", "training_time_test"] = "teacher_forced",
        curriculum: LambdaSchedule = LambdaSchedule("none"),
        step_decay: float = 0.8,
        stage_tokens: int | None = None,
        **kwargs,
    ):
        config = read_drafter_config(init_from)
        method = registry.drafter_class(config.kind)
        if not method.supports_loop_training:
            able = [k for k in registry.kinds() if registry.drafter_class(k).supports_loop_training]
            raise ValueError(f"loop-aware training fine-tunes {', '.join(able)} drafters; {init_from} holds a "
                             f"{config.kind!r} drafter (it has no hidden-state context to substitute)")
        for name, value in (("max_stages", max_stages), ("min_stages", min_stages)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1 (stages unrolled per anchor; 1 = no loop), "
                                 f"got {value!r}")
        if causal_inputs not in CAUSAL_INPUTS:
            raise ValueError(f"causal_inputs must be one of {CAUSAL_INPUTS}, got {causal_inputs!r}")
        if not 0.0 < step_decay <= 1.0:
            raise ValueError(f"step_decay must be in (0, 1], got {step_decay}")
        kwargs.setdefault("block_size", config.block_size)
        if int(kwargs["block_size"]) != config.block_size:
            raise ValueError(f"block_size {kwargs['block_size']} differs from the checkpoint's {config.block_size} "
                             f"({init_from}): set data.block_size to the drafter's")
        if stage_tokens is not None and (not isinstance(stage_tokens, int) or stage_tokens < 1):
            raise ValueError(f"stage_tokens must be an integer >= 1, got {stage_tokens!r}")
        if isinstance(curriculum, dict):
            curriculum = LambdaSchedule(**curriculum)
        super().__init__(**kwargs)
        self.drafter_class = method
        self.init_config = config
        self.curriculum = curriculum
        self.stage_tokens = method.stage_tokens(config, stage_tokens)  # raises where the method fixes it
        check_stages(_ConfigOnly(config), max_stages, stage_tokens=self.stage_tokens)  # N·K below the position limit
        self.hparams["init_from"] = str(_drafter_dir(init_from))
        self.hparams["curriculum"] = dataclasses.asdict(curriculum)
        self.hparams["kind"] = config.kind

    # ------------------------------------------------------------------ drafter

    def build_drafter(self, feature_layers: list[int] | None = None):
        """Load ``init_from`` bound to the target (``DrafterMismatchError`` for a different target)."""
        if self.drafter is not None:
            return self.drafter
        drafter = load_drafter(self.hparams.init_from, target=self.target)
        if feature_layers is not None and [int(j) for j in feature_layers] != list(drafter.config.feature_layers):
            raise ValueError(f"the DataModule's feature layers {list(feature_layers)} differ from the drafter's "
                             f"{drafter.config.feature_layers} ({self.hparams.init_from}); train on the data config "
                             "the drafter was trained with")
        self.drafter = self.apply_train_options(drafter).train(self.training)
        self.drafter_config = drafter.config
        self.hparams["feature_layers"] = list(drafter.config.feature_layers)
        return drafter

    def _check_datamodule(self, dm) -> None:
        super()._check_datamodule(dm)
        max_length = (getattr(dm, "hparams", {}) or {}).get("max_length")
        if max_length is not None:
            K, limit = self.stage_tokens, self.init_config.max_position_embeddings
            if int(max_length) + self.hparams.max_stages * K > limit:
                raise ValueError(f"data max_length {max_length} + max_stages {self.hparams.max_stages} x {K} tokens "
                                 f"exceeds the drafter's max_position_embeddings {limit}; lower max_stages or "
                                 "max_length")

    @property
    def metric_block_size(self) -> int:
        return int(self.hparams.block_size)

    # ------------------------------------------------------------------ stages

    def stage_depth(self, step: int | None = None) -> int:
        """The depth S of optimizer step ``step`` (default: the current one); deterministic per (seed, step)."""
        n = int(self.hparams.max_stages)
        lo = min(int(self.hparams.min_stages), n)
        step = int(self.global_step if step is None else step)
        g = torch.Generator().manual_seed(int(self.hparams.seed) * 1_000_003 + step)
        return int(torch.randint(lo, n + 1, (1,), generator=g))

    def current_lambda(self) -> float:
        return self.curriculum.value(self.global_step, self.total_steps())

    def stages(self, batch: dict, num_stages: int, stage: str = "train", context_fn=None):
        """Unroll ``num_stages`` stages on ``batch`` → list of ``BlockOutput`` (one per stage)."""
        n = int(self.hparams.max_stages)
        if num_stages > n:
            raise ValueError(f"stage depth {num_stages} is above the block budget of max_stages = {n} stages")
        causal = self.hparams.causal_inputs if stage == "train" else "teacher_forced"
        return loop_forward(
            self.drafter, batch["input_ids"], batch["features"], batch["anchors"], batch["anchor_mask"], num_stages,
            loss_mask=batch.get("loss_mask"), attention_mask=batch.get("attention_mask"),
            detach_stage_context=bool(self.hparams.detach_stage_context), causal_inputs=causal,
            stage_tokens=self.stage_tokens, context_fn=context_fn, with_logits=self.with_logits,
        )

    def loss_settings(self, lam: float = 0.0) -> LossSettings:
        return LossSettings(self.position_weights, lam=lam, step_decay=float(self.hparams.step_decay),
                            chunk_size=self.hparams.loss_chunk_size)

    def stage_loss(self, out, lam: float = 0.0) -> tuple[torch.Tensor, dict]:
        """The drafter's own loss of one stage (its ``block_loss``) → (loss, parts to log)."""
        return self.drafter.block_loss(out, self.loss_settings(lam))

    def preds(self, out) -> torch.Tensor:
        return self.drafter.block_preds(out, self.hparams.loss_chunk_size)

    def forward_step(self, batch: dict, stage: str, num_stages: int | None = None) -> StepOutput:
        n = int(self.hparams.max_stages)
        if num_stages is None:
            num_stages = self.stage_depth() if stage == "train" else n
        uses_lambda = self.drafter_class.uses_curriculum
        lam = self.current_lambda() if stage == "train" and uses_lambda else 0.0
        outs = self.stages(batch, num_stages, stage)
        l1, parts1 = self.stage_loss(outs[0], lam)
        logs: dict[str, Any] = {"stage_depth": float(num_stages), "loss_stage1": l1.detach()}
        if uses_lambda and stage == "train":
            logs["lambda"] = float(lam)
        if num_stages == 1:
            loss = l1
        else:
            ls, _ = self.stage_loss(outs[-1], lam)
            logs["loss_stageS"] = ls.detach()
            has_labels = bool((outs[-1].labels != IGNORE_INDEX).any())
            loss = 0.5 * (l1 + ls) if has_labels else l1  # no label at depth S in this batch: stage 1 only
        if stage != "train":
            for s, out in enumerate(outs, start=1):
                if s > 1:
                    logs[f"loss_stage{s}"] = self.stage_loss(out, lam)[0].detach()
                valid = out.labels != IGNORE_INDEX
                if valid.any():
                    logs[f"acc_stage{s}"] = (self.preds(out)[valid] == out.labels[valid]).float().mean()
            return StepOutput(loss=loss, logs=logs, preds=self.preds(outs[0]), labels=outs[0].labels)
        return StepOutput(loss=loss, logs=logs)


class _ConfigOnly:
    """Just enough of a drafter for :func:`check_stages` before the weights are loaded."""

    def __init__(self, config):
        self.config = config
