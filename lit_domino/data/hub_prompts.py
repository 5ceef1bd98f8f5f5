"""The papers' training prompt sets from the Hugging Face Hub, as corpus examples for regeneration.

Like the embedded corpora (``lit_domino.data.corpora``), each source yields :class:`~lit_domino.data.corpora.Example`
conversations: alternating user/assistant turns starting with a user turn, cut after the last assistant turn.
Regeneration (``lit_domino.data.regenerate``) keeps only the user turns and has the target answer each of them in
order, so the hub's own answers never reach training. A source is named in ``data.train_examples`` like a corpus
domain (``{nemotron: 780000, codealpaca: null}``); ``data.prompt_sources`` points a source at another hub id or a
local copy (a ``.json``/``.jsonl``/``.parquet`` file in the hub schema, or a ``save_to_disk`` directory).

The sources and the recipes that use them:

* ``sharegpt`` — ``Aeala/ShareGPT_Vicuna_unfiltered`` (a cleaned copy of
  ``anon8231489123/ShareGPT_Vicuna_unfiltered``); rows ``{"id", "conversations": [{"from", "value"}]}`` with
  ``from`` in human/gpt (system turns dropped). EAGLE-3 (Li et al., 2025) trains on ShareGPT + UltraChat-200k;
  SpecForge's ``prepare_data.py --dataset sharegpt`` reads this repository.
* ``ultrachat`` — ``HuggingFaceH4/ultrachat_200k``, splits ``train_sft`` / ``test_sft``; rows
  ``{"prompt", "prompt_id", "messages": [{"role", "content"}]}``. EAGLE-3's second set.
* ``nemotron`` — ``nvidia/Nemotron-Post-Training-Dataset-v2``, its ``chat``, ``code``, ``math`` and ``stem`` splits
  together; rows ``{"uuid", "messages": [{"role", "content", ...}], ...}`` (system and tool turns dropped). The
  DFlash recipe (z-lab's DFlash release) reports ~800K prompts from it and CodeAlpaca.
* ``codealpaca`` — ``sahil2801/CodeAlpaca-20k``; rows ``{"instruction", "input", "output"}``; the prompt is the
  instruction, followed by the input when there is one. DFlash's code data.

Splits: ``train`` is the source's training split; ``eval`` its test split where it has one (UltraChat), else the
same rows split by a stable hash of each row's id (``corpora.split_of``, 10 % eval), so train and eval never
share a conversation. A local file is one split and is always hash-split. Rows without a usable user turn are
dropped, and repeated opening prompts kept once; a source left with no usable prompt is an error.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import datasets

from lit_domino.data.corpora import DOMAINS, Example, split_of
from lit_domino.runtime.paths import project_path

EMBEDDED_HINT = ("the embedded corpora need no network: data.train_examples: {math: 8000, code: 2000, chat: 2000} "
                 "(base.yaml's default)")
"""What the offline error suggests instead."""

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "assistant": "assistant"}
"""Speaker names of the hub schemas → chat roles; anything else (system, tool) is dropped."""


class HubPromptsUnavailable(RuntimeError):
    """A hub prompt set that cannot be loaded (offline, gated, missing); the message names the way around it."""


def _turns_sharegpt(row: dict) -> list[tuple[str, str]]:
    return [(str(m.get("from", "")).lower(), m.get("value")) for m in row.get("conversations") or []]


def _turns_messages(row: dict) -> list[tuple[str, str]]:
    return [(str(m.get("role", "")).lower(), m.get("content")) for m in row.get("messages") or []]


def _turns_alpaca(row: dict) -> list[tuple[str, str]]:
    prompt = (row.get("instruction") or "").strip()
    extra = (row.get("input") or "").strip()
    return [("user", f"{prompt}\n\n{extra}" if prompt and extra else prompt), ("assistant", row.get("output") or "")]


@dataclass(frozen=True)
class HubPromptSet:
    """One hub prompt set: where it lives and how its rows become conversations."""

    name: str
    """The source name used in ``data.train_examples``."""
    hub_id: str
    """Default Hugging Face dataset id."""
    turns: Callable[[dict], list[tuple[str, str]]]
    """A row → its (speaker, text) turns in order."""
    id_field: str | None
    """The row's id column (hashes the eval split); None = a hash of the first user turn."""
    train_splits: tuple[str, ...] = ("train",)
    """Hub splits read for ``train`` (concatenated)."""
    eval_split: str | None = None
    """The hub's own held-out split for ``eval``; None = hash-split the training rows."""
    recipe: str = ""
    """Which paper's recipe uses it (docs)."""


SOURCES: dict[str, HubPromptSet] = {s.name: s for s in (
    HubPromptSet("sharegpt", "Aeala/ShareGPT_Vicuna_unfiltered", _turns_sharegpt, "id", recipe="EAGLE-3"),
    HubPromptSet("ultrachat", "HuggingFaceH4/ultrachat_200k", _turns_messages, "prompt_id",
                 train_splits=("train_sft",), eval_split="test_sft", recipe="EAGLE-3"),
    HubPromptSet("nemotron", "nvidia/Nemotron-Post-Training-Dataset-v2", _turns_messages, "uuid",
                 train_splits=("chat", "code", "math", "stem"), recipe="DFlash"),
    HubPromptSet("codealpaca", "sahil2801/CodeAlpaca-20k", _turns_alpaca, None, recipe="DFlash"),
)}
"""The hub prompt sets by source name."""

SEPARATOR = "@"
"""``<source>@<location>``: a source read from another hub id or a local copy (how the DataModule passes
``data.prompt_sources`` on, so the location is part of the regenerated data's cache key)."""


