"""Acceptance predictors: a calibrated probability c_j that the target accepts drafted position j.

A predictor reads, for each drafted position j of a parallel drafter's stage, the block's hidden state H_j (the
session's ``stages[-1].hidden[j]``) and the token before j (the stage's anchor for j = 1, else d_{j-1}), never
d_j itself: a gate that cuts at j then decides from the tokens before j only, which keeps decoding exact.

* **own head** (DSpark): the drafter's confidence head, ``drafter.own_confidence_logits(H, prev)``, the method
  interface a drafter with a head of its own implements (None: it has none);
* **add-on head** (:class:`~lit_domino.decoding.acceptance_head.AcceptanceHead`, with what it reads of a drafter:
  :mod:`lit_domino.decoding.acceptance_head`), trained on the frozen drafter (:mod:`lit_domino.training.acceptance`).

Its raw logits z_j become probabilities through a per-position calibration (:class:`Calibration`,
:mod:`lit_domino.decoding.acceptance_calibration`: c_j, the survival S_j and the stage maps DLoop's gates read).

A predictor is passed to ``generate`` (``predictor=``; None: the drafter's own head's, :func:`predictor_of`), never
kept on the drafter, checked against it there (:func:`check_predictor`), and saved as its own artifact
(:meth:`AcceptancePredictor.save`, :func:`load_predictor`), keyed by the drafter's weights (:func:`drafter_key`).
This module is where the predictor's names are imported from (the head's and the calibration's included).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from lit_domino.decoding.acceptance_calibration import Calibration
from lit_domino.decoding.acceptance_head import (INPUTS, LABELS, AcceptanceHead, NoAcceptancePredictor,
                                                 causal_state_size, drafter_key, input_width, require_causal_state,
                                                 stage_inputs, supports_predictor)
from lit_domino.models.capabilities import capabilities_of
from lit_domino.models.layers import memo_on_weights

__all__ = ["HEAD_FILE", "INPUTS", "LABELS", "PREDICTOR_FILE", "AcceptanceHead", "AcceptancePredictor", "Calibration",
           "NoAcceptancePredictor", "causal_state_size", "check_predictor", "drafter_key", "input_width",
           "load_predictor", "own_predictor", "predictor_of", "require_causal_state", "require_predictor",
           "stage_inputs", "supports_predictor"]
"""The predictor's public surface (the head's and the calibration's names are defined in their own modules)."""

PREDICTOR_FILE = "acceptance.json"
HEAD_FILE = "head.safetensors"


