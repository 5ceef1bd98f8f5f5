"""lit_domino: a Lightning experiment suite for draft models of speculative decoding.

The three entry points other code relies on (docs/ARCHITECTURE.md) are re-exported
lazily, so ``import lit_domino`` stays cheap:

* :func:`load_target` — any Hugging Face causal LM, or ``"embedded:<preset>"``;
* :func:`load_drafter` — a drafter directory written by ``save_pretrained`` (or in a field format, or a hub id);
* :func:`export_drafter` — write a drafter in the DFlash / SpecForge-Domino / EAGLE-3 (speculators) layout;
* :func:`generate` — lossless speculative (or plain, ``drafter=None``) decoding.
"""

__version__ = "0.1.0"

_LAZY = {
    "load_target": "lit_domino.target",
    "Target": "lit_domino.target",
    "load_drafter": "lit_domino.models.io",
    "export_drafter": "lit_domino.interop",
    "generate": "lit_domino.decoding",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_domino' has no attribute {name!r}")


__all__ = list(_LAZY)
