"""lit_domino: a Lightning experiment suite for draft models of speculative decoding.

The three entry points other code relies on (docs/ARCHITECTURE.md) are re-exported
lazily, so ``import lit_domino`` stays cheap:

* :func:`load_target` — any Hugging Face causal LM, or ``"embedded:<preset>"``;
* :func:`load_drafter` — a drafter directory written by ``save_pretrained`` (or in a field format, or a hub id);
* :func:`export_drafter` — write a drafter in the DFlash / SpecForge-Domino / EAGLE-3 (speculators) layout;
* :func:`generate` — lossless speculative (or plain, ``drafter=None``) decoding.
"""

from lit_domino.runtime.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "load_target": "lit_domino.target.load",
    "Target": "lit_domino.target.load",
    "load_drafter": "lit_domino.interop",
    "export_drafter": "lit_domino.interop",
    "generate": "lit_domino.decoding",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


__all__ = list(_LAZY)
