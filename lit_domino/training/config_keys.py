"""What the drafter modules take as ``model.init_args``, read from their source where it can be (no torch or
Lightning import), and the one-line errors for keys and values they would refuse (:mod:`lit_domino.training.configs`
checks a study's overrides with them; the training parser names its unknown keys with them)."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import inspect
from pathlib import Path
from typing import Any, Iterable

from lit_domino.runtime.command import UsageError


class ConfigError(UsageError):
    """A config the training parser refuses (an unknown or mistyped key, a bad value), or an override that
    reaches no variant: one line on the command line."""


def module_class(cfg: dict) -> type:
    """The LightningModule class a composed config names (``model.class_path``)."""
    path = (cfg.get("model") or {}).get("class_path")
    if not path:
        raise ConfigError("the config names no model.class_path (a variant file sets it)")
    module, _, name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"model.class_path: cannot import {path!r}: {err}") from None


def model_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The ``model.init_args`` a drafter module takes: the parameters of its and its drafter-module bases'
    ``__init__`` (the classes that name a ``drafter_class``; ``*args``/``**kwargs`` aside)."""
    out: dict[str, inspect.Parameter] = {}
    for c in reversed(cls.__mro__):
        if "__init__" in c.__dict__ and hasattr(c, "drafter_class"):
            out.update({n: p for n, p in inspect.signature(c.__init__).parameters.items()
                        if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)})
    return out


def method_kind(cfg: dict) -> str:
    """The drafter method (kind) of a composed config's module: the key of its preset ``methods:`` section."""
    static = static_module((cfg.get("model") or {}).get("class_path"))
    return static[0] if static else module_class(cfg).drafter_class.kind


def model_keys(cfg: dict) -> dict[str, str | None]:
    """The ``model.init_args`` of a composed config's module → their annotations' source text (None: none
    known), read statically when :func:`static_module` can (no torch or Lightning import), else imported."""
    static = static_module((cfg.get("model") or {}).get("class_path"))
    if static:
        return static[1]
    return {n: p.annotation if isinstance(p.annotation, str) else None
            for n, p in model_parameters(module_class(cfg)).items()}


# --------------------------------------------------------------------------- the modules' keys, statically
# Reading the variants' LightningModule signatures from their source spares a command the Lightning import
# (seconds) before it answers a mistyped --set key. tests/training/test_configs.py checks this against the imports.


@functools.lru_cache(maxsize=None)
def _module_tree(module: str) -> ast.Module | None:
    """The parsed source of a ``lit_domino`` module (None: another package's, or not a file here)."""
    head, *rest = module.split(".")
    if head != __name__.split(".")[0]:
        return None
    base = Path(__file__).resolve().parents[1].joinpath(*rest)  # the lit_domino package
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return ast.parse(path.read_text(), str(path))
    return None


def _find_class(module: str, name: str, hops: int = 0) -> tuple[str, ast.ClassDef] | None:
    """The class ``name`` of ``module`` (followed through ``from x import name`` re-exports)."""
    tree = _module_tree(module) if hops < 8 else None
    for node in tree.body if tree else ():
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _find_class(node.module, alias.name, hops + 1)
    return None


def _drafter_kind(module: str, cls: ast.ClassDef) -> str | None | bool:
    """The kind of the class-body ``drafter_class = X`` (X's ``@register("kind")``); False: no such line."""
    for node in cls.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "drafter_class" for t in targets):
                found = _find_class(module, node.value.id) if isinstance(node.value, ast.Name) else None
                for deco in found[1].decorator_list if found else ():
                    if (isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "register" and deco.args
                            and isinstance(deco.args[0], ast.Constant)):
                        return deco.args[0].value
                return None
    return False


@functools.lru_cache(maxsize=None)
def static_module(class_path: str | None) -> tuple[str, dict[str, str | None]] | None:
    """``(kind, {init arg: annotation source})`` of a ``lit_domino`` LightningModule class, read from the source
    as :func:`model_parameters` and :func:`method_kind` see it; None when it cannot be (a base outside a plain
    chain of our classes, a computed ``drafter_class``): the caller imports the class instead."""
    module, _, name = str(class_path or "").rpartition(".")
    found, chain = _find_class(module, name) if module else None, []
    while found:  # the class, then its bases within lit_domino (single inheritance only)
        chain.append(found)
        ours = [b for b in found[1].bases if isinstance(b, ast.Name) and _find_class(found[0], b.id)]
        if len(ours) > 1 or (ours and len(found[1].bases) > 1):
            return None
        found = _find_class(found[0], ours[0].id) if ours else None
    kinds = [k for k in (_drafter_kind(m, c) for m, c in chain) if k is not False]
    if not kinds or not isinstance(kinds[0], str):
        return None
    keys: dict[str, str | None] = {}
    for mod, cls in reversed(chain):  # base first, as model_parameters merges them
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is not None:
            for arg in [*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs]:
                if arg.arg != "self":
                    keys[arg.arg] = ast.unparse(arg.annotation) if arg.annotation is not None else None
    return kinds[0], keys


