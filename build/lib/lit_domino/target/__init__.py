"""The target side: loading any Hugging Face causal LM and reading its features (``load``), the embedded
targets' recipes and shipped copies (``embedded``, torch-free), the recipe that trains one (``recipe``) and its
tokenizer (``tokenizer``). ``load_target`` and ``Target`` are re-exported lazily, so importing this package
(e.g. for ``lit_domino.target.embedded``) does not load torch."""

from lit_domino.runtime.lazy import lazy_exports

_LAZY = {"Target": "lit_domino.target.load", "load_target": "lit_domino.target.load"}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = sorted(_LAZY)
