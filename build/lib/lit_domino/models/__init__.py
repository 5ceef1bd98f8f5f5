"""Drafter models (plain ``nn.Module``s, no Lightning): one module per method, registered by kind.

``base.py`` holds what every drafter shares (config fields from the target, binding, saving),
``registry.py`` the kind → class map, ``sessions.py`` the decoding-session plumbing and the one
draft loop, ``loop.py`` what DLoop's loop-aware training forwards share, ``io.py`` building and
loading. Each method module (``backbone``, ``domino``, ``dspark``, ``dflash2``, ``eagle``, ``small_lm``) owns its config,
its module, its decoding session and its loss. Importing this package registers every method.
"""

from lit_domino.models import registry
from lit_domino.models.base import Drafter, DrafterConfig, DrafterLoadError, DrafterMismatchError
from lit_domino.models.backbone import BackboneConfig, BlockOutput, ParallelDrafter
from lit_domino.models.domino import DominoConfig, DominoDrafter, DominoHead, DominoHeadConfig
from lit_domino.models.dspark import DSparkConfig, DSparkDrafter, DSparkHeadConfig
from lit_domino.models.dflash2 import DFlash2Config, DFlash2Drafter, DFlash2HeadConfig
from lit_domino.models.eagle import Eagle3Config, Eagle3Drafter, EagleOutput
from lit_domino.models.small_lm import LMOutput, SmallLMConfig, SmallLMDrafter
from lit_domino.models.io import build_drafter, drafter_config, load_saved, read_config
from lit_domino.models.registry import drafter_class, kinds
from lit_domino.models.sessions import StageDraft

__all__ = [
    "BackboneConfig", "BlockOutput", "DFlash2Config", "DFlash2Drafter", "DFlash2HeadConfig", "DSparkConfig", "DSparkDrafter", "DSparkHeadConfig", "DominoConfig", "DominoDrafter", "DominoHead", "DominoHeadConfig",
    "Drafter", "DrafterConfig", "DrafterLoadError", "DrafterMismatchError", "Eagle3Config", "Eagle3Drafter",
    "EagleOutput", "LMOutput", "ParallelDrafter", "SmallLMConfig", "SmallLMDrafter", "StageDraft",
    "build_drafter", "drafter_class", "drafter_config", "kinds", "load_saved", "read_config", "registry",
]
