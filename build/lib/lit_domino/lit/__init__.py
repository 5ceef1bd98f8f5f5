"""LightningModules: one shared base and one thin module per drafter method.

All variants train on the one ``DrafterDataModule`` (``lit_domino.training.datamodule``);
each module names its drafter class and calls the method's own forward and loss.
"""

from lit_domino.lit.backbone import BackboneModule
from lit_domino.lit.base import DrafterModule, ExportDrafter, StepOutput, load_module
from lit_domino.lit.domino import DominoModule
from lit_domino.lit.dflash2 import DFlash2Module
from lit_domino.lit.dspark import DSparkModule
from lit_domino.lit.eagle import Eagle3Module
from lit_domino.lit.small_lm import SmallLMModule

__all__ = [
    "DrafterModule", "ExportDrafter", "StepOutput", "load_module",
    "BackboneModule", "DFlash2Module", "DSparkModule", "DominoModule", "Eagle3Module", "SmallLMModule",
]
