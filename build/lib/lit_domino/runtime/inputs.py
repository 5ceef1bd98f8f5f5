"""Cheap checks of command-line inputs, run right after parsing and before any heavy import or model load.

Each raises :class:`~lit_domino.runtime.command.UsageError` naming the option and the value, so that
``run_command`` prints one line. Nothing here imports torch, transformers or lightning.
"""

from __future__ import annotations

import json
from pathlib import Path

from lit_domino.runtime.command import UsageError

CONFIG_NAME = "config.json"
SERVER_CHECK_SECONDS = 5.0
"""How long the reachability check of a server URL may take before any work starts."""


def looks_like_hub_id(spec: str) -> bool:
    """``org/name`` (the rule of ``lit_domino.models.io``, which this module cannot import: it pulls in torch)."""
    return spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and all(spec.split("/"))


def check_positive(value, flag: str, minimum: int = 1) -> None:
    """``value`` (an int, or None = unset) must be >= ``minimum``."""
    if value is not None and value < minimum:
        raise UsageError(f"{flag} must be >= {minimum}, got {value}")


def parse_shard(spec, flag: str = "shard") -> tuple[int, int] | None:
    """``"i/N"`` (0 <= i < N) → ``(i, N)``; None stays None; a tuple is checked as it is."""
    if spec is None or isinstance(spec, tuple):
        pair = spec
    else:
        i, sep, n = str(spec).partition("/")
        try:
            pair = (int(i), int(n)) if sep else None
        except ValueError:
            pair = None
        if pair is None:
            raise UsageError(f"{flag} must be i/N (e.g. 0/4), got {spec!r}")
    if pair is not None and not (pair[1] >= 1 and 0 <= pair[0] < pair[1]):
        raise UsageError(f"{flag} {pair[0]}/{pair[1]}: need N >= 1 and 0 <= i < N (shards 0/{max(pair[1], 1)} .. "
                         f"{max(pair[1], 1) - 1}/{max(pair[1], 1)})")
    return pair


def check_drafter_source(spec: str, flag: str, allow_run_dir: bool = False) -> Path | None:
    """A drafter directory (``config.json`` inside), or a hub id (left to the loader); returns the local
    directory (a run directory's ``drafter/`` when ``allow_run_dir``), or None for a hub id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / CONFIG_NAME).is_file():
            return path
        if (path / "drafter" / CONFIG_NAME).is_file():
            if allow_run_dir:
                return path / "drafter"
            raise UsageError(f"{flag}: {spec!r} is a training run directory: pass its drafter directory "
                             f"{str(path / 'drafter')!r}")
        raise UsageError(f"{flag}: {spec!r} is not a drafter directory (no {CONFIG_NAME} inside)")
    if path.exists():
        raise UsageError(f"{flag}: {spec!r} is a file, not a drafter directory")
    if looks_like_hub_id(str(spec)):
        return None
    raise UsageError(f"{flag}: {spec!r} does not exist")


def check_drafter_config(directory: Path, flag: str) -> dict:
    """The JSON object in ``directory/config.json``; a model directory (a target) is refused by name."""
    try:
        cfg = json.loads((directory / CONFIG_NAME).read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"{flag}: {str(directory)!r}: {CONFIG_NAME} is unreadable ({type(err).__name__}: {err})")
    if not isinstance(cfg, dict):
        raise UsageError(f"{flag}: {str(directory)!r}: {CONFIG_NAME} does not hold a JSON object")
    foreign = "dflash_config" in cfg or cfg.get("speculators_model_type") is not None
    if "kind" not in cfg and not foreign and ("architectures" in cfg or "model_type" in cfg):
        what = ", ".join(cfg.get("architectures") or []) or cfg.get("model_type")
        raise UsageError(f"{flag}: {str(directory)!r} is a model directory ({what}), not a drafter: pass a "
                         "drafter directory (save_pretrained of a trained drafter, or a run's drafter/)")
    return cfg


def check_target_spec(spec: str | None, flag: str = "--target") -> None:
    """A target that names a local directory must exist (hub ids, ``embedded:<preset>``, ``random`` pass)."""
    if not spec or spec == "random" or spec.startswith("embedded:"):
        return
    path = Path(spec).expanduser()
    local = path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1  # lit_domino.target.load's rule
    if local and not path.is_dir():
        raise UsageError(f"{flag}: {spec!r} " + ("is not a directory" if path.exists() else "does not exist"))


def parse_json_object(text: str | None, flag: str) -> dict | None:
    """``--x '{"a": 1}'`` → the dict (None/'' → None); anything else is refused naming ``flag``."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as err:
        raise UsageError(f"{flag} is not valid JSON ({err}): {text!r}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object, got {text!r}")
    return value


def check_server(url: str, flag: str, timeout: float = SERVER_CHECK_SECONDS) -> None:
    """One ``GET /v1/models`` without retries, answered within ``timeout`` s, before any work starts."""
    from lit_domino.runtime.serving import ServerClient  # requests only

    try:
        client = ServerClient(url, retries=0)
    except ValueError as err:
        raise UsageError(f"{flag}: {err}") from None
    client.request("GET", "/models", timeout=timeout)  # ServerError (a UsageError) names the URL and the cause
