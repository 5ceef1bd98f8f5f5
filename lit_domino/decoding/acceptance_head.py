"""The add-on acceptance head, and what an acceptance predictor (:mod:`lit_domino.decoding.acceptance`) reads of a
drafter: a stage's inputs, the drafter's causal state, whether its sessions keep block hidden states, and its key.

Shapes: K drafted positions of a stage, d width.

The add-on head (:class:`AcceptanceHead`; backbone-only, Domino, any drafter whose session keeps the stage's block
hidden states, DFlash 2 included) reads, for each drafted position j, the block's hidden state H_j (the session's
``stages[-1].hidden[j]``) and the token before j (the stage's anchor for j = 1, else d_{j-1}), never d_j itself:
``z_j = w · [H_j ; E[x_{j-1}]] + b`` with E the target's frozen embedding (inputs ``hidden``), or
``z_j = w · [H_j ; S_{j-1}] + b`` with S_{j-1} Domino's GRU state after the stage's anchor and d_1 .. d_{j-1}
(inputs ``gru``: what Domino's own correction reads, a drafter with a causal state only), or on both
(``hidden+gru``: ``[H_j ; E[x_{j-1}] ; S_{j-1}]``), trained on the frozen drafter
(:mod:`lit_domino.training.acceptance`).
"""

from __future__ import annotations

import hashlib
import json

import torch
from torch import nn

from lit_domino.models.capabilities import capabilities_of
from lit_domino.models.layers import memo_on_weights
from lit_domino.runtime.command import UsageError

INPUTS = ("hidden", "gru", "hidden+gru")
"""What the add-on head reads besides H_j: ``hidden`` the previous token's embedding E[x_{j-1}], ``gru`` the
drafter's causal state over the stage's previous tokens (Domino's GRU state S_{j-1}), ``hidden+gru`` both."""
LABELS = ("soft", "hard")
"""Training labels: ``soft`` c*_j = 1 - ½‖q_j - p_j‖₁ (the acceptance probability at T > 0), ``hard`` 1 when the
drafter's pick equals the target's (T = 0)."""


class NoAcceptancePredictor(UsageError):
    """A gate that needs acceptance probabilities, on a drafter without a predictor (or one for another drafter)."""


# --------------------------------------------------------------------------- the drafter's key


def drafter_key(drafter) -> str:
    """A SHA-256 (16 hex digits) of the drafter's kind, config and own weights: a predictor, a cost model or a
    calibration built for one drafter is never applied to another (retrained, fine-tuned) one. Memoised on the
    drafter until its config or a weight changes (an optimizer step or a load bumps a tensor's version): the cost
    gate asks for it at every ``generate`` call."""
    cfg = json.dumps(drafter.config.to_dict(), sort_keys=True, default=str)
    tensors = [*drafter.named_parameters(), *drafter.named_buffers()]  # the live tensors (state_dict detaches)

    def build() -> str:
        h = hashlib.sha256(cfg.encode())
        for name, t in sorted(drafter.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return h.hexdigest()[:16]

    return memo_on_weights(drafter, "_drafter_key", [t for _, t in tensors], build,
                           (cfg, tuple(name for name, _ in tensors)))


def stage_inputs(hidden: torch.Tensor, anchor: torch.Tensor, tokens: torch.Tensor):
    """A stage's predictor inputs: block hidden states ``hidden`` [K+1, d] (slot 0 = the anchor's), the anchor
    [1] and the drafted tokens [K] -> (H [K, d] of slots 1..K, previous tokens [K] = [anchor, d_1 .. d_{K-1}])."""
    K = tokens.numel()
    prev = torch.cat([anchor.reshape(1).to(tokens.device), tokens.reshape(-1)[:-1]])
    return hidden[1: K + 1], prev


def causal_state_size(drafter) -> int | None:
    """The width of ``drafter``'s causal state over a stage's previous tokens (Domino's GRU: d_s), None without one
    (the method interface: ``causal_state_size`` and ``causal_states(prev)``)."""
    return capabilities_of(drafter).causal_state


def require_causal_state(drafter, why: str) -> int:
    """:func:`causal_state_size`, or :class:`NoAcceptancePredictor` naming ``why`` for a drafter without one."""
    size = causal_state_size(drafter)
    if size is None:
        kind = capabilities_of(drafter).kind
        raise NoAcceptancePredictor(f"{why}: inputs 'gru' read Domino's GRU state, and the {kind} drafter has no "
                                    "causal state (use inputs 'hidden')")
    return size


def input_width(drafter, inputs: str) -> int:
    """The width of what the add-on head reads besides H_j for ``inputs`` (:data:`INPUTS`) on ``drafter``:
    d_e for the embedding, + d_s for the GRU state (refused for a drafter without one)."""
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS}, got {inputs!r}")
    width = int(drafter.embed.weight.shape[1]) if inputs != "gru" else 0
    if "gru" in inputs:
        width += require_causal_state(drafter, f"inputs {inputs!r}")
    return width


def supports_predictor(drafter) -> bool:
    """Whether ``drafter``'s sessions keep each stage's block hidden states (the parallel drafters)."""
    return capabilities_of(drafter).block_hidden


# --------------------------------------------------------------------------- heads


class AcceptanceHead(nn.Module):
    """The add-on confidence head: one linear layer on ``[H_j ; E[x_{j-1}]]`` (inputs ``hidden``) or
    ``[H_j ; S_{j-1}]`` (inputs ``gru``) or ``[H_j ; E[x_{j-1}] ; S_{j-1}]`` (``hidden+gru``) -> a logit.
    ``embed_size``: the width besides H_j (:func:`input_width`: d_e, d_s or d_e + d_s)."""

    def __init__(self, hidden_size: int, embed_size: int, inputs: str = "hidden"):
        super().__init__()
        if inputs not in INPUTS:
            raise ValueError(f"inputs must be one of {INPUTS}, got {inputs!r}")
        self.hidden_size, self.embed_size, self.input_kind = int(hidden_size), int(embed_size), inputs
        self.proj = nn.Linear(self.hidden_size + self.embed_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def inputs(self, drafter, H: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """[..., P, d] hidden states and [..., P] previous tokens -> [..., P, d + embed_size] (float32). With the
        GRU state, P spans whole stages of K = block_size - 1 positions (a round's, concatenated) and the state
        restarts at each stage's anchor, as a session's stage does."""
        parts = [H.float()]
        if self.input_kind != "gru":
            parts.append(drafter.embed_tokens(prev).float())
        if "gru" in self.input_kind:
            require_causal_state(drafter, "the add-on acceptance head")
            K = drafter.config.block_size - 1
            parts.append(torch.cat([drafter.causal_states(c) for c in prev.split(K, dim=-1)], dim=-2).float())
        return torch.cat(parts, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.to(self.proj.weight.dtype)).squeeze(-1)

