"""GSM8K-style word problems from templates × entities × numbers, with worked solutions.

Sized for a ~4M-parameter target that must learn them: 2–3 steps, operands
mostly one or two digits, every result below 1000, small multipliers and exact
division only. Every step writes its equation as ``a op b = c`` inside a
sentence ("Tom has 12 + 7 = 19 apples."), and the solution ends with a GSM8K
line ``#### N``; ``Example.answer`` is ``N``.

Eval is a fixed pool drawn from its own stream, independent of ``seed``; train
is drawn from a ``seed``-keyed stream and drops every problem whose template
and numbers appear in the eval pool, so eval problems are held out as
arithmetic, not only as wording.
"""

from __future__ import annotations

import functools
import hashlib
import random
from lit_domino.data.corpora import Example, turns_to_messages
# The templates live apart; their names stay importable from here.
from lit_domino.data.corpora.math_templates import TEMPLATES, Template, Draw, eq  # noqa: F401

# Default sizes: 20k train problems are ~1.5M characters/4 tokens, the math share
# of the tiny target's 2–3M-token budget; 500 eval problems give a greedy
# exact-match accuracy with a ~2 % standard error.
DEFAULT_TRAIN_SIZE = 20_000
EVAL_SIZE = 500
# Draws allowed per requested example before giving up: a few templates have
# small number spaces, so some draws are rejected as duplicates of eval.
_MAX_DRAWS_PER_EXAMPLE = 50

_NAMES = sorted(TEMPLATES)  # fixed order: the rng picks by index


def _example(question: str, steps: list[str], answer: int) -> Example:
    solution = "\n".join(steps) + f"\n#### {answer}"
    uid = "math-" + hashlib.sha256(question.encode("utf-8")).hexdigest()[:16]
    return Example(domain="math", messages=turns_to_messages(question, solution), uid=uid, answer=str(answer))


def _stream(rng_key: str, n: int, exclude: frozenset) -> list[Example]:
    """``n`` problems from the rng keyed by ``rng_key``, skipping (template, numbers) in ``exclude`` and repeats.

    Train repeats arithmetic under new wording (only exact repeats are dropped),
    so templates with small number spaces are not exhausted.
    """
    rng = random.Random(rng_key)  # str seeds are hashed with SHA-512: stable across processes
    draw = Draw(rng)
    out, questions = [], set()
    for _ in range(n * _MAX_DRAWS_PER_EXAMPLE):
        if len(out) == n:
            break
        name = _NAMES[rng.randrange(len(_NAMES))]
        made = TEMPLATES[name](draw)
        if made is None:
            continue
        question, steps, answer, numbers = made
        key = (name, numbers)
        if key in exclude or question in questions:
            continue
        if not 0 <= answer < 1000:  # templates guarantee this; a draw that breaks it is dropped
            continue
        questions.add(question)
        out.append(_example(question, steps, answer))
    if len(out) < n:
        raise RuntimeError(f"math generator produced only {len(out)} of {n} distinct problems")
    return out


@functools.lru_cache(maxsize=1)
def _eval_pool() -> tuple[tuple[Example, ...], frozenset]:
    """The fixed eval problems and their (template, numbers) keys; distinct arithmetic, independent of seed."""
    rng = random.Random("math-eval")
    draw = Draw(rng)
    out, keys = [], set()
    while len(out) < EVAL_SIZE:
        name = _NAMES[rng.randrange(len(_NAMES))]
        made = TEMPLATES[name](draw)
        if made is None or (name, made[3]) in keys:
            continue
        keys.add((name, made[3]))
        out.append(_example(*made[:3]))
    return tuple(out), frozenset(keys)


@functools.lru_cache(maxsize=8)
def _train(n: int, seed: int) -> tuple[Example, ...]:
    return tuple(_stream(f"math-train-{seed}", n, exclude=_eval_pool()[1]))


def build(split: str, n: int | None, seed: int) -> list[Example]:
    """Math examples of ``split`` (see the module docstring for how the splits are kept apart)."""
    if split == "eval":
        pool = list(_eval_pool()[0])
        if n is not None and n > len(pool):
            raise ValueError(f"the math eval corpus holds {len(pool)} problems; asked for n={n}")
        random.Random(f"math-eval-{seed}").shuffle(pool)
        return pool if n is None else pool[:n]
    return list(_train(DEFAULT_TRAIN_SIZE if n is None else n, seed))
