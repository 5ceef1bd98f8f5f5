"""The training configs: YAML deltas under ``experiments/configs/`` composed into one config.

``base.yaml`` holds every key (commented once, where it is defined) at the values of the
``default`` preset; ``<variant>.yaml`` holds its LightningModule and what differs (``extends:``
names a variant it builds on); ``presets/<preset>.yaml`` holds what a preset changes (``extends:`` names a
preset it builds on: ``rehearsal`` is ``paper`` at CPU sizes), with a
``methods:`` section keyed by drafter kind for keys that only one method's module takes
(``methods: {domino: {head: {rank: 32}}}``; a ``data:`` key inside one goes to the data section, for that method's
variants only). :func:`load_config` composes them, in that order, into
the dict the training parser (``lit_domino.training.cli.DrafterCLI``) reads; ``experiments/train.py
fit --variant V --preset P`` composes the very same files.

Overrides (``--set KEY=VALUE``) are dotted keys: ``data.batch_size``, ``model.head.rank`` (short for
``model.init_args.head.rank``) and ``methods.<kind>.<key>`` (the preset's per-method section, for the
variants of that drafter method only). :func:`study_overrides` spreads a study's overrides over its
variants: a method's key reaches the variants whose module takes it, and says which it skipped.

This module imports no torch or Lightning until a variant's module class is needed, so that the
commands check their arguments (:func:`check_arguments`) in well under a second.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import re
from pathlib import Path
from typing import Any, Iterable

import yaml

from lit_domino.target.embedded import RECIPE_SUFFIX, target_names
from lit_domino.runtime.command import CommandParser, UsageError
# What the modules take, read statically, lives apart; the names stay importable from here.
from lit_domino.training.config_keys import (HEAD, TYPE_NAMES, ConfigError, check_flat_head_keys,  # noqa: F401
                                            check_number, close_keys, method_kind, model_keys, model_parameters,
                                            model_sections, module_class, moved_key, static_module,
                                            static_sections, unknown_key)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The YAML configs, package data (``experiments/configs`` links here), so a non-editable install runs too."""
PRESETS = tuple(sorted(p.stem for p in (CONFIG_DIR / "presets").glob("*.yaml")))
"""The presets: one ``presets/<preset>.yaml`` each (the one place presets are found)."""
BASE = "base"
"""``base.yaml``: not a variant, the config every variant extends."""
SECTIONS = ("seed_everything", "model", "data", "trainer", "tracking", "checkpoint", "export")
"""The top-level keys of a training config."""
METHODS = "methods"
"""The presets' per-method section: ``methods.<drafter kind>.<model key>``, not a section of the training config."""
EMBEDDED_PREFIX = "embedded:"


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """``" (did you mean model.lr?)"`` for the closest of ``choices`` to ``word``, else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _read_yaml(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f) or {}


def available_variants(config_dir: Path = CONFIG_DIR) -> list[str]:
    """The variant names: every ``<variant>.yaml`` beside ``base.yaml``."""
    return sorted(p.stem for p in Path(config_dir).glob("*.yaml") if p.stem != BASE)


def check_preset(preset: str, config_dir: Path = CONFIG_DIR) -> None:
    """:class:`ConfigError` unless ``preset`` has a ``presets/<preset>.yaml``."""
    if preset not in PRESETS or not (Path(config_dir) / "presets" / f"{preset}.yaml").is_file():
        raise ConfigError(f"unknown preset {preset!r}{did_you_mean(preset, PRESETS)}; choose one of "
                          f"{', '.join(PRESETS)}")


def check_preset_flag(preset: str) -> None:
    """A command's ``--preset`` → :class:`UsageError` (its one line) unless it names a preset; no torch imported."""
    if preset not in PRESETS:
        raise UsageError(f"--preset: unknown preset {preset!r}{did_you_mean(preset, PRESETS)}; choose one of "
                         f"{', '.join(PRESETS)}")


