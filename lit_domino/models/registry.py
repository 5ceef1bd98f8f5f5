"""The method registry: one drafter class per method, registered by kind (SpecForge's pattern).

A method module defines its config dataclass, its ``nn.Module`` (which owns its decoding
session and its loss) and registers the module class::

    @register("domino")
    class DominoDrafter(ParallelDrafter):
        config_class = DominoConfig
        ...

Kind strings live here and in the config files only; everything else asks the registry
(``drafter_class(kind)``) or the drafter itself (its capability attributes).
"""

from __future__ import annotations

_METHODS: dict[str, type] = {}


def register(kind: str):
    """Class decorator: make ``cls`` the drafter of ``kind`` (and set ``cls.kind`` / its config's kind)."""

    def wrap(cls: type) -> type:
        if kind in _METHODS and _METHODS[kind] is not cls:
            raise ValueError(f"drafter kind {kind!r} is registered twice ({_METHODS[kind].__name__}, {cls.__name__})")
        cls.kind = kind
        _METHODS[kind] = cls
        return cls

    return wrap


def unregister(kind: str) -> None:
    """Forget ``kind``'s drafter (a method registered for a while: a test's)."""
    _METHODS.pop(kind, None)


def kinds() -> tuple[str, ...]:
    """Every registered drafter kind, in registration order."""
    return tuple(_METHODS)


def drafter_class(kind: str) -> type:
    """The drafter class registered for ``kind`` (``ValueError`` naming the known kinds otherwise)."""
    try:
        return _METHODS[kind]
    except KeyError:
        raise ValueError(f"unknown drafter kind {kind!r}; choose one of {', '.join(_METHODS)}") from None


def config_class(kind: str) -> type:
    """The config dataclass of ``kind``'s drafter."""
    return drafter_class(kind).config_class
