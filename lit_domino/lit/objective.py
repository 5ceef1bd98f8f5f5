"""The selected training objective of a drafter module (``model.init_args.objective``), and the target's
distribution it may need.

:class:`~lit_domino.lit.base.DrafterModule` binds these functions as its methods. An objective that needs the
target's distribution p (``Objective.needs_target``) reads it from the features: DSpark and DFlash 2 always read
the ``dspark`` features (DFlash's layers, then the target's last layer); the backbone and Domino read them too
under such an objective (the training CLI picks the rule: ``training.configs.resolve_feature_rule``), and the
module hands the drafter DFlash's layers only (:func:`drafter_feature_layers`, :func:`split_target_layer`) and
attaches p's hidden states to each block output (:func:`attach_target`). EAGLE-3's features cannot carry it:
such an objective is refused at construction, as is any objective on a module that trains on its own loss only
(the small LM, DLoop's fine-tuning).
"""

from __future__ import annotations

import torch

from lit_domino.models.distill import block_starts, block_target_hidden
from lit_domino.models.objectives import TARGET_RULE, build_objective
from lit_domino.models.objectives.registry import missing_target_message


def set_objective(module, spec) -> None:
    """Build and check the objective of ``spec`` (``ValueError``, one line, on a bad one) and record it in the
    hparams as plain types (None stays None: a module that names none has the hparams it had before)."""
    objective = build_objective(spec)
    if objective is not None:
        name = type(module).__name__
        if not module.supports_objective:
            raise ValueError(f"objective: {name} trains on its own loss only; objectives apply to the backbone, "
                             "Domino, DSpark, DFlash 2 and EAGLE-3 modules")
        rule = module.drafter_class.config_class.feature_rule
        if objective.needs_target and rule not in ("dflash", TARGET_RULE):
            raise ValueError(missing_target_message(objective, f"{name} reads the {rule!r} features, which do not"))
    module.objective = objective
    module.hparams["objective"] = None if objective is None else objective.spec()


def reads_target_layer(module) -> bool:
    """Whether the features hold one layer beyond the drafter's: the target's last, for an objective that needs p
    on a drafter whose own rule does not read it (the backbone, Domino)."""
    objective = getattr(module, "objective", None)
    return bool(objective is not None and objective.needs_target
                and module.drafter_class.config_class.feature_rule != TARGET_RULE)


def drafter_feature_layers(module, layers: list[int], target) -> list[int]:
    """The drafter's feature layers of the data's ``layers``: all of them, or (:func:`reads_target_layer`) all but
    the last, which must then be the target's last layer (``ValueError`` naming it otherwise)."""
    if not module.reads_target_layer():
        return layers
    last = target.num_layers - 1
    if not layers or layers[-1] != last:
        raise ValueError(missing_target_message(
            module.objective, f"the data's feature layers {layers} do not end with the target's last layer ({last})"))
    return layers[:-1]


def data_feature_layers(module, config, target) -> list[int]:
    """The feature layers the data must give this module's drafter (recorded in the hparams, so a checkpoint
    rebuilds the same drafter on the same data): the drafter's, plus the target's last one when
    :func:`reads_target_layer`."""
    layers = list(config.feature_layers)
    return layers + [target.num_layers - 1] if module.reads_target_layer() else layers


def split_target_layer(module, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(the drafter's features, the target's last hidden states [b, T, d] or None)`` of a batch's features."""
    if not module.reads_target_layer():
        return features, None
    d = module.target.hidden_size
    return features[..., :-d], features[..., -d:]


def attach_target(module, out, last: torch.Tensor | None, batch: dict):
    """``out.target_hidden`` = the target's last hidden state at ``a+k-1`` of every block position (p's logits
    through the LM head), when the features carried it (``last``); ``out`` as is otherwise."""
    if last is not None:
        starts = block_starts(batch["anchors"], batch["anchor_mask"], batch["input_ids"].shape[1])
        out.target_hidden = block_target_hidden(last, starts, module.drafter.config.block_size)
    return out
