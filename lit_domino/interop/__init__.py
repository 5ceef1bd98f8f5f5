"""Drafters to and from the field's formats (one module per format).

* ``dflash`` (:mod:`.dflash`): z-lab's DFlash layout, for the backbone;
* ``specforge-domino`` (:mod:`.specforge_domino`): the DFlash layout with SpecForge's Domino projector;
* ``eagle3`` (:mod:`.eagle3`): the EAGLE-3 layout vLLM loads through ``speculators``;
* ``dspark`` (:mod:`.dspark`): speculators' DSpark layout (``DSparkDraftModel``), for DSpark.

``export_drafter(drafter, dir, format=...)`` writes one; ``lit_domino.load_drafter`` reads any of them
(and hub ids, :func:`resolve_drafter_source`), detected from ``config.json``. A drafter kind that a format
cannot express, or a foreign config this suite cannot run exactly, is refused naming the reason / field.
"""

from __future__ import annotations

from pathlib import Path

from lit_domino.interop import dflash, dspark, eagle3, specforge_domino
from lit_domino.interop.common import (LABEL_CONVENTION, SIDECAR_NAME, ExportError, ForeignConfigError,
                                       read_config_json)

FORMATS = {dflash.NAME: dflash, specforge_domino.NAME: specforge_domino, eagle3.NAME: eagle3, dspark.NAME: dspark}
"""Format name → its module (``export``, ``KINDS``: the drafter kinds it expresses exactly)."""


def formats_for(kind: str) -> list[str]:
    """The formats that express a ``kind`` drafter exactly."""
    return [name for name, mod in FORMATS.items() if kind in mod.KINDS]


def export_drafter(drafter, directory: str | Path, format: str, target=None) -> Path:  # noqa: A002 (the API's word)
    """Write ``drafter`` into ``directory`` in ``format`` (see :data:`FORMATS`); returns the directory.

    The directory also gets ``lit_domino_export.json``: the target it was trained for (``target.name`` when
    the drafter is bound or ``target`` is given, and the fingerprint) and the label convention.
    A kind the format cannot express raises :class:`ExportError` naming the formats that can."""
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")
    mod = FORMATS[format]
    if drafter.kind not in mod.KINDS:
        can = formats_for(drafter.kind)
        raise ExportError(f"a {drafter.kind!r} drafter cannot be written as {format!r} (it holds "
                          f"{', '.join(mod.KINDS)} drafters); formats for {drafter.kind!r}: "
                          f"{', '.join(can) if can else 'none (keep save_pretrained)'}")
    if target is not None:
        drafter.bind_target(target)  # the fingerprint check: never export for the wrong target
    directory = Path(directory).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    return mod.export(drafter, directory, target)


def detect_format(directory: str | Path) -> str | None:
    """The foreign format of a drafter directory (None: lit_domino's own ``save_pretrained`` layout)."""
    cfg = read_config_json(Path(directory).expanduser())
    if "kind" in cfg:
        return None
    if eagle3.detect(cfg):
        return eagle3.NAME
    if dspark.detect(cfg):
        return dspark.NAME
    if dflash.detect(cfg):
        dc = cfg.get("dflash_config")  # not an object: refused naming it by dflash's import
        projector = dc.get("projector_type") if isinstance(dc, dict) else None
        return specforge_domino.NAME if projector == specforge_domino.PROJECTOR else dflash.NAME
    raise ForeignConfigError(f"{Path(directory) / 'config.json'} is neither a lit_domino drafter config (no 'kind') "
                             f"nor a format this suite reads ({', '.join(FORMATS)}: a 'dflash_config' or "
                             "'speculators_model_type: eagle3' or 'dspark')")


def import_drafter(directory: str | Path, map_location="cpu"):
    """A foreign-format drafter directory as our drafter (unbound)."""
    directory = Path(directory).expanduser()
    fmt = detect_format(directory)
    cfg = read_config_json(directory)
    if fmt == eagle3.NAME:
        return eagle3.import_eagle3(directory, cfg, map_location)
    if fmt == dspark.NAME:
        return dspark.import_dspark(directory, cfg, map_location)
    return dflash.import_dflash_layout(directory, cfg, map_location)


__all__ = ["FORMATS", "ExportError", "ForeignConfigError", "LABEL_CONVENTION", "SIDECAR_NAME", "detect_format",
           "export_drafter", "formats_for", "import_drafter"]
