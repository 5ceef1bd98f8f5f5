"""Building, saving and loading drafters of any registered method.

A drafter directory holds ``config.json`` (``config.to_dict()``, naming the kind) and
``model.safetensors`` (the drafter's own parameters only: the target's embedding and
LM head are never saved). A small-LM drafter also writes its Hugging Face
``save_pretrained`` copy under ``lm/``. Loading needs no Lightning:
:func:`load_saved` (our layout); ``lit_domino.load_drafter`` (in :mod:`lit_domino.interop`, the layer above)
also reads the field's formats, told apart by ``config.json`` (ours names a ``kind``), and hub ids of such
drafters (``z-lab/Qwen3-8B-DFlash-b16``), downloaded here by :func:`resolve_drafter_source`.

No corrupt file is loaded: a directory inside a cache artifact is checked against the artifact's
marker first (whole-file SHA-256s, :func:`lit_domino.runtime.cache.check_directory`), and the loaded weights
are checked for NaN and inf; either problem is a :class:`DrafterLoadError` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_model

from lit_domino.runtime import cache
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


def _is_hub_id(spec: str) -> bool:
    return spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and all(spec.split("/"))


def resolve_drafter_source(spec: str | Path) -> Path:
    """A local drafter directory for ``spec``: the directory itself, or a hub id's snapshot.

    Offline (``HF_HUB_OFFLINE`` set, or the hub not answering within seconds) a hub id loads only from
    the local Hugging Face cache; when it is not there the error names the local alternative."""
    from lit_domino.target.load import HUB_CHECK_SECONDS, hub_offline, hub_reachable

    path = Path(spec).expanduser()
    if path.is_dir() or not _is_hub_id(str(spec)):
        if not path.is_dir():
            raise FileNotFoundError(f"drafter directory {path} does not exist")
        return path
    from huggingface_hub import snapshot_download

    offline = hub_offline()
    local_only = bool(offline) or (offline is None and not hub_reachable())
    try:
        return Path(snapshot_download(str(spec), local_files_only=local_only,
                                      allow_patterns=["*.json", "*.safetensors"]))
    except Exception as err:  # noqa: BLE001 (offline cache miss, unknown repo, network)
        why = ("HF_HUB_OFFLINE is set" if offline else f"the hub is unreachable (no answer within "
               f"{HUB_CHECK_SECONDS:g} s)") if local_only else f"{type(err).__name__}: {err}"
        raise FileNotFoundError(
            f"cannot load drafter {str(spec)!r} from the Hugging Face hub: {why}"
            + (" and it is not in the local Hugging Face cache" if local_only else "")
            + f". Offline, download it elsewhere (huggingface-cli download {spec} --local-dir DIR) and pass the "
            "local directory DIR, or use a drafter trained here (a save_pretrained directory)") from None


def load_saved(directory: str | Path, target=None, map_location: str | torch.device = "cpu") -> Drafter:
    """Rebuild a drafter saved with ``save_pretrained`` (no Lightning) from a local directory; bind it when
    ``target`` is given. ``lit_domino.load_drafter`` (:func:`lit_domino.interop.load_drafter`) is the entry
    point that also reads the field's formats and hub ids, and calls this for our own layout."""
    directory = Path(directory).expanduser()
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
    check_finite(drafter, w_path)
    drafter.eval()
    if target is not None:
        drafter.bind_target(target)
    return drafter


def is_foreign(directory: Path) -> bool:
    """Whether ``config.json`` is another project's (ours always names the drafter ``kind``)."""
    try:
        data = json.loads((directory / CONFIG_NAME).read_text())
    except (json.JSONDecodeError, FileNotFoundError):
        return False  # read_config reports it
    return isinstance(data, dict) and "kind" not in data


def check_recorded(directory: Path) -> None:
    """Refuse a drafter directory whose files differ from what its cache artifact's marker recorded."""
    root, problems = cache.check_directory(directory)
    if problems:
        raise DrafterLoadError(
            f"drafter directory {directory} is corrupt: {'; '.join(problems)} (checked against the marker "
            f"{root / '.complete'}); rerun the training that built it to rebuild it, or delete {root}")


def check_finite(drafter: Drafter, source: Path) -> None:
    """Refuse weights holding NaN or inf (a corrupt file, or a training that diverged), naming the tensor."""
    bad = cache.first_nonfinite(drafter.state_dict().items())
    if bad is not None:
        name, count = bad
        raise DrafterLoadError(f"{source} holds non-finite weights: tensor {name!r} has {count} NaN/inf "
                               "values (the file is corrupt, or the training that wrote it diverged)")
