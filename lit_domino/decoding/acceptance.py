"""Acceptance predictors: a calibrated probability c_j that the target accepts drafted position j.

Shapes: K drafted positions of a stage, d width.

A predictor reads, for each drafted position j of a parallel drafter's stage, the block's hidden state H_j (the
session's ``stages[-1].hidden[j]``) and the token before j (the stage's anchor for j = 1, else d_{j-1}), never
d_j itself: a gate that cuts at j then decides from the tokens before j only, which keeps decoding exact.

* **own head** (DSpark): the drafter's confidence head, ``drafter.own_confidence_logits(H, prev)``, the method
  interface a drafter with a head of its own implements (None: it has none);
* **add-on head** (:class:`AcceptanceHead`; backbone-only, Domino, any drafter whose session keeps the stage's
  block hidden states, DFlash 2 included): ``z_j = w · [H_j ; E[x_{j-1}]] + b`` with E the target's frozen
  embedding (inputs ``hidden``), or ``z_j = w · [H_j ; S_{j-1}] + b`` with S_{j-1} Domino's GRU state after the
  stage's anchor and d_1 .. d_{j-1} (inputs ``gru``: what Domino's own correction reads, a drafter with a causal
  state only), or on both (``hidden+gru``: ``[H_j ; E[x_{j-1}] ; S_{j-1}]``), trained on the frozen drafter
  (:mod:`lit_domino.training.acceptance`).

Calibration (:class:`Calibration`): per round position j (stages concatenated), a temperature τ_j and an offset
b_j (Platt; none for a temperatures-only calibration), so that ``c_j = sigmoid(z_j / τ_j + b_j)`` is the acceptance
probability of position j *given* that 1..j-1 were accepted;
fitted sequentially on held-out rounds (position j on the rounds that survived to j). The survival S_j, the
probability that the first j drafts survive, is the product ``c_1 ··· c_j`` read through a per-position isotonic
map fitted on the same rounds (:attr:`Calibration.survival_maps`: the c_j's errors add up along a round).
``mean_confidence[j]`` (the mean calibrated c_j on the held-out rounds that reached j) is the cost gate's forecast
of a stage not drafted yet.

A predictor is passed to ``generate`` (``predictor=``; None: the drafter's own head's, :func:`predictor_of`), never
kept on the drafter, checked against it there (:func:`check_predictor`), and saved as its own artifact
(:meth:`AcceptancePredictor.save`, :func:`load_predictor`), keyed by the drafter's weights (:func:`drafter_key`).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from lit_domino.models.capabilities import capabilities_of
from lit_domino.models.layers import memo_on_weights
from lit_domino.runtime.command import UsageError

PREDICTOR_FILE = "acceptance.json"
INPUTS = ("hidden", "gru", "hidden+gru")
"""What the add-on head reads besides H_j: ``hidden`` the previous token's embedding E[x_{j-1}], ``gru`` the
drafter's causal state over the stage's previous tokens (Domino's GRU state S_{j-1}), ``hidden+gru`` both."""
HEAD_FILE = "head.safetensors"
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


# --------------------------------------------------------------------------- calibration


def _monotone_knots(knots) -> bool:
    """Whether ``knots`` is a map :func:`_interp` reads: ``[[x ..], [y ..]]`` of equal, non-zero length, finite,
    both non-decreasing."""
    return (len(knots) == 2 and len(knots[0]) == len(knots[1]) and bool(knots[0])
            and all(math.isfinite(v) for v in (*knots[0], *knots[1]))
            and list(knots[0]) == sorted(knots[0]) and list(knots[1]) == sorted(knots[1]))


def _interp(x: float, knots: list[list[float]]) -> float:
    """A map given by knots ``[[x ..], [y ..]]`` at ``x``: linear between them, flat beyond them."""
    xs, ys = knots
    if x <= xs[0]:
        return ys[0]
    j = bisect.bisect_right(xs, x)
    if j >= len(xs):
        return ys[-1]
    span = xs[j] - xs[j - 1]
    return ys[j] if span <= 0 else ys[j - 1] + (ys[j] - ys[j - 1]) * (x - xs[j - 1]) / span


@dataclass
class Calibration:
    """Per round position temperatures and the held-out mean calibrated confidence (see the module docstring), and
    the stage-level quantities DLoop's gates decide on (:meth:`whole_stage`, :meth:`next_gain`)."""

    temperatures: list[float]
    """τ_j for round positions j = 1, 2, ... (stages concatenated); later positions reuse the last one."""
    mean_confidence: list[float]
    """Mean calibrated c_j on the held-out rounds that reached j (the cost gate's forecast of a stage when
    :attr:`stage_gain` is not known)."""
    label: str = "hard"
    """What the survival was fitted to: ``hard`` acceptance events (T = 0) or ``soft`` c* (T > 0)."""
    offsets: list[float] | None = None
    """Per position offsets b_j (``c_j = sigmoid(z_j / τ_j + b_j)``, Platt scaling); None: temperature scaling only.
    A head trained on every position of a round learns one bias for all of them, and a temperature alone cannot
    move a position's mean (smoke backbone, j = 1: ECE 10.4 % before, 12.5 % after temperature scaling)."""
    stage_whole: list[list[float]] | None = None
    """``[[S_1 .. S_n], [P_1 .. P_n]]``: the probability that every draft of the round so far is accepted, as a
    non-decreasing map of the product S of their calibrated c_j at a stage boundary (isotonic regression on the
    held-out rounds, linear between its knots, flat beyond them); None: S itself. Each c_j is calibrated on the
    rounds that reached j, but their product is not where a gate decides: on the default DSpark drafter, held-out
    rounds a Platt map of S gave 0.3-0.5 were accepted whole in 14 % of cases (the rounds' S is bimodal, and a
    logistic curve fitted mostly to the many hopeless rounds misses the few between)."""
    stage_gain: list[list[float]] | None = None
    """``[[S_1 .. S_n], [G_1 .. G_n]]``: the drafts another stage of :attr:`stage_tokens` is expected to have
    accepted given the round's S at a stage boundary (0 when a draft so far fails), fitted alike; None: S times the
    product of the mean confidences (optimistic: on the default drafters a whole stage's next stage yielded 4.4 drafts
    where S was middling, 7 where it was high)."""
    stage_tokens: int | None = None
    """The drafts of a stage the stage maps were fitted on (a shorter stage's gain is scaled down)."""
    survival_maps: list[list[list[float]]] | None = None
    """Per round position j, ``[[R ..], [S ..]]``: the probability that drafts 1..j all survive as a non-decreasing
    map of the product R_j = c_1 ··· c_j of the calibrated confidences (isotonic regression on every held-out round,
    linear between its knots, flat beyond them; later positions use the last map), the survival kept
    non-increasing along the round (:meth:`survivals`); None: S_j = R_j. Each c_j is calibrated on the rounds that
    reached j, yet their product need not be: on the default DSpark drafter's own head the c_j's errors add up
    along a round (held-out survival ECE 4.2 % for a c_j ECE of 3.0 %). The stage maps are fitted on this S."""

    def __post_init__(self):
        if not self.temperatures or any(not (math.isfinite(t) and t > 0) for t in self.temperatures):
            raise ValueError(f"calibration temperatures must be finite and > 0, got {self.temperatures}")
        if len(self.mean_confidence) != len(self.temperatures):
            raise ValueError("calibration: one mean confidence per temperature")
        if self.offsets is not None and (len(self.offsets) != len(self.temperatures)
                                         or not all(math.isfinite(b) for b in self.offsets)):
            raise ValueError("calibration: one finite offset per temperature")
        for name in ("stage_whole", "stage_gain"):
            knots = getattr(self, name)
            if knots is not None and not _monotone_knots(knots):
                raise ValueError(f"calibration: {name} must be [[S ..], [value ..]], both non-decreasing and finite, "
                                 f"got {knots}")
        if self.survival_maps is not None:
            if not self.survival_maps:
                raise ValueError("calibration: survival_maps must hold one map per position, got none")
            for j, knots in enumerate(self.survival_maps):
                if not _monotone_knots(knots):
                    raise ValueError(f"calibration: survival_maps[{j}] must be [[R ..], [S ..]], both non-decreasing "
                                     f"and finite, got {knots}")
        if (self.stage_whole is not None or self.stage_gain is not None) and not self.stage_tokens:
            raise ValueError("calibration: stage maps need stage_tokens (the drafts of the stages they were fitted on)")
        self._vectors: dict[str, torch.Tensor] = {}

    def apply(self, z: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Calibrated logits of raw logits z [..., n] at round positions start+1 .. start+n."""
        n = z.shape[-1]
        out = z / self.at(self.temperatures, start, n).to(z.device, z.dtype)
        if self.offsets is not None:
            out = out + self.at(self.offsets, start, n).to(z.device, z.dtype)
        return out

    def at(self, values: list[float], start: int, n: int) -> torch.Tensor:
        """``values`` at round positions start+1 .. start+n (0-based offsets start..; the last one repeats), from a
        float32 vector built once per list (a gate asks at every stage)."""
        key = next((k for k in ("temperatures", "offsets", "mean_confidence") if values is getattr(self, k)), None)
        vec = self._vectors.get(key) if key else None
        if vec is None or vec.numel() < start + n:
            length = max(start + n, len(values), 64)
            vec = torch.tensor([values[min(i, len(values) - 1)] for i in range(length)], dtype=torch.float32)
            if key:
                self._vectors[key] = vec
        return vec[start: start + n]

    def survivals(self, products: list[float], start: int = 0, before: float = 1.0) -> list[float]:
        """The survival S_j at round positions start+1 .. start+n from the products R_j of the calibrated c_j there
        (:attr:`survival_maps`), non-increasing from ``before`` (the survival at position ``start``)."""
        maps = self.survival_maps
        if maps is None:
            return list(products)
        out, last = [], len(maps) - 1
        for j, r in enumerate(products):
            before = min(before, _interp(r, maps[min(start + j, last)]))
            out.append(before)
        return out

    def survival(self, products: torch.Tensor) -> torch.Tensor:
        """:meth:`survivals` of whole rounds: products R [n, P] (round positions 1..P) -> S [n, P]."""
        if self.survival_maps is None:
            return products
        return torch.tensor([self.survivals(row) for row in products.tolist()], dtype=products.dtype).reshape(
            products.shape)

    def whole_stage(self, survival: float) -> float:
        """The probability that every draft of the round so far is accepted, from their survival S
        (:meth:`survivals`; :attr:`stage_whole`, ``survival`` itself without it)."""
        if self.stage_whole is None:
            return min(max(survival, 0.0), 1.0)
        return _interp(survival, self.stage_whole)

    def next_gain(self, survival: float, drafted: int, room: int) -> float:
        """The drafts another stage of ``room`` drafts, after ``drafted`` drafts whose survival product is ``survival``,
        is expected to have accepted (:attr:`stage_gain`, scaled down by the mean confidences' shape for a stage
        shorter than the fitted one; without it: survival times the product of the mean confidences)."""
        if self.stage_gain is not None and room >= self.stage_tokens:
            return _interp(survival, self.stage_gain)
        forecast = float(torch.cumprod(self.at(self.mean_confidence, drafted, room), 0).sum())
        if self.stage_gain is None:
            return survival * forecast
        whole = float(torch.cumprod(self.at(self.mean_confidence, drafted, self.stage_tokens), 0).sum())
        return _interp(survival, self.stage_gain) * forecast / whole if whole > 0 else 0.0

    def best_gain(self, drafted: int, room: int) -> float:
        """The most :meth:`next_gain` can be for any survival (at survival 1: the maps are non-decreasing)."""
        return self.next_gain(1.0, drafted, room)

    def to_dict(self) -> dict:
        """The fields (what a saved predictor's JSON holds)."""
        return {k: getattr(self, k) for k in ("temperatures", "mean_confidence", "label", "offsets", "stage_whole",
                                              "stage_gain", "stage_tokens", "survival_maps")}


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
        floats: ~23 µs against ~80 µs for :meth:`confidences` and a cumulative product (about 0.6 % of a
        default-preset round, paid by the cost gate even where it opens nothing). Built for one decode: it holds the
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
