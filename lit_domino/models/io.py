"""Building, saving and loading drafters of any registered method.

A drafter directory holds ``config.json`` (``config.to_dict()``, naming the kind) and
``model.safetensors`` (the drafter's own parameters only: the target's embedding and
LM head are never saved). A small-LM drafter also writes its Hugging Face
``save_pretrained`` copy under ``lm/``. Loading needs no Lightning:
``load_drafter(dir, target=None)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_model

from lit_domino.models import registry
from lit_domino.models.base import CONFIG_NAME, WEIGHTS_NAME, Drafter, DrafterConfig, DrafterLoadError


def drafter_config(kind: str, target, **overrides) -> DrafterConfig:
    """The config of a ``kind`` drafter for ``target`` (``<Method>Config.from_target``; nested sections as dicts)."""
    return registry.config_class(kind).from_target(target, **overrides)


def build_drafter(config: DrafterConfig, target=None) -> Drafter:
    """A freshly initialised drafter of ``config``'s method (bound when ``target`` is given)."""
    drafter = registry.drafter_class(config.kind)(config)
    if target is not None:
        drafter.bind_target(target)
    return drafter


def read_config(directory: str | Path) -> DrafterConfig:
    """The config of a drafter directory, with clear errors for a missing or corrupt one."""
    path = Path(directory).expanduser() / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {path.parent} is not a drafter directory written by "
                                "drafter.save_pretrained")
    try:
        return DrafterConfig.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as err:
        raise DrafterLoadError(f"{path} is not a valid drafter config: {err}") from err


def load_drafter(directory: str | Path, target=None, map_location: str | torch.device = "cpu") -> Drafter:
    """Rebuild a drafter saved with ``save_pretrained`` (no Lightning); bind it when ``target`` is given."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"drafter directory {directory} does not exist")
    w_path = directory / WEIGHTS_NAME
    for p in (directory / CONFIG_NAME, w_path):  # both files present before either is read
        if not p.is_file():
            raise FileNotFoundError(f"{p} is missing: {directory} is not a drafter directory written by "
                                    "drafter.save_pretrained")
    config = read_config(directory)
    drafter = build_drafter(config)
    try:
        missing, unexpected = load_model(drafter, str(w_path), strict=False, device=str(map_location))
    except Exception as err:  # safetensors raises its own error types for corrupt files
        raise DrafterLoadError(f"{w_path} is corrupt or unreadable: {type(err).__name__}: {err}") from err
    if missing or unexpected:
        raise DrafterLoadError(f"{w_path} does not match a {config.kind!r} drafter: missing {sorted(missing)}, "
                               f"unexpected {sorted(unexpected)}")
    drafter.eval()
    if target is not None:
        drafter.bind_target(target)
    return drafter
