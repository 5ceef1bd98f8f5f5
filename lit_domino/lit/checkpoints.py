"""What a drafter module's checkpoint holds beyond Lightning's (the RNG states, under :data:`EXTRA_KEY` with the
drafter config and the target's fingerprint), and the module rebuilt from a checkpoint (its class read from it)."""

from __future__ import annotations

import importlib
import logging
import random
from pathlib import Path

import lightning as L
import numpy as np
import torch

log = logging.getLogger(__name__)

EXTRA_KEY = "lit_domino"


def load_module(checkpoint_path: str | Path, map_location: str | torch.device = "cpu",
                **overrides) -> L.LightningModule:
    """Rebuild the variant's module (a :class:`~lit_domino.lit.base.DrafterModule`) from a Lightning checkpoint (its
    class from the checkpoint itself).

    The target is loaded from the recorded spec (``hparams.target``) unless ``target=`` is given.
    """
    path = Path(checkpoint_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    hparams = ckpt.get("hyper_parameters", {})
    class_path = hparams.get("_class_path") or (ckpt.get(EXTRA_KEY) or {}).get("module")
    del ckpt
    if not class_path:
        raise ValueError(f"{path} is not a lit_domino training checkpoint (no module class recorded)")
    module_name, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), name)
    return cls.load_from_checkpoint(path, map_location=map_location, **overrides)


def rng_states() -> dict:
    """torch / CUDA / numpy / python RNG states as plain types (checkpoints stay ``weights_only``-loadable)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [str(kind), torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss),
                  float(cached)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        states["torch.cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    try:
        torch.set_rng_state(states["torch"])
        kind, keys, pos, has_gauss, cached = states["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        version, internal, gauss = states["python"]
        random.setstate((version, tuple(internal), gauss))
        if "torch.cuda" in states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["torch.cuda"])
    except Exception as err:  # a checkpoint from another platform or version: resume anyway
        log.warning("could not restore RNG states from the checkpoint: %s", err)