def check_variant(variant: str, config_dir: Path = CONFIG_DIR) -> None:
    variants = available_variants(config_dir)
    if variant not in variants:
        raise ConfigError(f"unknown variant {variant!r}{did_you_mean(variant, variants)}; choose one of "
                          f"{', '.join(variants)} (files in {config_dir})")


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def check_target_spec(spec: Any, key: str = "data.target") -> None:
    """A target spec must name an embedded target, an existing directory or a plausible hub id
    (``org/name``); checked before anything is built, with the rules of ``lit_domino.target.load.load_target``."""
    if not isinstance(spec, (str, Path)) or not str(spec).strip():
        raise ConfigError(f"{key}: expected a model directory, a hub id or embedded:<name>, got {spec!r}")
    spec = str(spec)
    if spec.startswith(EMBEDDED_PREFIX):
        name = spec[len(EMBEDDED_PREFIX):].removesuffix(RECIPE_SUFFIX)
        if name not in target_names():  # embedded_target is light: checked before any heavy import
            raise ConfigError(f"{key}: unknown embedded target {name!r}"
                              f"{did_you_mean(name, target_names(), EMBEDDED_PREFIX)}; choose one of "
                              + ", ".join(EMBEDDED_PREFIX + n for n in target_names()))
        return
    path = Path(spec).expanduser()
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:  # a local directory
        if not path.is_dir():
            raise ConfigError(f"{key}: target directory {spec!r} does not exist")
        if not (path / "config.json").is_file():
            raise ConfigError(f"{key}: {spec!r} is not a model directory (no config.json)")
        return
    if not _HUB_ID.fullmatch(spec):
        raise ConfigError(f"{key}: {spec!r} is neither embedded:<name>, an existing directory nor a hub id "
                          "(org/name)")


def check_override_keys(overrides: dict) -> None:
    """Every override's section exists (``methods`` included): the cheap part of :func:`check_config`."""
    for key in overrides:
        head = key.split(".", 1)[0]
        if head not in (*SECTIONS, METHODS):
            raise ConfigError(f"{key}: unknown config section {head!r}{did_you_mean(head, (*SECTIONS, METHODS))}; "
                              f"a training config has {', '.join(SECTIONS)} (and the presets' {METHODS}.<method>)")
        if head == METHODS and len(key.split(".")) < 2:
            raise ConfigError(f"{key}: name the method and its key, e.g. {METHODS}.domino.rank=8")


def preset_delta(preset: str, config_dir: Path = CONFIG_DIR) -> dict:
    """What ``presets/<preset>.yaml`` changes over base.yaml: the file merged over the preset it ``extends:``
    (``rehearsal`` extends ``paper``: paper's values, then the rehearsal's), ``methods:`` sections included."""
    chain, name = [], preset
    while name is not None:
        if name in [n for n, _ in chain]:
            raise ConfigError(f"preset {preset!r}: `extends:` loops through {[n for n, _ in chain] + [name]}")
        path = Path(config_dir) / "presets" / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"preset {preset!r} extends {name!r}, which has no {path}")
        data = _read_yaml(path)
        chain.append((name, data))
        name = data.pop("extends", None)
    out: dict = {}
    for _, data in reversed(chain):  # the preset extended first
        out = deep_merge(out, data)
    return out


def preset_value(preset: str, key: str, config_dir: Path = CONFIG_DIR) -> Any:
    """A dotted key's value in base.yaml + the preset (variants aside), without importing any module."""
    cfg = deep_merge(_read_yaml(Path(config_dir) / f"{BASE}.yaml"), preset_delta(preset, config_dir))
    for part in key.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def check_arguments(preset: str, overrides: dict, variants: Iterable[str] = (),
                    config_dir: Path = CONFIG_DIR) -> None:
    """What a command can check from YAML alone, before torch is imported: the preset and variants exist,
    every override names a section, and the target (``--set data.target`` or the preset's) is plausible."""
    check_preset(preset, config_dir)
    for variant in variants:
        check_variant(variant, config_dir)
    check_override_keys(overrides)
    target = overrides.get("data.target", preset_value(preset, "data.target", config_dir))
    if "data" in overrides and isinstance(overrides["data"], dict):
        target = overrides["data"].get("target", target)
    check_target_spec(target)


def variant_arguments(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``experiments/train.py``'s ``--variant/--preset/--seed/--set`` and the rest of ``argv`` (LightningCLI's)."""
    pre = CommandParser(prog="train", add_help=False)
    pre.add_argument("--variant")
    pre.add_argument("--preset", default="default")
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--set", type=parse_override, action="append", default=[])
    return pre.parse_known_args(argv)


def check_train_arguments(argv: list[str]) -> None:
    """``experiments/train.py``'s cheap checks (:func:`check_arguments`), before torch is imported."""
    known, _ = variant_arguments(argv)
    if known.variant is not None:
        check_arguments(known.preset, dict(known.set), [known.variant])
        check_model_overrides(known.variant, known.preset, dict(known.set))  # model keys and numbers: no Lightning


