"""Regenerated training sets that ship with the package, keyed exactly as the artifact cache keys them.

A regenerated set is a deterministic function of the target and the prompts (greedy answers), so where the
target ships (``embedded:default``), its preset's train and evaluation sets ship beside it and no first run
answers 2,000 prompts again. Each set is one ``<split>-<key hash>.jsonl.gz`` under
``lit_domino/assets/regen/`` (one row per line: ``uid``, ``domain``, ``input_ids``, ``loss_mask``,
``prompt_len``, in the dataset's order), listed in ``manifest.json`` with the cache key it stands for (the
target's name, which carries the shipped weights' hash, its fingerprint and the :class:`RegenConfig`), its size,
its SHA-256 and the regeneration report.

:func:`lit_domino.data.regenerate.regenerate` installs a shipped set into the cache (seconds) when one ships for
exactly its key; a set shipped for another target hash (the recipe rebuilt on this machine, say) is never read:
the set is regenerated, and the log names both hashes. A shipped file that is missing, truncated or altered is a
:class:`ShippedDataError` naming the file and the command that rebuilds it, before anything trains.

``python experiments/regenerate.py --preset default --ship`` regenerates the sets from the target (never from a
shipped copy) and writes them here.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
from pathlib import Path

from lit_domino.runtime import cache
from lit_domino.runtime.command import UsageError

log = logging.getLogger(__name__)

SHIPPED_REGEN_ROOT = Path(__file__).resolve().parents[1] / "assets" / "regen"
"""Where the shipped regenerated sets live (package data)."""
MANIFEST = "manifest.json"
COLUMNS = ("uid", "domain", "input_ids", "loss_mask", "prompt_len")
"""A regenerated row's fields (:func:`lit_domino.data.regenerate._row`), in the order they are written."""
REBUILD_HINT = ("reinstall lit_domino, or rebuild the shipped sets with `python experiments/regenerate.py --preset "
                "{preset} --ship` (minutes on 2 CPU cores)")


class ShippedDataError(UsageError):
    """A shipped regenerated set whose file is missing or does not match its recorded size and SHA-256."""


def read_manifest(root: Path | None = None) -> dict:
    """``{artifact folder name: entry}`` of the shipped sets in ``root`` (default: the package's; {} where none)."""
    path = Path(root or SHIPPED_REGEN_ROOT) / MANIFEST
    if not path.is_file():
        return {}
    return json.loads(path.read_text())["sets"]


def _target_hash(name: str) -> str:
    """The weights' part of a target's name: ``+shipped-<sha12>`` for a shipped embedded target, else the name."""
    return name.rsplit("+shipped-", 1)[1] if "+shipped-" in name else name


def find(key: dict, folder_name: str, root: Path | None = None) -> tuple[Path, dict] | None:
    """The verified shipped file of the regenerated set whose cache key is ``key`` (its cache folder
    ``folder_name``) and its manifest entry, or None when none ships for exactly that key.

    A set shipped for the same prompts and settings but another target (another weights hash: the recipe rebuilt
    on this machine, another shipped copy) is never read: None, and an info line names both hashes.
    """
    root = Path(root or SHIPPED_REGEN_ROOT)
    sets = read_manifest(root)
    entry = sets.get(folder_name)
    if entry is None or entry["key"] != cache.to_jsonable(key):
        for other in sets.values():
            if other["key"]["regen"] == cache.to_jsonable(key["regen"]) and other["key"]["target"] == \
                    cache.to_jsonable(key["target"]):
                log.info("a %s set ships for target %s (weights %s), not for this one, %s (weights %s): "
                         "regenerating it", key["regen"]["split"], other["key"]["target_name"],
                         _target_hash(other["key"]["target_name"]), key["target_name"],
                         _target_hash(key["target_name"]))
        return None
    return verified(root / entry["file"], entry), entry


def verified(path: Path, entry: dict) -> Path:
    """``path`` if it is whole (its size and SHA-256 as the manifest records), else :class:`ShippedDataError`."""
    hint = REBUILD_HINT.format(preset=entry.get("preset", "default"))
    if not path.is_file():
        raise ShippedDataError(f"the shipped regenerated set {path} is missing (listed in {path.parent / MANIFEST}); "
                               f"{hint}")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise ShippedDataError(f"the shipped regenerated set {path} is truncated or altered ({size} bytes, "
                               f"{MANIFEST} records {entry['bytes']}); {hint}")
    if cache.file_sha256(path) != entry["sha256"]:
        raise ShippedDataError(f"the shipped regenerated set {path} is corrupt (its SHA-256 differs from "
                               f"{MANIFEST}'s); {hint}")
    return path


def read_rows(path: Path) -> list[dict]:
    """The rows of a shipped set, in the dataset's order."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def install(path: Path, entry: dict, dest: Path, marker: dict) -> None:
    """Write the shipped set ``path`` (its manifest ``entry``) into the cache folder ``dest`` as :func:`regenerate`
    builds it (``dataset/`` + ``report.json``, then the ``.complete`` marker ``marker``); under ``dest``'s lock."""
    import datasets

    rows = read_rows(path)
    with cache.staging(dest / "dataset") as tmp:
        datasets.Dataset.from_list(rows).save_to_disk(str(tmp))
    report = {**entry["report"], "source": f"shipped: {path.name}"}
    (dest / "report.json").write_text(json.dumps(report, indent=2))
    cache.mark_complete(dest, marker)


def _gzip_jsonl(rows) -> bytes:
    """Deterministic bytes (no name, mtime 0): the same rows always ship as the same file."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz:
        for row in rows:
            gz.write((json.dumps({c: row[c] for c in COLUMNS}, separators=(",", ":")) + "\n").encode())
    return buf.getvalue()


def ship(dataset, key: dict, folder_name: str, report: dict, preset: str, root: Path | None = None) -> Path:
    """Write a regenerated ``dataset`` (its cache key ``key``, cache folder ``folder_name``) as a shipped set and
    record it in the manifest, replacing the set ``preset`` shipped for the same split before (an older target's, or
    other prompts')."""
    root = Path(root or SHIPPED_REGEN_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    name = f"{folder_name}.jsonl.gz"
    data = _gzip_jsonl(dataset)
    (root / name).write_bytes(data)
    sets = read_manifest(root)
    key = cache.to_jsonable(key)
    stale = [k for k, e in sets.items() if k != folder_name and e["preset"] == preset
             and e["key"]["regen"]["split"] == key["regen"]["split"]]
    for k in stale:  # what this preset shipped for this split before: its file goes too
        (root / sets.pop(k)["file"]).unlink(missing_ok=True)
    sets[folder_name] = {"file": name, "bytes": len(data), "sha256": cache.file_sha256(root / name), "key": key,
                         "preset": preset, "rows": len(dataset),
                         "report": {k: v for k, v in report.items() if k not in ("seconds", "tokens_per_second")}}
    manifest = {"about": "regenerated sets shipped with lit_domino (lit_domino/data/shipped.py); rebuild with "
                         "`python experiments/regenerate.py --preset <preset> --ship`",
                "sets": dict(sorted(sets.items()))}
    cache.write_text_atomic(root / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return root / name