@dataclass
class AcceptancePredictor:
    """A drafter's acceptance predictor: its own head or an add-on one, and a calibration."""

    drafter_key: str
    """:func:`drafter_key` of the drafter it was built for (checked by :func:`check_predictor`); "" for the drafter's
    own head read uncalibrated (:func:`own_predictor`), which fits any drafter with a head of its own."""
    head: AcceptanceHead | None = None
    """The add-on head; None = the drafter's own (``own_confidence_logits``)."""
    calibration: Calibration | None = None
    """None: uncalibrated (τ = 1; the ``cost`` gate needs a calibration's mean confidences)."""
    meta: dict = field(default_factory=dict)
    """How it was built (labels, steps, data sizes, held-out metrics): for tables and the artifact's JSON."""

    def logits(self, drafter, H: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Raw confidence logits z [..., K] (float32) of positions with hidden states H and previous tokens prev."""
        if self.head is None:
            z = drafter.own_confidence_logits(H, prev)
            if z is None:
                raise NoAcceptancePredictor(f"the {drafter.kind} drafter has no confidence head of its own")
            return z.float()
        if self.head.proj.weight.device != H.device:
            self.head.to(H.device)
        return self.head(self.head.inputs(drafter, H, prev))

    @torch.no_grad()
    def confidences(self, drafter, hidden, anchor, tokens, offset: int = 0) -> torch.Tensor:
        """Calibrated c_j [K] (CPU float32) of one stage at round positions offset+1 .. offset+K."""
        H, prev = stage_inputs(hidden, anchor, tokens)
        fused = self._fused(drafter, H.device)
        if fused is not None:  # the head's equation with its token part looked up: two ops instead of six
            w_h, by_token = fused
            z = torch.addmv(by_token.index_select(0, prev), H.float(), w_h).cpu()
        else:
            z = self.logits(drafter, H, prev).reshape(-1).float().cpu()
        if self.calibration is not None:
            z = self.calibration.apply(z, offset)
        return torch.sigmoid(z)

    def survival_reader(self, drafter) -> Callable[..., list[float]]:
        """``read(hidden, anchor, tokens, offset=0, product=1.0)``: the running product ``product · c_1 ··· c_j`` of
        the calibrated confidences at each of a stage's positions (what :meth:`confidences` gives, cumulated), as
        Python floats: what a gate reads at every round (:meth:`Calibration.survivals` maps it to the survival). For a
        fused head (:meth:`_fused`) one matrix-vector product is the only tensor work and the calibration runs on
        floats: a fraction of what :meth:`confidences` and a cumulative product cost (paid by the cost gate every
        round, even where it opens nothing; docs/results.md). Built for one decode: it holds the
        head's tables as they are now."""
        device = next(drafter.parameters()).device
        fused = self._fused(drafter, device)
        if fused is None:  # a head that reads more than H_j and the previous token (Domino's GRU state)
            def read(hidden, anchor, tokens, offset: int = 0, product: float = 1.0) -> list[float]:
                return (product * torch.cumprod(self.confidences(drafter, hidden, anchor, tokens, offset), 0)).tolist()
            return read
        w_h, table = fused[0], fused[1].tolist()
        cal = self.calibration
        inv_t = [1.0 / t for t in cal.temperatures] if cal is not None else [1.0]
        offs = (cal.offsets or [0.0] * len(inv_t)) if cal is not None else [0.0]
        last = len(inv_t) - 1  # positions beyond the calibrated ones use the last position's map (as Calibration.at)

        def read(hidden, anchor, tokens, offset: int = 0, product: float = 1.0) -> list[float]:
            K = tokens.numel()
            with torch.no_grad():
                zh = torch.mv(hidden[1: K + 1].float(), w_h).tolist()  # w_H · H_j
            prev = [int(anchor.reshape(-1)[0])] + tokens.reshape(-1)[:-1].tolist()
            out = []
            for j in range(K):
                i = min(offset + j, last)
                x = (zh[j] + table[prev[j]]) * inv_t[i] + offs[i]  # calibrated logit z_j / τ_j + b_j
                product *= 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
                out.append(product)
            return out

        return read

    def _fused(self, drafter, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The head as ``w_H · H_j + t[x_{j-1}]`` (float32): the add-on head on ``[H_j ; E[x_{j-1}]]`` with
        ``t = w_E · E + b`` over every token, or a drafter's own head that can be written so
        (``own_confidence_table``: DSpark's); built once per weights (a gate reads the head at every stage). None
        for a head that reads more (Domino's GRU state)."""
        if self.head is None:  # the drafter's own head keeps its own table
            return drafter.own_confidence_table() if capabilities_of(drafter).confidence_table else None
        if self.head.input_kind != "hidden":
            return None
        proj, embed = self.head.proj, drafter.embed.weight

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            w = proj.weight[0].detach().float().to(device)
            d = self.head.hidden_size
            ids = torch.arange(embed.shape[0], device=device)
            by_token = torch.cat([drafter.embed_tokens(c).float() @ w[d:] for c in ids.split(16384)])  # in chunks
            return w[:d].contiguous(), (by_token + proj.bias.detach().float().to(device)).contiguous()

        return memo_on_weights(self, "_fused_head", (embed, proj.weight, proj.bias), build, (str(device),))

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        info = {"format": 1, "drafter_key": self.drafter_key, "kind": "own" if self.head is None else "addon",
                "calibration": None if self.calibration is None else self.calibration.to_dict(), "meta": self.meta}
        if self.head is not None:
            info["head"] = {"hidden_size": self.head.hidden_size, "embed_size": self.head.embed_size,
                            "inputs": self.head.input_kind}
            save_file({k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()},
                      str(directory / HEAD_FILE))
        (directory / PREDICTOR_FILE).write_text(json.dumps(info, indent=1, sort_keys=True))
        return directory


def load_predictor(directory: str | Path) -> AcceptancePredictor:
    """A predictor saved by :meth:`AcceptancePredictor.save` (clear errors for a missing or corrupt one)."""
    directory = Path(directory)
    path = directory / PREDICTOR_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no acceptance predictor ({PREDICTOR_FILE} is missing)")
    try:
        info = json.loads(path.read_text())
        head = None
        if info["kind"] == "addon":
            head = AcceptanceHead(info["head"]["hidden_size"], info["head"]["embed_size"],
                                  info["head"].get("inputs", "hidden"))  # predictors saved before "gru": hidden
            head.load_state_dict(load_file(str(directory / HEAD_FILE)))
        cal = info.get("calibration")
        return AcceptancePredictor(info["drafter_key"], head, None if cal is None else Calibration(**cal),
                                   dict(info.get("meta") or {}))
    except (KeyError, TypeError, ValueError, RuntimeError, OSError) as err:
        raise ValueError(f"the acceptance predictor in {directory} cannot be read ({type(err).__name__}: {err}); "
                         "delete it to rebuild") from err


# --------------------------------------------------------------------------- the predictor a decode reads


def check_predictor(drafter, predictor: AcceptancePredictor) -> AcceptancePredictor:
    """``predictor`` if ``drafter`` can read it, else :class:`NoAcceptancePredictor` (one line): one built for
    another drafter (its :attr:`~AcceptancePredictor.drafter_key`), the drafter's own head on one without such a
    head, an add-on head on a drafter without block hidden states, or a head on Domino's GRU state on one whose
    state is missing or of another width. ``generate`` checks a predictor it is given so, before decoding."""
    kind = capabilities_of(drafter).kind
    generic = predictor.drafter_key == "" and predictor.head is None and predictor.calibration is None
    if not generic and predictor.drafter_key != drafter_key(drafter):
        raise NoAcceptancePredictor(
            f"this acceptance predictor was built for another drafter (key {predictor.drafter_key or 'none'}, this "
            f"{kind} drafter's is {drafter_key(drafter)}): retrain it on this drafter")
    if predictor.head is None:
        if not capabilities_of(drafter).confidence_head:
            raise NoAcceptancePredictor(f"this acceptance predictor reads the drafter's own confidence head, and the "
                                        f"{kind} drafter has none")
        return predictor
    if not supports_predictor(drafter):
        raise NoAcceptancePredictor(f"an add-on acceptance head needs a parallel drafter's block hidden states; "
                                    f"the {kind} drafter drafts token by token")
    if "gru" in predictor.head.input_kind:
        require_causal_state(drafter, "this acceptance predictor")
        width = input_width(drafter, predictor.head.input_kind)
        if width != predictor.head.embed_size:
            raise NoAcceptancePredictor(f"this acceptance predictor (inputs {predictor.head.input_kind!r}) reads "
                                        f"{predictor.head.embed_size} features besides H_j, the {kind} "
                                        f"drafter has {width}")
    return predictor


def own_predictor(drafter) -> AcceptancePredictor | None:
    """An uncalibrated predictor from the drafter's own head (DSpark), None when it has none. Its key is empty:
    nothing in it is fitted to one drafter (:func:`check_predictor` lets it read any drafter with a head of its own)."""
    if not capabilities_of(drafter).confidence_head:
        return None
    return AcceptancePredictor(drafter_key="", head=None, calibration=None, meta={"source": "own head"})


def predictor_of(drafter, predictor: AcceptancePredictor | None = None) -> AcceptancePredictor | None:
    """The predictor a gate reads on ``drafter``: ``predictor`` when one is given, else the drafter's own head's
    (uncalibrated, :func:`own_predictor`), else None (as ``generate(predictor=None)``)."""
    if drafter is None:
        return None
    return predictor if predictor is not None else own_predictor(drafter)


def require_predictor(drafter, predictor: AcceptancePredictor | None, why: str,
                      calibrated: bool = False) -> AcceptancePredictor:
    """The predictor a gate needs (``why`` names the gate; ``predictor`` the one given, None: the drafter's own
    head's, :func:`predictor_of`), or :class:`NoAcceptancePredictor` before decoding."""
    pred = predictor_of(drafter, predictor)
    kind = capabilities_of(drafter).kind
    if pred is None:
        raise NoAcceptancePredictor(
            f"{why} needs acceptance probabilities, and this {kind} drafter has no confidence head: train an add-on "
            "head on it (lit_domino.training.acceptance.acceptance_predictor) and pass it (generate's predictor=), "
            "or use a log-probability gate (sum, mean, scaled, last)")
    if pred.head is None and not supports_predictor(drafter):
        raise NoAcceptancePredictor(f"{why}: the {kind} drafter's sessions keep no block hidden states")
    if calibrated and pred.calibration is None:
        raise NoAcceptancePredictor(
            f"{why} needs a calibrated predictor (its per-position mean confidence forecasts the next stage); this "
            f"{kind} drafter's is uncalibrated: build a calibrated one (lit_domino.training.acceptance.acceptance_predictor)")
    return pred