def deep_merge(base: dict, update: dict) -> dict:
    """``update`` into a copy of ``base``; nested dicts merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _model_path(key: str) -> list[str]:
    """``"model.rank"`` → ``["model", "init_args", "rank"]`` (``model.init_args.rank`` and ``model.class_path`` as given)."""
    parts = key.split(".")
    if parts[0] == "model" and len(parts) >= 2 and parts[1] not in ("init_args", "class_path"):
        parts = ["model", "init_args", *parts[1:]]
    return parts


def set_dotted(cfg: dict, key: str, value: Any) -> None:
    """``"model.rank"`` or ``"model.init_args.rank"`` → ``cfg["model"]["init_args"]["rank"]``."""
    parts = _model_path(key)
    node = cfg
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
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


def show(key: str, value: Any) -> str:
    """``key=value`` as the user would type it (``model.rank=8``)."""
    try:
        text = json.dumps(value)
    except TypeError:
        text = repr(value)
    return f"{key}={text}"


def method_feature_rule(module_cls: type) -> str:
    """The feature rule of the drafter method a LightningModule trains (its config's ``feature_rule``; a
    method that reads no target features, the small LM, gets the default ``dflash``: nothing reads them)."""
    drafter = getattr(module_cls, "drafter_class", None)
    return getattr(getattr(drafter, "config_class", None), "feature_rule", None) or "dflash"


def resolve_feature_rule(data: dict, module_cls: type, objective: Any = None) -> dict:
    """``data`` with ``feature_rule`` set from the drafter's method: the one source of the rule (the
    DataModule caches those layers, the drafter is built on them). A config that names another rule is refused.
    A DFlash-rule method whose ``objective`` needs the target's distribution reads the ``dspark`` features
    (DFlash's layers, then the target's last: p); the module hands its drafter the DFlash layers."""
    rule = method_feature_rule(module_cls)
    if rule == "dflash" and objective is not None and getattr(module_cls, "supports_objective", False):
        from lit_domino.models.objectives import TARGET_RULE, build_objective  # torch: the module is imported
        try:
            rule = TARGET_RULE if build_objective(objective).needs_target else rule
        except ValueError:
            pass  # the module refuses the objective itself, in one line
    given = data.get("feature_rule")
    if given is not None and given != rule:
        raise ConfigError(f"data.feature_rule: the {module_cls.__name__} drafter reads the {rule!r} features (its "
                          f"method's feature_rule), not {given!r}; drop the key (it comes from the method)")
    return {**data, "feature_rule": rule}


def check_model_overrides(variant: str, preset: str, overrides: dict) -> None:
    """One variant's ``model.<key>`` and ``methods.<kind>.<key>`` overrides, as the training parser would refuse
    them (an unknown key with its close matches, text for a number), from the module's source: no Lightning."""
    methods, rest = _split_methods(overrides)
    cfg = compose(variant, preset, methods=methods)  # compose checks the methods keys
    keys, sections = model_keys(cfg), model_sections(cfg)
    for key, value in rest.items():
        path = _model_path(key)
        if path[:2] == ["model", "init_args"] and len(path) == 3:
            if path[2] not in keys:
                raise unknown_key("model", path[2], keys, sections)
            check_number(key, value, keys[path[2]])
        elif path[:2] == ["model", "init_args"] and len(path) == 4 and path[2] in sections:
            if path[3] not in sections[path[2]]:  # model.head.rnak
                raise unknown_key(f"model.{path[2]}", path[3], sections[path[2]])


def _variant_chain(variant: str, config_dir: Path) -> list[dict]:
    """The variant's YAML and every one it ``extends:``, base first (cycles are an error)."""
    chain, seen, name = [], [], variant
    while name is not None:
        if name in seen:
            raise ConfigError(f"variant {variant!r}: `extends:` loops through {seen + [name]}")
        seen.append(name)
        path = config_dir / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"variant {seen[0]!r} extends {name!r}, which has no {path}")
        data = _read_yaml(path)
        name = data.pop("extends", None)
        chain.insert(0, data)
    return chain


def _split_methods(overrides: dict | None) -> tuple[dict, dict]:
    """``overrides`` → (the ``methods.<kind>...`` ones, keyed without ``methods.``; the rest)."""
    methods, rest = {}, {}
    for key, value in (overrides or {}).items():
        if key.split(".", 1)[0] == METHODS:
            methods[key.split(".", 1)[1] if "." in key else ""] = value
        else:
            rest[key] = value
    return methods, rest


