"""The cases of the training-step memory benchmark (:mod:`lit_domino.studies.memory`), in a module without torch, so
that ``experiments/memory_bench.py`` refuses an unknown method or path before torch is imported."""

METHODS = ("backbone", "domino", "domino_ttt", "eagle3", "small_lm")
"""The drafter methods measured (``domino_ttt``: Domino trained with its TTT stages)."""
PATHS = ("old", "new")
"""The training paths compared: full-vocabulary logits (old) and the chunked loss (new)."""
