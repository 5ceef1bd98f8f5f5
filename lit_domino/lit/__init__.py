"""LightningModules: one shared base and one thin module per drafter variant.

All variants train on the one ``DrafterDataModule`` (``lit_domino.data.datamodule``).
"""

from lit_domino.lit.backbone import BackboneModule
from lit_domino.lit.base import DrafterModule, ExportDrafter, StepOutput, load_module
from lit_domino.lit.domino import DominoModule
from lit_domino.lit.eagle import Eagle3Module
from lit_domino.lit.small_lm import SmallLMModule

VARIANTS = {
    "backbone": BackboneModule,
    "domino": DominoModule,
    "domino_ttt": DominoModule,
    "domino_nocurriculum": DominoModule,
    "eagle3": Eagle3Module,
    "small_lm": SmallLMModule,
}
"""Module class of each variant name (the ``variant`` tag of MLflow runs)."""

__all__ = [
    "DrafterModule", "ExportDrafter", "StepOutput", "load_module",
    "BackboneModule", "DominoModule", "Eagle3Module", "SmallLMModule", "VARIANTS",
]