def compose(variant: str, preset: str = "default", config_dir: Path = CONFIG_DIR,
            methods: dict | None = None) -> dict:
    """base.yaml + the variant's ``extends:`` chain + the variant + the preset (its ``methods:`` section,
    with the ``methods`` overrides ``{"domino.rank": 8}`` applied, merged into the model of the variant's
    drafter method). A ``methods`` override of another method is an error: it would change nothing."""
    config_dir = Path(config_dir)
    check_variant(variant, config_dir)
    check_preset(preset, config_dir)
    cfg = _read_yaml(config_dir / f"{BASE}.yaml")
    for layer in _variant_chain(variant, config_dir):
        cfg = deep_merge(cfg, layer)
    preset_cfg = preset_delta(preset, config_dir)
    section = preset_cfg.pop(METHODS, None) or {}
    cfg = deep_merge(cfg, preset_cfg)
    kind = method_kind(cfg)
    for key, value in (methods or {}).items():
        if key.split(".", 1)[0] != kind:
            raise ConfigError(f"{show(METHODS + '.' + key, value)}: variant {variant} is a {kind} drafter; "
                              f"{METHODS}.{key.split('.', 1)[0]} reaches only that method's variants")
        *path, last = key.split(".")
        if path:  # domino.rank or domino.curriculum.kind: the model key is the one after the method
            names = [(path + [last])[1]]
        else:  # domino={head: {rank: 8}}
            names = list(value) if isinstance(value, dict) else []
        keys, sections = model_keys(cfg), model_sections(cfg)
        for name in names:
            if name not in keys and name != "data":  # data: the method's own data keys (below)
                if moved_key(name, sections):
                    raise unknown_key(f"{METHODS}.{kind}", name, keys, sections)
                close = close_keys(name, keys, sections, n=1)
                raise ConfigError(f"{METHODS}.{kind}.{name}: variant {variant} ({kind}) has no model key {name!r}"
                                  + (f" (did you mean {METHODS}.{kind}.{close[0]}?)" if close else ""))
        inner = (path + [last])[1:3]
        if len(inner) == 2 and inner[0] in sections and inner[1] not in sections[inner[0]]:  # domino.head.rnak
            raise unknown_key(f"{METHODS}.{kind}.{inner[0]}", inner[1], sections[inner[0]])
        node = section
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {METHODS}.{key}: {part!r} is not a section")
        # a mapping merges into the preset's (methods.domino={head: {rank: 8}} keeps its gru_hidden)
        node[last] = deep_merge(node[last], value) if isinstance(value, dict) and isinstance(node.get(last), dict) \
            else value
    if section.get(kind):
        if not isinstance(section[kind], dict):
            raise ConfigError(f"{METHODS}.{kind}: expected a mapping of model keys, got {section[kind]!r}")
        method = dict(section[kind])
        sections = model_sections(cfg)
        for name in method:  # a preset written before the head section (methods: {domino: {rank: 8}})
            if moved_key(name, sections) and name not in model_keys(cfg):
                raise unknown_key(f"{METHODS}.{kind}", name, (), sections)
        data = method.pop("data", None)  # a method's own data keys (DSpark's block size on the paper preset)
        cfg = deep_merge(cfg, {"model": {"init_args": method}, **({"data": data} if data else {})})
    return cfg


def load_config(variant: str, preset: str = "default", seed: int = 0, overrides: dict | None = None,
                config_dir: Path = CONFIG_DIR) -> dict:
    """The composed config of ``variant`` under ``preset`` with ``seed`` and dotted ``overrides``
    (``{"data.batch_size": 8, "model.head.rank": 32, "methods.domino.head.gru_hidden": 32}``), tagged with the
    variant and preset."""
    methods, rest = _split_methods(overrides)
    cfg = compose(variant, preset, config_dir, methods)
    cfg["seed_everything"] = int(seed)
    for key, value in rest.items():
        set_dotted(cfg, key, value)
    cfg.setdefault("tracking", {})["variant"] = variant
    cfg["tracking"]["preset"] = preset
    return cfg


def _names(variants: Iterable[str]) -> str:
    return ", ".join(variants) or "none"


