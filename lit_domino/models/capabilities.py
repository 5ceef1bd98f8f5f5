"""What a drafter method can do, declared once: the record decoding, trees, predictors, studies and interop check.

A method declares its capabilities on its :class:`~lit_domino.models.base.Drafter` subclass (class attributes,
docs/ARCHITECTURE.md's recipe lists them); :func:`capabilities_of` reads them into one :class:`Capabilities`
record, and :func:`require` refuses a setting a drafter cannot serve, naming the capability and the drafter's kind.
An object without the :class:`Declares` method (a test's stub drafter) declares nothing: it drafts chains only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from lit_domino.runtime.command import UsageError


class MissingCapability(UsageError):
    """A setting needs a capability the drafter does not declare (raised before any decoding)."""


@dataclass(frozen=True)
class Capabilities:
    """One drafter method's declared capabilities (:func:`capabilities_of`)."""

    kind: str
    """The method's registered kind (``backbone``, ``domino``, ..; a stub's class name)."""
    tree_builders: tuple[str, ...] = ()
    """Tree builders its sessions serve (:data:`lit_domino.decoding.tree.BUILDERS`; none: chain rounds only)."""
    path_head: bool = False
    """Its session's ``draft_hidden(anchor, n)`` and ``path_head(hidden, anchor)``: a causal head run over a tree's
    frontier (Domino, DSpark, DFlash 2; the ``path`` builder)."""
    tree_head: bool = False
    """Its session's ``tree_head(anchor, depth)``: its own steps over a tree (EAGLE-3; the ``eagle`` builder)."""
    block_hidden: bool = False
    """Its sessions keep each stage's block hidden states (``session.stages[-1].hidden``): what an acceptance
    predictor reads (the parallel drafters)."""
    confidence_head: bool = False
    """Its own confidence head: ``own_confidence_logits(H, prev)`` (DSpark with its head configured)."""
    confidence_table: bool = False
    """Its confidence head written as ``w_H · H_j + t[x_{j-1}]``: ``own_confidence_table()`` (DSpark's)."""
    causal_state: int | None = None
    """d_s of its causal state over a stage's previous tokens, ``causal_states(prev)`` (Domino's GRU); None."""
    pool: bool = False
    """Its head corrects its base logits on a candidate pool: the ``pool_size`` draft option (Domino, DSpark)."""
    static_block: bool = False
    """Its fixed-shape block forward over static K/V buffers: the ``static_capacity`` draft option."""
    compile: bool = False
    """Its block forward (and head) under ``torch.compile``: the ``compile`` draft option."""
    loop_training: bool = False
    """DLoop's loop-aware training applies (``loop_forward`` and ``block_loss``)."""


@runtime_checkable
class Declares(Protocol):
    """A drafter that declares its capabilities (every :class:`~lit_domino.models.base.Drafter`)."""

    def capabilities(self) -> Capabilities:
        """Its :class:`Capabilities` record."""


def capabilities_of(drafter) -> Capabilities:
    """``drafter``'s declared capabilities (:class:`Capabilities`); an object that declares none (a test's stub)
    drafts chains and nothing more."""
    if isinstance(drafter, Declares):
        return drafter.capabilities()
    return Capabilities(kind=type(drafter).__name__)


def require(drafter, capability: str, why: str) -> Capabilities:
    """``drafter``'s capabilities, or :class:`MissingCapability` naming ``capability``, the drafter's kind and
    ``why`` (the setting that needs it)."""
    caps = capabilities_of(drafter)
    if not getattr(caps, capability):
        raise MissingCapability(f"{why} needs the {capability!r} capability, which a {caps.kind} drafter does not "
                                f"declare (lit_domino.models.capabilities)")
    return caps
