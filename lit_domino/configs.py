"""The training configs: YAML deltas under ``experiments/configs/`` composed into one config.

``base.yaml`` holds every key (commented once, where it is defined) at the values of the
``default`` preset; ``<variant>.yaml`` holds its LightningModule and what differs (``extends:``
names a variant it builds on); ``presets/<preset>.yaml`` holds what a preset changes, with a
``methods:`` section keyed by drafter kind for keys that only one method's module takes
(``methods: {domino: {rank: 32}}``; a ``data:`` key inside one goes to the data section, for that method's
variants only). :func:`load_config` composes them, in that order, into
the dict the training parser (``lit_domino.cli.DrafterCLI``) reads; ``experiments/train.py
fit --variant V --preset P`` composes the very same files.
"""

from __future__ import annotations

import argparse
import copy
import importlib
from pathlib import Path
from typing import Any

import yaml

from lit_domino.paths import project_root

CONFIG_DIR = project_root() / "experiments" / "configs"
PRESETS = ("smoke", "default", "paper")
BASE = "base"
"""``base.yaml``: not a variant, the config every variant extends."""


def _read_yaml(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f) or {}


def available_variants(config_dir: Path = CONFIG_DIR) -> list[str]:
    """The variant names: every ``<variant>.yaml`` beside ``base.yaml``."""
    return sorted(p.stem for p in Path(config_dir).glob("*.yaml") if p.stem != BASE)


def deep_merge(base: dict, update: dict) -> dict:
    """``update`` into a copy of ``base``; nested dicts merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def set_dotted(cfg: dict, key: str, value: Any) -> None:
    """``"model.rank"`` or ``"model.init_args.rank"`` → ``cfg["model"]["init_args"]["rank"]``."""
    parts = key.split(".")
    if parts[0] == "model" and len(parts) >= 2 and parts[1] != "init_args":
        parts = ["model", "init_args", *parts[1:]]
    node = cfg
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {key!r}: {part!r} is not a section")
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``"data.batch_size=8"`` → ``("data.batch_size", 8)``: the argparse type of ``--set KEY=VALUE`` (VALUE in YAML)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--set takes KEY=VALUE (e.g. data.batch_size=8), got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise argparse.ArgumentTypeError(f"--set {key}: value is not valid YAML: {err}") from None


def module_class(cfg: dict) -> type:
    """The LightningModule class a composed config names (``model.class_path``)."""
    path = (cfg.get("model") or {}).get("class_path")
    if not path:
        raise ValueError("the config names no model.class_path (a variant file sets it)")
    module, _, name = str(path).rpartition(".")
    return getattr(importlib.import_module(module), name)


def _variant_chain(variant: str, config_dir: Path) -> list[dict]:
    """The variant's YAML and every one it ``extends:``, base first (cycles are an error)."""
    chain, seen, name = [], [], variant
    while name is not None:
        if name in seen:
            raise ValueError(f"variant {variant!r}: `extends:` loops through {seen + [name]}")
        seen.append(name)
        path = config_dir / f"{name}.yaml"
        if not path.is_file():
            raise ValueError(f"variant {seen[0]!r} extends {name!r}, which has no {path}")
        data = _read_yaml(path)
        name = data.pop("extends", None)
        chain.insert(0, data)
    return chain


def compose(variant: str, preset: str = "default", config_dir: Path = CONFIG_DIR) -> dict:
    """base.yaml + the variant's ``extends:`` chain + the variant + the preset (its ``methods:`` section
    applied to the model of the variant's drafter method)."""
    config_dir = Path(config_dir)
    variants = available_variants(config_dir)
    if variant not in variants:
        raise ValueError(f"unknown variant {variant!r}; choose one of {variants} (files in {config_dir})")
    if preset not in PRESETS or not (config_dir / "presets" / f"{preset}.yaml").is_file():
        raise ValueError(f"unknown preset {preset!r}; choose one of {list(PRESETS)}")
    cfg = _read_yaml(config_dir / f"{BASE}.yaml")
    for layer in _variant_chain(variant, config_dir):
        cfg = deep_merge(cfg, layer)
    preset_cfg = _read_yaml(config_dir / "presets" / f"{preset}.yaml")
    methods = preset_cfg.pop("methods", None) or {}
    cfg = deep_merge(cfg, preset_cfg)
    kind = module_class(cfg).drafter_class.kind
    if methods.get(kind):
        method = dict(methods[kind])
        data = method.pop("data", None)  # a method's own data keys (DSpark's block size on the paper preset)
        cfg = deep_merge(cfg, {"model": {"init_args": method}, **({"data": data} if data else {})})
    return cfg


def load_config(variant: str, preset: str = "default", seed: int = 0, overrides: dict | None = None,
                config_dir: Path = CONFIG_DIR) -> dict:
    """The composed config of ``variant`` under ``preset`` with ``seed`` and dotted ``overrides``
    (``{"data.batch_size": 8, "model.rank": 32}``), tagged with the variant and preset."""
    cfg = compose(variant, preset, config_dir)
    cfg["seed_everything"] = int(seed)
    for key, value in (overrides or {}).items():
        set_dotted(cfg, key, value)
    cfg.setdefault("tracking", {})["variant"] = variant
    cfg["tracking"]["preset"] = preset
    return cfg