def study_overrides(variants: list[str], preset: str, overrides: dict | None,
                    config_dir: Path = CONFIG_DIR) -> tuple[dict[str, dict], list[str]]:
    """A study's ``--set`` overrides spread over its ``variants``: ``({variant: its overrides}, notes)``.

    A key of another section (``data.``, ``trainer.``, ...) goes to every variant. A model key
    (``model.lr``, ``model.head.rank``) goes to the variants whose module takes it (whose head has that field),
    ``methods.<kind>.<key>`` to the variants of that drafter method; each such key that skips some variants gets
    a note naming both sides. A key that
    reaches none of them is a :class:`ConfigError` with the close matches and the variants that take them.
    """
    config_dir = Path(config_dir)
    check_override_keys(overrides or {})
    every = available_variants(config_dir)
    info = {}  # variant -> (kind, model keys): every variant's, for the hints
    for v in every:
        cfg = compose(v, preset, config_dir)
        sections = model_sections(cfg)
        info[v] = (method_kind(cfg), model_keys(cfg),  # the dotted section fields too (head.rank)
                   {f"{name}.{f}" for name, fields in sections.items() for f in fields}, sections)
    kinds = sorted({kind for kind, *_ in info.values()})
    per_variant: dict[str, dict] = {v: {} for v in variants}
    notes = []
    for key, value in (overrides or {}).items():
        parts = key.split(".")
        if parts[0] == METHODS:
            kind = parts[1]
            if kind not in kinds:
                raise ConfigError(f"{key}: unknown method {kind!r}{did_you_mean(kind, kinds)}; "
                                  f"{METHODS} has {', '.join(kinds)}")
            if len(parts) > 2:
                names = [parts[2]]
            elif isinstance(value, dict):
                names = list(value)
            else:
                raise ConfigError(f"{key}: expected a mapping of {kind}'s model keys, got {value!r}")
            keys, fields, sections = next((k, f, sc) for kind_, k, f, sc in info.values() if kind_ == kind)
            for name in names:
                if name not in keys and moved_key(name, sections):
                    raise unknown_key(f"{METHODS}.{kind}", name, keys, sections)
                if name not in keys:
                    takers = [v for v, (kd, *_) in info.items() if kd == kind]
                    close = close_keys(name, keys, sections, n=1)
                    hint = f" (did you mean {METHODS}.{kind}.{close[0]}?)" if close else ""
                    raise ConfigError(f"{METHODS}.{kind}.{name}: the {kind} method ({_names(takers)}) has no model "
                                      f"key {name!r}{hint}")
            takes = [v for v in variants if info[v][0] == kind]
            why = "other methods"
        elif parts[0] == "model" and _model_path(key)[1] == "init_args" and len(_model_path(key)) > 2:
            path = _model_path(key)
            nested = len(path) > 3 and any(path[2] in info[v][3] for v in every)
            name = ".".join(path[2:4]) if nested else path[2]  # head.rank: the variants whose head has it
            known = {v: set(info[v][1]) | info[v][2] for v in every}
            takes = [v for v in variants if name in known[v]]
            if not takes:
                for v in [*variants, *every]:
                    if name not in info[v][1] and moved_key(name, info[v][3]):  # model.rank: now model.head.rank
                        raise unknown_key("model", name, (), info[v][3])
                owners = {}
                for v in [*variants, *(x for x in every if x not in variants)]:  # this run's variants first
                    for match in close_keys(name, known[v], info[v][3], n=1):
                        owners.setdefault(match, []).append(v)
                hint = "; ".join(f"did you mean model.{m} ({_names(vs)})?" for m, vs in owners.items())
                raise ConfigError(f"{key}: no variant of this run takes it ({_names(variants)})"
                                  + (f"; {hint}" if hint else ""))
            why = "no such key"
        else:
            takes = list(variants)
            why = ""
        if not takes:  # a methods key of a method not in this run
            raise ConfigError(f"{show(key, value)}: reaches none of this run's variants "
                              f"({', '.join(f'{v} is a {info[v][0]} drafter' for v in variants)})")
        skipped = [v for v in variants if v not in takes]
        if skipped:
            notes.append(f"{show(key, value)}: applied to {_names(takes)}; not to {_names(skipped)} ({why})")
        for v in takes:
            name = (parts[2] if len(parts) == 3 else None) if parts[0] == METHODS else \
                (_model_path(key)[2] if parts[0] == "model" and len(_model_path(key)) == 3 else None)
            if name is not None:  # model.lr, methods.eagle3.ttt_steps: a number's type, before the parser
                try:
                    check_number(key, value, info[v][1].get(name))
                except ConfigError as err:
                    raise ConfigError(f"variant {v}: {err}") from None
            per_variant[v][key] = value
    return per_variant, notes
