"""Speculative decoding: the engine, DLoop, verification rules, metrics and Hugging Face peers.

* :func:`generate` — lossless speculative decoding (``drafter=None``: the plain AR baseline);
* :class:`DLoopConfig` — the confidence-gated multi-stage drafting loop;
* :func:`benchmark` — decode prompt sets with several drafters/settings and report
  ``tau``, ``speedup`` (vs our AR baseline, same process) and ``speedup_vs_hf_generate``;
* :mod:`.metrics` — torchmetrics for acceptance length and per-position acceptance;
* :mod:`.hf_peers` — timed Hugging Face ``generate`` / assisted / prompt-lookup decoding.
"""

from lit_domino.decoding.dloop import DLoopConfig
from lit_domino.decoding.engine import GenerationResult, generate
from lit_domino.decoding.kv import crop_cache
from lit_domino.decoding.metrics import benchmark

__all__ = ["DLoopConfig", "GenerationResult", "benchmark", "crop_cache", "generate"]
