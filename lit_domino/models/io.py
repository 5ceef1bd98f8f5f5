"""Saving, loading and binding drafters; the common drafter base class.

A drafter directory holds ``config.json`` (``DrafterConfig.to_dict()``) and
``model.safetensors`` (the drafter's own parameters only: the target's
embedding and LM head are never saved). A small-LM drafter also writes its
Hugging Face ``save_pretrained`` copy under ``lm/``. Loading needs no
Lightning: ``load_drafter(dir, target=None)``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from lit_domino.models.config import FEATURE_KINDS, DrafterConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FINGERPRINT_FIELDS = ("hidden_size", "vocab_size", "tokenizer_hash", "mask_token_id")
"""Fingerprint fields ``bind_target`` compares (a drafter trained for one target must not run on another)."""


class DrafterMismatchError(ValueError):
    """A drafter bound to a target it was not built for (fingerprint mismatch)."""


class DrafterLoadError(ValueError):
    """A drafter directory that exists but cannot be read (corrupt config or weights)."""


def check_fingerprint(expected: dict, target) -> None:
    """Raise ``DrafterMismatchError`` naming every mismatching fingerprint field with both values."""
    actual = target.fingerprint()
    bad = [f"{k}: drafter was built for {expected.get(k)!r}, target has {actual.get(k)!r}"
           for k in FINGERPRINT_FIELDS if k in expected and expected.get(k) != actual.get(k)]
    if bad:
        raise DrafterMismatchError(
            f"drafter does not match target {getattr(target, 'name', '?')!r}: " + "; ".join(bad)
        )


class DrafterBase(nn.Module):
    """Common drafter plumbing: config, target binding, saving, sessions.

    The bound target's embedding and LM head live in a plain tuple attribute, so
    they are neither parameters nor ``state_dict`` entries (frozen, never saved).
    """

    kind = "?"

    def __init__(self, config: DrafterConfig):
        super().__init__()
        config.validate()
        if config.kind != self.kind:
            raise ValueError(f"{type(self).__name__} needs a config of kind {self.kind!r}, got {config.kind!r}")
        self.config = config
        self._bound: tuple = ()  # (embed, lm_head, target) once bound

    # ------------------------------------------------------------------ target binding

    def bind_target(self, target) -> "DrafterBase":
        """Check the fingerprint and attach the target's frozen embedding and LM head; returns self."""
        cfg = self.config
        if cfg.target_fingerprint:
            check_fingerprint(cfg.target_fingerprint, target)
        else:
            fp = target.fingerprint()
            if self.kind in FEATURE_KINDS and (fp["hidden_size"] != cfg.hidden_size or fp["vocab_size"] != cfg.vocab_size):
                raise DrafterMismatchError(
                    f"drafter widths (hidden_size={cfg.hidden_size}, vocab_size={cfg.vocab_size}) do not match "
                    f"target {target.name!r} (hidden_size={fp['hidden_size']}, vocab_size={fp['vocab_size']})"
                )
            cfg.target_fingerprint = dict(fp)
        if self.kind in FEATURE_KINDS:
            bad = [j for j in cfg.feature_layers if not 0 <= j < target.num_layers]
            if bad:
                raise DrafterMismatchError(
                    f"feature layers {bad} do not exist in target {target.name!r} ({target.num_layers} layers)"
                )
        self._bound = (target.embed, target.lm_head, target)
        return self

    @property
    def is_bound(self) -> bool:
        return bool(self._bound)

    def _need_bound(self):
        if not self._bound:
            raise RuntimeError(f"{type(self).__name__} is not bound to a target: call drafter.bind_target(target) "
                               "(or load_drafter(dir, target=target)) first")
        return self._bound

    @property
    def embed(self) -> nn.Module:
        """The target's (frozen) input embedding."""
        return self._need_bound()[0]

    @property
    def lm_head(self) -> nn.Module:
        """The target's (frozen) LM head."""
        return self._need_bound()[1]

    @property
    def target(self):
        return self._need_bound()[2]

    def __getstate__(self):  # pickling never drags the target along (re-bind after unpickling)
        state = dict(self.__dict__)
        state["_bound"] = ()
        return state

    def __deepcopy__(self, memo):  # copies (e.g. EMA) share the bound target instead of copying it
        memo[id(self._bound)] = self._bound
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo)
        return new

    # ------------------------------------------------------------------ saving

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (own parameters only) into ``directory``."""
        from safetensors.torch import save_model

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_NAME).write_text(json.dumps(self.config.to_dict(), indent=2, sort_keys=True))
        save_model(self, str(directory / WEIGHTS_NAME), metadata={"kind": self.kind, "format": "lit_domino"})
        return directory

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_session(self):
        raise NotImplementedError


def drafter_class(kind: str) -> type:
    """The drafter class of a config kind."""
    if kind == "backbone":
        from lit_domino.models.backbone import ParallelDrafter as cls
    elif kind == "domino":
        from lit_domino.models.domino import DominoDrafter as cls
    elif kind == "eagle3":
        from lit_domino.models.eagle import Eagle3Drafter as cls
    elif kind == "small_lm":
        from lit_domino.models.small_lm import SmallLMDrafter as cls
    else:
        raise ValueError(f"unknown drafter kind {kind!r}")
    return cls


def build_drafter(config: DrafterConfig, target=None) -> DrafterBase:
    """A freshly initialised drafter of ``config.kind`` (bound when ``target`` is given)."""
    drafter = drafter_class(config.kind)(config)
    if target is not None:
        drafter.bind_target(target)
    return drafter


def load_drafter(directory: str | Path, target=None, map_location: str | torch.device = "cpu") -> DrafterBase:
    """Rebuild a drafter saved with ``save_pretrained`` (no Lightning); bind it when ``target`` is given."""
    from safetensors.torch import load_model

    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"drafter directory {directory} does not exist")
    cfg_path, w_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} is missing: {directory} is not a drafter directory written by "
                                    "drafter.save_pretrained")
    try:
        config = DrafterConfig.from_dict(json.loads(cfg_path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as err:
        raise DrafterLoadError(f"{cfg_path} is not a valid drafter config: {err}") from err
    drafter = drafter_class(config.kind)(config)
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
