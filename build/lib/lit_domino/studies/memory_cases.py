"""The cases of the training-step memory benchmark (:mod:`lit_domino.studies.memory`), in a module without torch, so
that ``experiments/memory_bench.py`` refuses an unknown method or path before torch is imported."""

METHODS = ("backbone", "domino", "domino_ttt", "dspark", "dflash2", "eagle3", "small_lm")
"""The drafter methods measured (``domino_ttt``: Domino trained with its TTT stages)."""
PATHS = ("old", "new")
"""The training paths compared: full-vocabulary logits (old) and the chunked loss (new)."""
VARIANTS = {"domino_ttt": ("domino", "training_time_test")}
"""A measured method that is a registered drafter kind trained another way: (kind, ``causal_inputs``); every
other method is its kind, teacher forced."""


def method_kind(method: str) -> tuple[str, str]:
    """``method`` -> (its registered drafter kind, the ``causal_inputs`` of its training step)."""
    return VARIANTS.get(method, (method, "teacher_forced"))