def parse_source(spec: str) -> tuple[HubPromptSet, str]:
    """``"nemotron"`` or ``"nemotron@/data/nemotron.jsonl"`` → (the source, its location)."""
    name, _, location = str(spec).partition(SEPARATOR)
    if name not in SOURCES:
        raise ValueError(f"unknown prompt source {name!r}: the embedded corpora are {', '.join(DOMAINS)}, "
                         f"the hub prompt sets {', '.join(SOURCES)}")
    return SOURCES[name], location or SOURCES[name].hub_id


def is_hub_source(spec: str) -> bool:
    """Whether a ``train_examples`` key names a hub prompt set (not an embedded corpus domain)."""
    return str(spec).partition(SEPARATOR)[0] in SOURCES


def conversation(turns: list[tuple[str, str]]) -> tuple[dict, ...]:
    """(speaker, text) turns → user/assistant messages: system/tool turns dropped, leading assistant turns
    skipped, cut at the first turn that breaks the alternation or is not text, or whose user text is empty,
    and after the last assistant turn. Empty when no user turn with an answer remains."""
    messages: list[dict] = []
    for speaker, text in turns:
        role = ROLES.get(speaker)
        if role is None:
            continue
        if not messages and role == "assistant":
            continue
        expected = "user" if len(messages) % 2 == 0 else "assistant"
        if role != expected or not isinstance(text, str) or (role == "user" and not text.strip()):
            break
        messages.append({"role": role, "content": text})
    if len(messages) % 2:
        messages.pop()  # a last user turn without an answer
    return tuple(messages)


def _read_local(path: Path, splits: tuple[str, ...]):
    if path.is_dir():
        try:
            ds = datasets.load_from_disk(str(path))
        except FileNotFoundError as err:
            raise ValueError(f"{path} is not a datasets.save_to_disk directory ({err})") from None
        if isinstance(ds, datasets.DatasetDict):
            found = [ds[s] for s in splits if s in ds] or [ds[next(iter(ds))]]
            return datasets.concatenate_datasets(found)
        return ds
    # read directly (no datasets builder: nothing is written to the user's HF cache for a local file)
    if path.suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        return rows if isinstance(rows, list) else [rows]
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: a local prompt set is a .json, .jsonl or .parquet file or a save_to_disk folder")


def load_rows(source: HubPromptSet, location: str, split: str):
    """The raw rows of ``split`` (and whether they still need the hash split). A relative local path that is not
    under the cwd is looked up in the checkout (a preset's copies: ``lit_domino.runtime.paths.project_path``)."""
    path = project_path(location)
    if path.exists():
        return _read_local(path, source.train_splits), True
    hub_splits = (source.eval_split,) if split == "eval" and source.eval_split else source.train_splits
    try:
        parts = [datasets.load_dataset(location, split=s) for s in hub_splits]
    except Exception as err:  # noqa: BLE001 (offline, gated or missing: datasets raises many kinds)
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise HubPromptsUnavailable(
            f"the prompt set {source.name!r} could not be loaded from the Hugging Face Hub ({location}, split "
            f"{'+'.join(hub_splits)}: {type(err).__name__}: {first}). Offline, point data.prompt_sources."
            f"{source.name} at a local copy in its hub schema, or train on the embedded corpora instead: "
            f"{EMBEDDED_HINT}") from err
    return (parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)), source.eval_split is None


def _uid(source: HubPromptSet, row: dict, messages) -> str:
    key = row.get(source.id_field) if source.id_field else None
    if key is None or key == "":
        key = hashlib.sha256(messages[0]["content"].encode("utf-8")).hexdigest()[:16]
    return f"{source.name}/{key}"


def build_prompts(spec: str, split: str, n: int | None = None, seed: int = 0) -> list[Example]:
    """The ``split`` conversations of the hub prompt set ``spec`` (``name`` or ``name@location``), shuffled by
    ``seed``, the first ``n`` (None = all). Raises :class:`HubPromptsUnavailable` when it cannot be loaded and
    ``ValueError`` when no usable prompt remains or ``n`` exceeds what there is."""
    source, location = parse_source(spec)
    if split not in ("train", "eval"):
        raise ValueError(f"unknown split {split!r}; choose train or eval")
    rows, hash_split = load_rows(source, location, split)
    examples, seen, dropped = [], set(), {"no user turn with an answer": 0, "repeated prompt": 0, "other split": 0}
    for row in rows:
        messages = conversation(source.turns(row))
        if not messages:
            dropped["no user turn with an answer"] += 1
            continue
        if messages[0]["content"] in seen:  # before the split: a repeated prompt never lands in both
            dropped["repeated prompt"] += 1
            continue
        seen.add(messages[0]["content"])
        uid = _uid(source, row, messages)
        if hash_split and split_of(uid) != split:
            dropped["other split"] += 1
            continue
        examples.append(Example(domain=source.name, messages=messages, uid=uid))
    if not examples:
        why = ", ".join(f"{k}: {v}" for k, v in dropped.items() if v) or "the set is empty"
        raise ValueError(f"the prompt set {source.name!r} ({location}) has no usable {split} prompts after "
                         f"filtering ({len(rows)} rows; dropped {why})")
    random.Random(f"{source.name}-{split}-{seed}").shuffle(examples)
    if n is not None and n > len(examples):
        raise ValueError(f"the prompt set {source.name!r} ({location}) holds {len(examples)} usable {split} "
                         f"prompts; asked for n={n}")
    return examples if n is None else examples[:n]


__all__ = ["EMBEDDED_HINT", "SOURCES", "HubPromptSet", "HubPromptsUnavailable", "build_prompts", "conversation",
           "is_hub_source", "parse_source"]
