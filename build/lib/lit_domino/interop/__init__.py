"""Drafters to and from the field's formats (one module per format).

* ``dflash`` (:mod:`.dflash`): z-lab's DFlash layout, for the backbone;
* ``specforge-domino`` (:mod:`.specforge_domino`): the DFlash layout with SpecForge's Domino projector;
* ``eagle3`` (:mod:`.eagle3`): the EAGLE-3 layout vLLM loads through ``speculators``;
* ``dspark`` (:mod:`.dspark`): speculators' DSpark layout (``DSparkDraftModel``), for DSpark;
* ``dflash2`` (:mod:`.dflash2`): speculators' DFlash 2 layout (``DFlash2DraftModel``), for DFlash 2.

``export_drafter(drafter, dir, format=...)`` writes one; :func:`load_drafter` (``lit_domino.load_drafter``) reads any of them
(and hub ids, :func:`resolve_drafter_source`), detected from ``config.json``. A drafter kind that a format
cannot express, or a foreign config this suite cannot run exactly, is refused naming the reason / field.
"""

from __future__ import annotations

import importlib
from pathlib import Path

# The format modules import torch; they load on first use, so that a command can check a format against a
# drafter kind (FORMAT_KINDS) before torch is imported. FORMATS and the errors below are resolved lazily.
FORMAT_KINDS = {"dflash": ("backbone",), "specforge-domino": ("domino",), "eagle3": ("eagle3",), "dspark": ("dspark",),
                "dflash2": ("dflash2",)}
"""Format name → the drafter kinds it expresses exactly (each format module's ``KINDS``)."""
_MODULES = {"dflash": "dflash", "specforge-domino": "specforge_domino", "eagle3": "eagle3", "dspark": "dspark",
            "dflash2": "dflash2"}
_COMMON = ("ExportError", "ForeignConfigError", "LABEL_CONVENTION", "SIDECAR_NAME")


def format_module(name: str):
    """The module that writes and reads format ``name`` (``export``, ``KINDS``)."""
    return importlib.import_module(f"lit_domino.interop.{_MODULES[name]}")


def __getattr__(name):
    if name == "FORMATS":  # format name → its module
        return {fmt: format_module(fmt) for fmt in FORMAT_KINDS}
    if name in _COMMON:
        return getattr(importlib.import_module("lit_domino.interop.common"), name)
    raise AttributeError(f"module 'lit_domino.interop' has no attribute {name!r}")


def formats_for(kind: str) -> list[str]:
    """The formats that express a ``kind`` drafter exactly."""
    return [name for name, kinds in FORMAT_KINDS.items() if kind in kinds]


def format_refusal(kind: str, format: str) -> str | None:  # noqa: A002 (the API's word)
    """Why a ``kind`` drafter cannot be written as ``format`` (None: it can); torch-free, for commands."""
    if format not in FORMAT_KINDS:
        return f"unknown export format {format!r}; choose one of {', '.join(FORMAT_KINDS)}"
    if kind in FORMAT_KINDS[format]:
        return None
    can = formats_for(kind)
    return (f"a {kind!r} drafter cannot be written as {format!r} (it holds {', '.join(FORMAT_KINDS[format])} "
            f"drafters); formats for {kind!r}: {', '.join(can) if can else 'none (keep save_pretrained)'}")


def export_drafter(drafter, directory: str | Path, format: str, target=None) -> Path:  # noqa: A002 (the API's word)
    """Write ``drafter`` into ``directory`` in ``format`` (see :data:`FORMATS`); returns the directory.

    The directory also gets ``lit_domino_export.json``: the target it was trained for (``target.name`` when
    the drafter is bound or ``target`` is given, and the fingerprint) and the label convention.
    A kind the format cannot express raises :class:`ExportError` naming the formats that can."""
    from lit_domino.interop.common import ExportError

    refusal = format_refusal(drafter.kind, format)
    if refusal:
        raise (ExportError if format in FORMAT_KINDS else ValueError)(refusal)
    mod = format_module(format)
    if target is not None:
        drafter.bind_target(target)  # the fingerprint check: never export for the wrong target
    directory = Path(directory).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    return mod.export(drafter, directory, target)


def detect_format(directory: str | Path) -> str | None:
    """The foreign format of a drafter directory (None: lit_domino's own ``save_pretrained`` layout)."""
    from lit_domino.interop import dflash, dflash2, dspark, eagle3, specforge_domino
    from lit_domino.interop.common import ForeignConfigError, read_config_json

    cfg = read_config_json(Path(directory).expanduser())
    if "kind" in cfg:
        return None
    if eagle3.detect(cfg):
        return eagle3.NAME
    if dspark.detect(cfg):
        return dspark.NAME
    if dflash2.detect(cfg):
        return dflash2.NAME
    if dflash.detect(cfg):
        dc = cfg.get("dflash_config")  # not an object: refused naming it by dflash's import
        projector = dc.get("projector_type") if isinstance(dc, dict) else None
        return specforge_domino.NAME if projector == specforge_domino.PROJECTOR else dflash.NAME
    kind = cfg.get("speculators_model_type")
    if kind is not None:  # another speculators model (mtp, peagle, speculators' own dflash ...): name it
        raise ForeignConfigError(f"cannot import: speculators_model_type={kind!r} is not expressible here (the "
                                 f"speculators layouts this suite reads are eagle3, dspark and dflash2)")
    raise ForeignConfigError(f"{Path(directory) / 'config.json'} is neither a lit_domino drafter config (no 'kind') "
                             f"nor a format this suite reads ({', '.join(FORMAT_KINDS)}: a 'dflash_config' or "
                             "'speculators_model_type: eagle3', 'dspark' or 'dflash2')")


def load_drafter(directory: str | Path, target=None, map_location="cpu"):
    """Any drafter: a ``save_pretrained`` directory of ours, one in a field format (detected from
    ``config.json``), or a hub id of either; bound to ``target`` when given. A directory inside a cache
    artifact is checked against the artifact's marker first, and weights are checked for NaN/inf."""
    from lit_domino.models.io import check_finite, check_recorded, is_foreign, load_saved, resolve_drafter_source

    directory = resolve_drafter_source(directory)
    check_recorded(directory)
    if not is_foreign(directory):
        return load_saved(directory, target, map_location)
    from lit_domino.interop import eagle3

    drafter = import_drafter(directory, map_location=map_location)
    check_finite(drafter, directory)
    if target is not None:
        drafter.bind_target(target)
        eagle3.check_carried(drafter, target)
    return drafter


def import_drafter(directory: str | Path, map_location="cpu"):
    """A foreign-format drafter directory as our drafter (unbound)."""
    from lit_domino.interop import dflash, dflash2, dspark, eagle3
    from lit_domino.interop.common import read_config_json

    directory = Path(directory).expanduser()
    fmt = detect_format(directory)
    cfg = read_config_json(directory)
    if fmt == eagle3.NAME:
        return eagle3.import_eagle3(directory, cfg, map_location)
    if fmt == dspark.NAME:
        return dspark.import_dspark(directory, cfg, map_location)
    if fmt == dflash2.NAME:
        return dflash2.import_dflash2(directory, cfg, map_location)
    return dflash.import_dflash_layout(directory, cfg, map_location)


__all__ = ["FORMATS", "FORMAT_KINDS", "load_drafter", "ExportError", "ForeignConfigError", "LABEL_CONVENTION", "SIDECAR_NAME",
           "detect_format", "export_drafter", "format_module", "format_refusal", "formats_for", "import_drafter"]
