"""Speculative decoding: the engine, DLoop, verification rules, metrics and Hugging Face peers.

* :func:`generate` — lossless speculative decoding (``drafter=None``: the plain AR baseline);
* :class:`DLoopConfig` — the confidence-gated multi-stage drafting loop;
* :class:`TreeConfig` — tree rounds (chain, DDTree, path-conditioned builders; a cost-aware budget with
  :func:`measure_verify_cost`);
* :func:`benchmark` — decode prompt sets with several drafters/settings and report
  ``tau``, ``speedup`` (vs our AR baseline, same process) and ``speedup_vs_hf_generate``;
* :mod:`.metrics` — torchmetrics for acceptance length and per-position acceptance;
* :mod:`.hf_peers` — timed Hugging Face ``generate`` / assisted / prompt-lookup decoding.
"""

from lit_domino.runtime.lazy import lazy_exports

# Re-exported lazily (PEP 562): a command parses a DLoop spec through this package before torch is imported.
_LAZY = {
    "DLoopConfig": "lit_domino.decoding.dloop",
    "GenerationResult": "lit_domino.decoding.result",
    "generate": "lit_domino.decoding.engine",
    "crop_cache": "lit_domino.decoding.kv",
    "TreeConfig": "lit_domino.decoding.tree",
    "VerifyCost": "lit_domino.decoding.cost",
    "measure_verify_cost": "lit_domino.decoding.cost",
    "benchmark": "lit_domino.decoding.harness",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


__all__ = sorted(_LAZY)
