"""Drafter models (plain ``nn.Module``s, no Lightning): config, layers, drafters, sessions, I/O."""

from lit_domino.models.backbone import IGNORE_INDEX, BlockOutput, ParallelDrafter
from lit_domino.models.config import KINDS, DrafterConfig
from lit_domino.models.domino import DominoDrafter, DominoHead
from lit_domino.models.eagle import Eagle3Drafter, EagleOutput, eagle_loss
from lit_domino.models.io import (
    DrafterBase,
    DrafterLoadError,
    DrafterMismatchError,
    build_drafter,
    drafter_class,
    load_drafter,
)
from lit_domino.models.sessions import StageDraft
from lit_domino.models.small_lm import LMOutput, SmallLMDrafter

__all__ = [
    "IGNORE_INDEX",
    "KINDS",
    "BlockOutput",
    "DominoDrafter",
    "DominoHead",
    "DrafterBase",
    "DrafterConfig",
    "DrafterLoadError",
    "DrafterMismatchError",
    "Eagle3Drafter",
    "EagleOutput",
    "LMOutput",
    "ParallelDrafter",
    "SmallLMDrafter",
    "StageDraft",
    "build_drafter",
    "drafter_class",
    "eagle_loss",
    "load_drafter",
]
