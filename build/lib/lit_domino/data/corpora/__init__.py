"""Embedded corpora: offline, seeded, deterministic chat examples for math, code and chat.

Every corpus is built from material that ships with Python (templates for math,
the standard library's own source and reference text for code and chat), so the
suite trains its tiny target with no network. ``build_corpus`` is the one entry
point; the domain modules only produce examples.

Split rule shared by all domains: membership in "train" or "eval" never depends
on ``seed``; ``seed`` only orders (and, for generated math, produces) the
examples. So any train set is disjoint from any eval set, whatever seeds the
caller mixes.
"""

from __future__ import annotations

import hashlib
import importlib
import random
from dataclasses import dataclass

DOMAINS = ("math", "code", "chat")
SPLITS = ("train", "eval")

# Share of the code/chat source keys (module names, reference topics) that go to
# "eval". 10 % keeps a few hundred held-out examples per domain while leaving
# the bulk for training.
EVAL_FRACTION = 0.10


@dataclass(frozen=True)
class Example:
    """One chat example: alternating user/assistant messages, starting with user, ending with assistant."""

    domain: str
    messages: tuple[dict, ...]
    uid: str
    answer: str | None = None  # math only: the final number, as written after "####"

    @property
    def prompt(self) -> str:
        """The first user turn (what a benchmark would send)."""
        return self.messages[0]["content"]

    @property
    def user_turns(self) -> tuple[str, ...]:
        return tuple(m["content"] for m in self.messages if m["role"] == "user")

    @property
    def response(self) -> str:
        """The last assistant turn."""
        return self.messages[-1]["content"]


def turns_to_messages(*turns: str) -> tuple[dict, ...]:
    """Messages from alternating (user, assistant, user, assistant, ...) texts."""
    if not turns or len(turns) % 2:
        raise ValueError("a conversation needs user/assistant pairs")
    roles = ("user", "assistant")
    return tuple({"role": roles[i % 2], "content": text} for i, text in enumerate(turns))


def stable_hash(text: str) -> int:
    """A hash that is the same in every process and on every machine (``hash()`` is salted)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def split_of(key: str) -> str:
    """The split a source key (module name, topic) belongs to, from its stable hash."""
    return "eval" if stable_hash(key) % 10_000 < EVAL_FRACTION * 10_000 else "train"


def dedup_split(train: list[Example], eval_: list[Example]) -> tuple[list[Example], list[Example]]:
    """Drop repeated prompts within each split, and train examples whose prompt or answer text is in eval.

    Hash splits keep whole sources apart, but the standard library repeats text
    across modules (copied helpers, shared docstrings); without this, identical
    prompts would land on both sides.
    """

    def unique(examples: list[Example]) -> list[Example]:
        seen: set[str] = set()
        out = []
        for ex in examples:
            if ex.prompt not in seen:
                seen.add(ex.prompt)
                out.append(ex)
        return out

    def texts(ex: Example) -> set[str]:
        # The opening question and every answer; follow-ups ("Tell me more.") are generic on purpose.
        return {ex.prompt} | {m["content"] for m in ex.messages if m["role"] == "assistant"}

    eval_ = unique(eval_)
    held_out = set().union(*map(texts, eval_)) if eval_ else set()
    train = [ex for ex in unique(train) if not texts(ex) & held_out]
    return train, eval_


def _check(domain: str, split: str, n: int | None) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown corpus domain {domain!r}; choose one of {', '.join(DOMAINS)} (embedded) or a "
                         "hub prompt set (lit_domino.data.hub_prompts.SOURCES)")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"n must be a positive integer or None, got {n!r}")


def build_corpus(domain: str, split: str, n: int | None = None, seed: int = 0) -> list[Example]:
    """The ``split`` examples of ``domain``; ``n=None`` means all of them (math: its default size).

    Same arguments give the same list, in any process. Code and chat draw from a
    fixed pool per split, shuffled by ``seed``; math train is generated from a
    ``seed``-keyed stream (so any ``n`` is available), math eval is a fixed
    pool shuffled by ``seed``. Asking a fixed pool for more than it holds is an
    error rather than a silently shorter list.

    A ``domain`` naming a hub prompt set (``sharegpt``, ``ultrachat``, ``nemotron``, ``codealpaca``, optionally
    ``name@location``) reads it through :func:`lit_domino.data.hub_prompts.build_prompts` instead.
    """
    hub = importlib.import_module("lit_domino.data.hub_prompts")  # imported here: it imports datasets
    if hub.is_hub_source(domain):
        return hub.build_prompts(domain, split, n, seed)
    _check(domain, split, n)
    # Imported here so that `import lit_domino.data.corpora` stays cheap.
    source = importlib.import_module(f"{__name__}.{domain}")
    if domain == "math":
        return source.build(split, n, seed)
    pool = list(source.pool(split))
    random.Random(f"{domain}-{split}-{seed}").shuffle(pool)
    if n is not None and n > len(pool):
        raise ValueError(f"the {domain} {split} corpus holds {len(pool)} examples; asked for n={n}")
    return pool if n is None else pool[:n]


def corpus_stats(domain: str, split: str) -> dict:
    """Size of the default corpus: examples, characters, and a rough token estimate (characters / 4)."""
    examples = build_corpus(domain, split)
    chars = sum(len(m["content"]) for ex in examples for m in ex.messages)
    turns = sum(len(ex.messages) // 2 for ex in examples)
    return {
        "domain": domain,
        "split": split,
        "examples": len(examples),
        "turns": turns,
        "characters": chars,
        "approx_tokens": chars // 4,
    }


__all__ = ["DOMAINS", "SPLITS", "Example", "build_corpus", "corpus_stats"]