def _dataclass_fields(cls: ast.ClassDef) -> list[str] | None:
    """The fields of a ``@dataclass`` class body (its annotated names, ``ClassVar`` aside); None: not a dataclass."""
    names = [getattr(d.func if isinstance(d, ast.Call) else d, "id", None) for d in cls.decorator_list]
    if "dataclass" not in names:
        return None
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            and "ClassVar" not in ast.unparse(n.annotation)]


@functools.lru_cache(maxsize=None)
def static_sections(class_path: str | None) -> dict[str, list[str]] | None:
    """``{init arg: its dataclass's fields}`` for the ``model.init_args`` typed by a dataclass (``head``,
    ``curriculum``), read from the source as :func:`static_module` reads the keys; None when it cannot be."""
    module, _, name = str(class_path or "").rpartition(".")
    found = _find_class(module, name) if module and static_module(class_path) else None
    out: dict[str, list[str]] = {}
    while found:
        mod, cls = found
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        for arg in [*init.args.args, *init.args.kwonlyargs] if init is not None else ():
            if isinstance(arg.annotation, ast.Name) and arg.arg not in out:
                typed = _find_class(mod, arg.annotation.id)
                fields = _dataclass_fields(typed[1]) if typed else None
                if fields is not None:
                    out[arg.arg] = fields
        ours = [b for b in cls.bases if isinstance(b, ast.Name) and _find_class(mod, b.id)]
        found = _find_class(mod, ours[0].id) if ours else None
    return out


def model_sections(cfg: dict) -> dict[str, list[str]]:
    """The ``model.init_args`` of a composed config's module that are dataclass sections → their fields
    (``{"head": ["rank", "gru_hidden"], "curriculum": [...]}``), statically where it can be, else imported."""
    static = static_sections((cfg.get("model") or {}).get("class_path"))
    if static is not None:
        return static
    return {n: [f.name for f in dataclasses.fields(p.default)] for n, p in model_parameters(module_class(cfg)).items()
            if dataclasses.is_dataclass(p.default)}


HEAD = "head"
"""The method's head section (``model.head.rank``): its fields were flat model keys (``model.rank``) before."""


def moved_key(key: str, sections: dict[str, list[str]]) -> str | None:
    """The head section a former flat model key moved into (``rank`` → ``head``), else None."""
    return HEAD if key in sections.get(HEAD, ()) else None


def check_flat_head_keys(cfg: dict) -> None:
    """A config (a user's YAML) whose ``model.init_args`` spell a head field flat (``rank: 8``) →
    ``model.rank moved to model.head.rank``, read from the module's source, before the parser's usage dump."""
    model = cfg.get("model") if isinstance(cfg, dict) else None
    init = model.get("init_args") if isinstance(model, dict) else None
    if not isinstance(init, dict) or not model.get("class_path"):
        return
    sections, keys = model_sections(cfg), model_keys(cfg)
    for key in init:
        if key not in keys and moved_key(key, sections):
            raise unknown_key("model", key, keys, sections)


TYPE_NAMES = {"float": "a float", "int": "an integer", "bool": "true or false", "str": "a string",
              "NoneType": "null", "None": "null", "list": "a list", "tuple": "a list", "dict": "a mapping"}
"""How a type error names the type a key takes (``model.lr: expected a float, got 'abc'``)."""


def close_keys(key: str, known: Iterable[str], sections: dict | None = None, n: int = 3) -> list[str]:
    """The keys closest to ``key``; a section's field matches by its own name and shows dotted (``rnak`` ->
    ``head.rank``)."""
    shown = {k: k for k in known}
    shown.update({f: f"{name}.{f}" for name, fields in (sections or {}).items() for f in fields if f not in shown})
    return [shown[c] for c in difflib.get_close_matches(key, list(shown), n=n)]


def unknown_key(section: str, key: str, known: Iterable[str], sections: dict | None = None) -> ConfigError:
    """``unknown config key model.rnak; did you mean model.head.rank?`` (else the keys ``section`` takes); a
    former flat key of a section (``sections``: :func:`model_sections`) says where it went: ``model.rank moved
    to model.head.rank``."""
    moved = moved_key(key, sections or {})
    if moved:
        return ConfigError(f"{section}.{key} moved to {section}.{moved}.{key} (the method's {moved} section)")
    known = list(known)
    close = close_keys(key, known, sections)
    hint = (f"; did you mean {', '.join(f'{section}.{c}' for c in close)}?" if close
            else f"; {section} takes {', '.join(sorted(known))}" if known else "")
    return ConfigError(f"unknown config key {section}.{key}{hint}")


def check_number(key: str, value: Any, annotation: str | None) -> None:
    """The training parser's type check where it is plain: a text given for a number (``model.lr=abc``) is a
    :class:`ConfigError` naming the type; anything else is left to the parser."""
    types = [t.strip() for t in (annotation or "").split("|")]
    numbers = [t for t in types if t in ("int", "float")]
    if not isinstance(value, str) or not numbers or not set(types) <= {"int", "float", "None"}:
        return
    if "None" in types and value.strip().lower() in ("none", "null"):  # the parser's spellings of null
        return
    for cast in (int, float):
        if cast.__name__ in numbers:
            try:
                cast(value)
                return
            except ValueError:
                pass
    raise ConfigError(f"{key}: expected {' or '.join(TYPE_NAMES[t] for t in types)}, got {value!r}")
