"""Training and calibrating acceptance predictors (:mod:`lit_domino.decoding.acceptance`) on a frozen drafter.

1. **Rounds** (:func:`collect_rounds`): on the target's own continuations of prompts (regenerated data), at
   anchors along each sequence, the drafter drafts a round exactly as it decodes (its session, its options,
   ``stages`` stages, the later ones on its own hidden states) and one target forward over the drafts gives the
   target's distribution p_j at every drafted position j (conditioned on the drafts before j, as the verify step
   sees it). Per position: the predictor's inputs (H_j, the previous token), the soft label
   ``c*_j = 1 - ½‖q_j - p_j‖₁`` and the hard one, "the draft's pick is the target's".
2. **Head** (:func:`train_head`): the add-on linear head, BCE on the soft (or hard) labels, a short fine-tune
   (full-batch Adam on the collected rows; the drafter stays frozen, so its hidden states are computed once), on
   the rows a round reached (weights ``Π_{i<j} y_i``, as the calibration's: the head learns c_j given 1..j-1
   accepted, not on positions after a rejection, whose prefix is wrong).
3. **Calibration** (:func:`fit_calibration`): per round position a temperature and an offset (Platt;
   temperatures alone with ``offsets=False``), fitted sequentially on held-out rounds: position j on the rounds
   whose drafts 1..j-1 survived (weights ``Π_{i<j} y_i``: these weighted losses summed are the survival model's
   likelihood); then per position an isotonic map of the product of the calibrated confidences to the survival
   (:func:`fit_survival`: a round's c_j's errors add up in their product). :func:`calibration_report` gives AUC and
   ECE before and after per position (and of the survival S_j itself), :func:`reliability_figure` the diagram.

:func:`acceptance_predictor` runs it end to end, cached as its own artifact (``acceptance/``) keyed by the
drafter's weights (:func:`~lit_domino.decoding.acceptance.drafter_key`), the target and the settings.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from lit_domino.runtime import cache
from lit_domino.decoding.acceptance import (INPUTS, LABELS, AcceptanceHead, AcceptancePredictor, Calibration,
                                           NoAcceptancePredictor, drafter_key, input_width, load_predictor,
                                           own_predictor, require_causal_state, stage_inputs, supports_predictor)


ANCHORS = ("decode", "even")
"""Where :func:`collect_rounds` starts its rounds (:attr:`AcceptanceSettings.anchors`)."""
HEAD_ROWS = ("reached", "all")
"""Which rows of the collected rounds the add-on head trains on (:attr:`AcceptanceSettings.head_rows`)."""


@dataclass(frozen=True)
class AcceptanceSettings:
    """How a predictor is built (its artifact's key, with the drafter's and the target's)."""

    label: str | None = None
    """Training label: ``soft`` c* = 1 - TV(q, p) (the acceptance probability when sampling) or ``hard`` (the
    draft's pick is the target's: acceptance at T = 0). None: ``hard`` for greedy collection (``temperature`` 0),
    else ``soft``. On the smoke drafters at T = 0 the soft label (taken at T = 1) predicted greedy acceptance
    barely better than chance (AUC 0.46-0.51 for backbone and Domino), the hard one well (AUC 0.91-0.93)."""
    calibration_label: str | None = None
    """What the calibration makes the survival match: ``hard`` acceptance events (decoding at T = 0) or ``soft``
    c* (sampling at the collection's temperature). None: as ``label``'s default."""
    inputs: str = "hidden"
    """What the add-on head reads besides H_j (:data:`~lit_domino.decoding.acceptance.INPUTS`): ``hidden`` the
    previous token's embedding, ``gru`` Domino's GRU state (a drafter without a causal state is refused),
    ``hidden+gru`` both."""
    own_head: bool = True
    """A drafter with a confidence head of its own (DSpark) uses it (only calibrated); False trains the add-on
    head on it too (for comparison)."""
    head_rows: str = "reached"
    """The rows the add-on head trains on: ``reached``, each round's positions whose drafts before them were accepted
    (weights ``Π_{i<j} y_i`` of the calibration label, the rows the calibration fits and a gate decides on: c_j is
    the acceptance probability *given* 1..j-1 accepted), or ``all`` (every position of every round, the default
    before 2026-12-04 night: most rows lie after a rejection, where H_j and the target both read a wrong prefix).
    On the smoke drafters ``reached`` raised the test AUC from 0.93-0.94 to 0.96 and took the survival ECE after
    calibration from 2.5-2.6 % to 1.4-1.8 % (backbone, Domino)."""
    offsets: bool = True
    """Calibrate with per-position offsets too (Platt scaling, :class:`Calibration`'s ``offsets``: the head reads
    no position, and a temperature cannot move a position's mean); False: the temperatures alone (DSpark's, the
    default before 2026-12-04 night). With heads on the reached rows, on the smoke drafters' test split, offsets
    took the survival ECE from 2.0 / 1.9 / 2.7 / 1.2 % to 1.5 / 1.6 / 2.5 / 0.6 % (backbone, Domino, DSpark's
    add-on head, DFlash 2; DSpark's own head 2.7 → 2.8 %)."""
    stage_fit: bool = True
    """Also fit the stage-level maps DLoop's gates decide on (:attr:`~lit_domino.decoding.acceptance.Calibration.
    stage_whole`, P(every draft so far accepted | S) at stage boundaries, and :attr:`~lit_domino.decoding.acceptance.
    Calibration.stage_gain`, the drafts a further stage is expected to add given S) on the calibration split; needs
    ``stages`` >= 2. False: the gates read S and the mean confidences (before 2026-12-05: on the default drafters the
    cost gate then opened a second stage in ~40 % of rounds and lost 3-6 %)."""
    survival_fit: bool = True
    """Also fit the per-position survival maps (:attr:`~lit_domino.decoding.acceptance.Calibration.survival_maps`:
    S_j as an isotonic map of the product of the calibrated c_1..c_j) on the calibration split, before the stage
    maps, which are then fitted on that S. False: S_j is the product (before 2026-12-05 noon; DSpark's own head then
    read a held-out survival ECE of 4.2 % for a c_j ECE of 3.0 %)."""
    steps: int = 300
    """Full-batch Adam steps of the add-on head."""
    lr: float = 0.05
    """Adam learning rate of the head."""
    stages: int = 2
    """Stages drafted per collected round (positions 1..stages·K are calibrated; DLoop's later stages included)."""
    anchors_per_sequence: int = 8
    """Rounds collected per sequence (spread evenly over its generated part, or over its decode's rounds)."""
    anchors: str = "decode"
    """Where the collected rounds start: ``decode``, at the round starts of the drafter's own plain speculative decode
    of the sequence (each round starts after the previous one's accepted drafts and bonus; acceptance read off the
    target's greedy continuation), ``anchors_per_sequence`` of them evenly spaced; ``even``, at evenly spaced
    positions (before 2026-12-05). A decode's rounds start right after a rejection more often than an even anchor
    does: on the default Domino drafter, rounds the even-anchor calibration gave P(whole | S) in [0.2, 0.7) were
    accepted whole in 8-33 % of the decode's rounds, a gate that read it opened stages that did not pay."""
    max_new_tokens: int = 96
    """Tokens of the target's own continuation of each prompt."""
    temperature: float = 0.0
    """Drafting temperature of the collected rounds (0: greedy picks; the soft label uses T = 1 then)."""
    pool_size: int | None = None
    """The drafter's decode candidate pool (Domino), as it decodes."""
    seed: int = 0

    def __post_init__(self):
        auto = "hard" if self.temperature <= 0 else "soft"
        for name in ("label", "calibration_label"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, auto)
        if self.anchors not in ANCHORS:
            raise ValueError(f"anchors must be one of {ANCHORS}, got {self.anchors!r}")
        if self.head_rows not in HEAD_ROWS:
            raise ValueError(f"head_rows must be one of {HEAD_ROWS}, got {self.head_rows!r}")
        if self.inputs not in INPUTS:
            raise ValueError(f"inputs must be one of {INPUTS}, got {self.inputs!r}")
        for name in ("label", "calibration_label"):
            if getattr(self, name) not in LABELS:
                raise ValueError(f"{name} must be one of {LABELS}, got {getattr(self, name)!r}")
        for name in ("steps", "stages", "anchors_per_sequence", "max_new_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be > 0, got {self.lr!r}")


# --------------------------------------------------------------------------- 1. rounds


@torch.no_grad()
def continuations(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Each prompt followed by the target's greedy continuation (regenerated data)."""
    from lit_domino.decoding import generate

    out = []
    for p in prompts:
        res = generate(target, None, torch.tensor([p]), max_new_tokens=max_new_tokens, threads=None)
        out.append(list(p) + list(res.tokens))
    return out


def shared_continuations(target, prompts: list[list[int]], max_new_tokens: int, memo: dict | None) -> list[list[int]]:
    """:func:`continuations`, kept in ``memo`` when one is given: a caller's dict for one target and prompt set (a
    study builds all its predictors on one; regenerating the continuations was about half of each build, ~100 s of
    ~180 s on the default preset)."""
    if memo is None:
        return continuations(target, prompts, max_new_tokens)
    if max_new_tokens not in memo:
        memo[max_new_tokens] = continuations(target, prompts, max_new_tokens)
    return memo[max_new_tokens]


@torch.no_grad()
def collect_rounds(target, drafter, sequences: list[tuple[list[int], int]], settings: AcceptanceSettings) -> dict:
    """Draft ``settings.stages`` stages at anchors of each ``(sequence, prompt_length)`` -> a dict of tensors over
    rounds n and round positions P = stages·K: ``H`` [n, P, d], ``prev`` [n, P], ``soft`` [n, P], ``hard`` [n, P].

    Greedy rounds with hard labels on the rows a round reaches (:func:`reads_off_continuation`) are labelled from
    the sequence itself, the target's greedy continuation: up to the first wrong draft the target's picks are the
    sequence's next tokens, and nothing after it is read (its hard labels are 0, its soft ones NaN). That skips a
    target forward over the whole prefix per round, 60 % of the collection on the default preset; a round whose
    drafts all match as far as the sequence goes, with drafts beyond its end, is verified by the target."""
    from lit_domino.decoding.round import feature_layers
    from lit_domino.runtime.inference import eval_mode

    K = drafter.config.block_size - 1
    layers = feature_layers(drafter)
    options = {} if settings.pool_size is None else {"pool_size": settings.pool_size}
    T = settings.temperature
    gen = torch.Generator(device=target.device).manual_seed(settings.seed)
    rows = {"H": [], "prev": [], "soft": [], "hard": []}
    limit = min(target.model.config.max_position_embeddings, drafter.config.max_position_embeddings)
    read_off = reads_off_continuation(settings)
    with eval_mode(target.model, drafter):
        for seq, plen in sequences:
            ids = torch.tensor(seq, device=target.device)
            last = min(len(seq) - 1, limit - 2 - settings.stages * K)
            if last <= plen:
                continue
            n = settings.anchors_per_sequence
            feats = target.forward_features(ids[None], layers)[0] if layers is not None else None
            if settings.anchors == "decode":
                starts = decode_starts(drafter, ids, feats, plen, last, K, options, T, gen)
                anchors = [starts[len(starts) * i // n] for i in range(min(n, len(starts)))]
            else:
                anchors = sorted({plen + (last - plen) * i // n for i in range(n)})
            for a in anchors:  # the committed context is seq[:a]; the anchor seq[a] is the round's x
                session = drafter.new_session(**options)
                session.extend(ids[:a], None if feats is None else feats[:a])
                anchor, Hs, prevs, stages = ids[a: a + 1], [], [], []
                for _ in range(settings.stages):
                    st = session.draft(anchor, K, T, gen)
                    H, prev = stage_inputs(session.stages[-1].hidden, anchor, st.tokens)
                    Hs.append(H.float()), prevs.append(prev), stages.append(st)
                    anchor = st.tokens[-1:]
                drafts = torch.cat([s.tokens for s in stages])
                truth = ids[a + 1: a + 1 + drafts.numel()]
                match = torch.cumprod((drafts[: truth.numel()] == truth).float(), 0)
                if read_off and (truth.numel() == drafts.numel() or (match.numel() > 0 and match[-1] == 0)):
                    hard = torch.cat([match, match.new_zeros(drafts.numel() - match.numel())])
                    rows["soft"].append(torch.full_like(hard, float("nan")))
                    rows["hard"].append(hard)
                else:
                    ctx = torch.cat([ids[: a + 1], drafts])[None]
                    logits = target.model(input_ids=ctx).logits[0, a: a + drafts.numel()]
                    t = T if T > 0 else 1.0
                    p = torch.softmax(logits.float() / t, -1)
                    q = torch.cat([torch.softmax(s.logits.float() / t, -1) for s in stages])
                    rows["soft"].append(1.0 - 0.5 * (q - p).abs().sum(-1))
                    rows["hard"].append((drafts == logits.argmax(-1)).float())
                rows["H"].append(torch.cat(Hs)), rows["prev"].append(torch.cat(prevs))
    if not rows["H"]:
        raise ValueError("no round could be collected: the sequences are too short for a round of drafts")
    return {k: torch.stack(v).cpu() for k, v in rows.items()}


def reads_off_continuation(settings: AcceptanceSettings) -> bool:
    """Whether :func:`collect_rounds` may label rounds from the sequence (greedy drafting, hard training and
    calibration labels, the head trained on the rows a round reaches): every label it reads lies before a round's
    first wrong draft."""
    return (settings.temperature <= 0 and settings.label == "hard" and settings.calibration_label == "hard"
            and settings.head_rows == "reached")


def decode_starts(drafter, ids: torch.Tensor, feats, plen: int, last: int, K: int, options: dict, temperature: float,
                  generator) -> list[int]:
    """The round starts (anchor positions) of the drafter's plain speculative decode of ``ids`` from ``plen``, up
    to ``last``: one session cropped and extended as the engine does, each round's accepted drafts the leading ones
    that equal ``ids`` (the target's greedy continuation, so exact at T = 0; at T > 0 the drafts are sampled and
    read against it)."""
    session = drafter.new_session(**options)
    session.extend(ids[:plen], None if feats is None else feats[:plen])
    starts, a = [], plen
    while a <= last:
        starts.append(a)
        drafts = session.draft(ids[a: a + 1], K, temperature, generator).tokens.reshape(-1)
        truth = ids[a + 1: a + 1 + K]
        n = min(truth.numel(), drafts.numel())
        acc = int(torch.cumprod((drafts[:n] == truth[:n]).long(), 0).sum()) if n else 0
        session.crop(a)
        session.extend(ids[a: a + acc + 1], None if feats is None else feats[a: a + acc + 1])
        a += acc + 1
    return starts


def split(data: dict, parts: list[float], seed: int = 0) -> list[dict]:
    """Random disjoint row splits of a rounds dict in the proportions ``parts``."""
    n = data["H"].shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    cuts = [0] + [round(n * sum(parts[: i + 1]) / sum(parts)) for i in range(len(parts))]
    return [{k: v[perm[cuts[i]: cuts[i + 1]]] for k, v in data.items()} for i in range(len(parts))]


# --------------------------------------------------------------------------- 2. head


def train_head(drafter, data: dict, settings: AcceptanceSettings) -> AcceptanceHead:
    """The add-on head trained on the rounds ``data`` (BCE on ``settings.label`` over ``settings.head_rows``; the
    drafter frozen)."""
    torch.manual_seed(settings.seed)
    d = drafter.config.hidden_size
    head = AcceptanceHead(d, input_width(drafter, settings.inputs), settings.inputs)
    with torch.no_grad():
        x = head.inputs(drafter, data["H"].to(drafter.embed.weight.device), data["prev"].to(drafter.embed.weight.device))
        x = x.reshape(-1, x.shape[-1]).cpu()
    y = data[settings.label].reshape(-1).float()
    w = (prefix_weights(data[settings.calibration_label].float()) if settings.head_rows == "reached"
         else torch.ones_like(data[settings.label].float())).reshape(-1)
    share = (w / w.sum())[:, None]  # standardised on the rows it trains on: one lr suits every width
    mu = (x * share).sum(0)
    sd = ((x - mu).pow(2) * share).sum(0).sqrt().clamp_min(1e-6)
    xs = (x - mu) / sd
    lin = torch.nn.Linear(x.shape[1], 1)
    torch.nn.init.zeros_(lin.weight)
    with torch.no_grad():
        lin.bias.fill_(float(torch.logit(((y * w).sum() / w.sum()).clamp(1e-3, 1 - 1e-3))))
    opt = torch.optim.Adam(lin.parameters(), lr=settings.lr)
    for _ in range(settings.steps):
        opt.zero_grad()
        bce = F.binary_cross_entropy_with_logits(lin(xs).squeeze(-1), y, reduction="none")
        loss = (bce * w).sum() / w.sum() + 1e-4 * lin.weight.pow(2).sum()
        loss.backward()
        opt.step()
    with torch.no_grad():  # fold the standardisation into the head's weights
        w = lin.weight[0] / sd
        head.proj.weight.copy_(w[None])
        head.proj.bias.copy_(lin.bias - (w * mu).sum())
    return head


# --------------------------------------------------------------------------- 3. calibration


def prefix_weights(y: torch.Tensor) -> torch.Tensor:
    """[n, P] labels -> weights ``Π_{i<j} y_i`` (1 at j = 1): the rounds that reached position j."""
    return torch.cat([torch.ones_like(y[:, :1]), torch.cumprod(y, 1)[:, :-1]], 1)


def _fit_temperature(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> float:
    """The τ > 0 minimising the w-weighted BCE of sigmoid(z / τ) against y (a log-spaced grid, then refined)."""
    if float(w.sum()) <= 0:
        return 1.0

    def nll(taus):
        zz = z[None] / taus[:, None]
        return (F.binary_cross_entropy_with_logits(zz, y[None].expand_as(zz), reduction="none") * w).sum(1)

    grid = torch.logspace(-2, 2, 161, dtype=torch.float64)
    best = int(nll(grid).argmin())
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    fine = torch.linspace(float(lo), float(hi), 101, dtype=torch.float64)
    return float(fine[int(nll(fine).argmin())])


MIN_CALIBRATION_WEIGHT = 20.0
"""Rounds (summed weights) a position needs for a temperature of its own; fewer reuse the previous position's."""


def _fit_platt(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor, tau0: float) -> tuple[float, float]:
    """(τ, b) minimising the w-weighted BCE of sigmoid(z / τ + b) (L-BFGS from τ0, b = 0)."""
    log_a = torch.tensor(-math.log(tau0), dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_a, b], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = (F.binary_cross_entropy_with_logits(z * log_a.exp() + b, y, reduction="none") * w).sum() / w.sum()
        loss.backward()
        return loss

    opt.step(closure)
    tau, off = math.exp(-log_a.item()), b.item()
    if not (math.isfinite(tau) and tau > 0 and math.isfinite(off)):
        return tau0, 0.0
    return tau, off


def fit_calibration(z: torch.Tensor, y: torch.Tensor, label: str, offsets: bool = True,
                    stage_tokens: int | None = None, survival_fit: bool = False) -> Calibration:
    """Per position temperatures from held-out raw logits z [n, P] and labels y [n, P] (see the module docs);
    a position that fewer than :data:`MIN_CALIBRATION_WEIGHT` rounds reached keeps the previous one's τ. With
    ``survival_fit``, the per-position survival maps (:func:`fit_survival`); with ``stage_tokens`` K (the rounds'
    stages of K drafts), also the stage-level map and yields (:func:`fit_stages`) on the survival."""
    z, y = z.double(), y.double()
    w = prefix_weights(y)
    taus, offs, means = [], [], []
    for j in range(z.shape[1]):
        enough = float(w[:, j].sum()) >= MIN_CALIBRATION_WEIGHT or not taus
        if enough:
            tau, off = _fit_temperature(z[:, j], y[:, j], w[:, j]), 0.0
            if offsets and float(w[:, j].sum()) > 0:
                tau, off = _fit_platt(z[:, j], y[:, j], w[:, j], tau)
        else:
            tau, off = taus[-1], offs[-1]
        c = torch.sigmoid(z[:, j] / tau + off)
        taus.append(tau), offs.append(off)
        means.append(float((c * w[:, j]).sum() / w[:, j].sum()) if float(w[:, j].sum()) > 0 else float(c.mean()))
    cal = Calibration(taus, means, label, offs if offsets else None)
    if survival_fit:
        cal.survival_maps = fit_survival(calibrated(z, cal), y)
        Calibration.__post_init__(cal)  # check the maps
    if stage_tokens is not None:
        whole, gain = fit_stages(survival_of(z, cal), y, stage_tokens)
        if whole is not None:
            cal.stage_whole, cal.stage_gain, cal.stage_tokens = whole, gain, int(stage_tokens)
            Calibration.__post_init__(cal)  # check the stage fields
    return cal


MIN_STAGE_ROUNDS = 20
"""Held-out rounds per bin of the stage maps' isotonic fit (:func:`isotonic`); fewer than two bins' worth, or no
round accepted whole, and the gates fall back to S and the mean confidences."""


def fit_survival(c: torch.Tensor, y: torch.Tensor) -> list[list[list[float]]]:
    """Per round position j, the isotonic map (:func:`isotonic`, every round, bins of :data:`MIN_STAGE_ROUNDS`) of
    the product R_j = c_1 ··· c_j of calibrated confidences c [n, P] to the survival Π_{i<=j} y_i of labels
    y [n, P]; a position without two bins' worth of rounds keeps the previous map (the first: the identity)."""
    R, alive = torch.cumprod(c.double(), 1), torch.cumprod(y.double(), 1)
    maps = []
    for j in range(R.shape[1]):
        knots = isotonic(R[:, j], alive[:, j])
        maps.append(knots if knots is not None else (maps[-1] if maps else [[0.0, 1.0], [0.0, 1.0]]))
    return maps


def survival_of(z: torch.Tensor, cal: Calibration | None) -> torch.Tensor:
    """The survival S [n, P] a gate reads for raw logits z [n, P]: the product of the calibrated c_j through the
    calibration's survival maps (:meth:`~lit_domino.decoding.acceptance.Calibration.survival`)."""
    R = torch.cumprod(calibrated(z, cal), 1)
    return R if cal is None else cal.survival(R)


def stage_events(S: torch.Tensor, y: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The survival S [n, P] (:func:`survival_of`) and labels y [n, P] of rounds of K-draft stages -> (S,
    alive [n, P] = Π_{i<=j} y_i, the stage boundaries j = sK - 1 (0-based) at which a gate decides)."""
    return S.double(), torch.cumprod(y.double(), 1), [s * K - 1 for s in range(1, y.shape[1] // K)]


def isotonic(x: torch.Tensor, y: torch.Tensor, min_count: int = MIN_STAGE_ROUNDS) -> list[list[float]] | None:
    """The non-decreasing map of ``x`` that fits ``y`` best in squares: the rows sorted by x, pooled into bins of
    ``min_count`` (the last takes the rest), then adjacent bins pooled while their means decrease (PAV); knots
    ``[[mean x ..], [mean y ..]]`` per block (blocks of equal mean x merged). None with fewer than two bins."""
    order = torch.argsort(x)
    x, y = x[order].tolist(), y[order].tolist()
    n = len(x) // min_count
    if n < 2:
        return None
    cuts = [i * min_count for i in range(n)] + [len(x)]
    blocks = []  # [sum x, sum y, count]
    for lo, hi in zip(cuts, cuts[1:]):
        blocks.append([sum(x[lo:hi]), sum(y[lo:hi]), hi - lo])
        while len(blocks) > 1 and (blocks[-2][1] / blocks[-2][2] >= blocks[-1][1] / blocks[-1][2]
                                   or blocks[-2][0] / blocks[-2][2] >= blocks[-1][0] / blocks[-1][2]):
            sx, sy, m = blocks.pop()
            blocks[-1] = [blocks[-1][0] + sx, blocks[-1][1] + sy, blocks[-1][2] + m]
    return [[b[0] / b[2] for b in blocks], [b[1] / b[2] for b in blocks]]


def fit_stages(S: torch.Tensor, y: torch.Tensor, K: int) -> tuple[list[list[float]] | None, list[list[float]] | None]:
    """The stage maps from the survival S [n, P] (:func:`survival_of`) and labels y [n, P] of rounds of K-draft
    stages, every stage boundary's rows pooled: ``whole``, P(alive at the boundary | S), and ``gain``, the drafts of
    the next stage accepted (0 when the round is dead at the boundary) given S, both isotonic in S
    (:func:`isotonic`); hard and soft labels alike. (None, None) with too few rounds or none accepted whole."""
    S, alive, bounds = stage_events(S, y, K)
    if not bounds:
        return None, None
    s = torch.cat([S[:, b] for b in bounds])
    whole = torch.cat([alive[:, b] for b in bounds])
    gain = torch.cat([alive[:, b + 1: b + 1 + K].sum(1) for b in bounds])
    if float(whole.sum()) <= 0:
        return None, None
    return isotonic(s, whole), isotonic(s, gain)


def calibrated(z: torch.Tensor, cal: Calibration | None) -> torch.Tensor:
    if cal is None:
        return torch.sigmoid(z.double())
    return torch.sigmoid(cal.apply(z.double()))


def ece(p: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None, bins: int = 10) -> float:
    """Expected calibration error: Σ_bins (weight share) · |mean p - mean y| over equal-width bins of p."""
    p, y = p.double().reshape(-1), y.double().reshape(-1)
    w = torch.ones_like(p) if w is None else w.double().reshape(-1)
    total = float(w.sum())
    if total <= 0:
        return float("nan")
    idx = (p * bins).long().clamp(0, bins - 1)
    err = 0.0
    for b in range(bins):
        m = (idx == b) & (w > 0)
        if m.any():
            wb = w[m]
            err += float(wb.sum()) / total * abs(float((p[m] * wb).sum() / wb.sum() - (y[m] * wb).sum() / wb.sum()))
    return err


def auc(score: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None) -> float:
    """ROC AUC of ``score`` for the binary ``y`` (rows with weight 0 left out; ties count one half)."""
    score, y = score.double().reshape(-1), y.reshape(-1) > 0.5
    if w is not None:
        keep = w.reshape(-1) > 0
        score, y = score[keep], y[keep]
    pos, neg = score[y], score[~y]
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    order = torch.cat([pos, neg]).argsort()
    ranks = torch.empty(order.numel(), dtype=torch.double)
    ranks[order] = torch.arange(1, order.numel() + 1, dtype=torch.double)
    s = torch.cat([pos, neg])
    for v in s.unique():  # average ranks of ties
        m = s == v
        if int(m.sum()) > 1:
            ranks[m] = ranks[m].mean()
    return float((ranks[: pos.numel()].sum() - pos.numel() * (pos.numel() + 1) / 2) / (pos.numel() * neg.numel()))


def ece_floor(p: torch.Tensor, w: torch.Tensor | None = None, draws: int = 100, bins: int = 10, seed: int = 0) -> float:
    """The ECE a perfectly calibrated predictor scores by sampling alone on these rows: the mean :func:`ece` of
    ``p`` against labels drawn from Bernoulli(p) (``draws`` seeded draws). With 100-500 rows it is 2-8 %, so an
    ECE within it is calibrated as far as the test split can tell."""
    p = p.double().reshape(-1)
    w = torch.ones_like(p) if w is None else w.double().reshape(-1)
    if float(w.sum()) <= 0:
        return float("nan")
    keep = w > 0
    p, w = p[keep], w[keep]
    gen = torch.Generator().manual_seed(seed)
    return sum(ece(p, (torch.rand(p.shape, generator=gen, dtype=torch.float64) < p).double(), w, bins)
               for _ in range(draws)) / draws


MIN_REPORT_ROUNDS = 10
"""Test rounds a position needs to be listed in the tables (and pooled in the survival ECE)."""


def calibration_report(z: torch.Tensor, hard: torch.Tensor, soft: torch.Tensor, cal: Calibration,
                       stage_tokens: int | None = None) -> dict:
    """Per round position j on test rounds: rounds reaching j, acceptance rate, AUC (raw logit vs the hard event,
    on the rounds whose drafts before j survived), ECE of c_j before / after calibration (same rounds), and the
    ECE of the survival S_j (:func:`survival_of`) against the event "drafts 1..j all accepted" (all rounds);
    ``ece_floor``: what a calibrated c_j would score by sampling alone on the same rows (:func:`ece_floor`).
    ``y`` for ECE is the calibration's label. With ``stage_tokens`` K, ``stages``: per stage boundary (where a DLoop
    gate decides) the test rounds, the observed survival, the mean S and P(whole | S), their ECE, and the next
    stage's yield on the test rounds against the calibration's (:func:`stage_rows`)."""
    y = hard if cal.label == "hard" else soft
    w = prefix_weights(hard)
    before, after = calibrated(z, None), calibrated(z, cal)
    S_after, S_before = survival_of(z, cal), torch.cumprod(before, 1)
    survived = torch.cumprod(hard, 1) if cal.label == "hard" else torch.cumprod(soft.double(), 1)
    rows = []
    for j in range(z.shape[1]):
        rows.append({"position": j + 1, "rounds": int(w[:, j].sum()), "accept": float((hard[:, j] * w[:, j]).sum()
                                                                                       / w[:, j].sum().clamp_min(1)),
                     "auc": auc(z[:, j], hard[:, j], w[:, j]), "ece_before": ece(before[:, j], y[:, j], w[:, j]),
                     "ece_after": ece(after[:, j], y[:, j], w[:, j]), "temperature": cal.temperatures[j],
                     "offset": 0.0 if cal.offsets is None else cal.offsets[j],
                     "survival_ece_before": ece(S_before[:, j], survived[:, j]),
                     "survival_ece_after": ece(S_after[:, j], survived[:, j]),
                     "ece_floor": ece_floor(after[:, j], w[:, j])})
    allw = w.reshape(-1)
    J = max(1, sum(1 for r in rows if r["rounds"] >= MIN_REPORT_ROUNDS))  # positions enough test rounds reached
    pooled = {"auc": auc(z, hard, w), "ece_before": ece(before, y, allw), "ece_after": ece(after, y, allw),
              "survival_ece_before": ece(S_before[:, :J], survived[:, :J]),
              "survival_ece_after": ece(S_after[:, :J], survived[:, :J]), "survival_positions": J,
              "ece_floor": ece_floor(after, allw), "survival_ece_floor": ece_floor(S_after[:, :J]),
              "rounds": int(z.shape[0])}
    out = {"positions": rows, "pooled": pooled, "label": cal.label}
    if stage_tokens is not None:
        out["stages"] = stage_rows(S_after, y, cal, stage_tokens)
    return out


def stage_rows(S: torch.Tensor, y: torch.Tensor, cal: Calibration, K: int) -> list[dict]:
    """Per stage boundary s (after s stages of K drafts) on these rounds: ``rounds``, ``alive`` (the mean survival:
    every draft so far accepted), ``S`` and ``whole`` (the mean S and P(whole | S) predicted), ``ece_S`` and
    ``ece_whole`` (against the survival), ``gain`` and ``gain_fit`` (the next stage's accepted drafts, 0 on a dead
    round, observed and predicted: :meth:`~lit_domino.decoding.acceptance.Calibration.next_gain`) and, on the rounds
    whose predicted gain is at least one draft (where a gate is likely to draft another stage), ``n_hopeful``,
    ``gain_hopeful`` and ``gain_fit_hopeful``."""
    S, alive, bounds = stage_events(S, y, K)
    out = []
    for s, b in enumerate(bounds, 1):
        P = torch.tensor([cal.whole_stage(float(v)) for v in S[:, b]], dtype=torch.float64)
        fit = torch.tensor([cal.next_gain(float(v), b + 1, K) for v in S[:, b]], dtype=torch.float64)
        gain = alive[:, b + 1: b + 1 + K].sum(1)
        hopeful = fit >= 1.0
        out.append({"stage": s, "rounds": int(S.shape[0]), "alive": float(alive[:, b].mean()),
                    "S": float(S[:, b].mean()), "whole": float(P.mean()), "ece_S": ece(S[:, b], alive[:, b]),
                    "ece_whole": ece(P, alive[:, b]), "gain": float(gain.mean()), "gain_fit": float(fit.mean()),
                    "n_hopeful": int(hopeful.sum()),
                    "gain_hopeful": float(gain[hopeful].mean()) if hopeful.any() else float("nan"),
                    "gain_fit_hopeful": float(fit[hopeful].mean()) if hopeful.any() else float("nan")})
    return out


def report_markdown(name: str, report: dict) -> str:
    lines = [f"**{name}** (label {report['label']}, {report['pooled']['rounds']} test rounds; pooled AUC "
             f"{report['pooled']['auc']:.3f}, ECE {100 * report['pooled']['ece_before']:.1f} % → "
             f"{100 * report['pooled']['ece_after']:.1f} %, survival ECE "
             f"{100 * report['pooled']['survival_ece_before']:.1f} % → {100 * report['pooled']['survival_ece_after']:.1f} %)",
             "", "| j | rounds | accept | AUC | ECE before | ECE after | τ_j | S_j ECE before | S_j ECE after | "
             "ECE noise floor |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["positions"]:
        if r["rounds"] < MIN_REPORT_ROUNDS:
            continue
        lines.append(f"| {position_cells(r)} |")
    if report.get("stages"):
        lines += ["", stage_markdown(report["stages"])]
    return "\n".join(lines)


def stage_markdown(stages: list[dict]) -> str:
    """:func:`stage_rows` as a Markdown table."""
    lines = [r"| after stage | rounds | survived | mean S | mean P(whole \| S) | ECE of S | ECE of P(whole \| S) | "
             "next stage's drafts accepted: observed / predicted | rounds predicted ≥ 1: n, observed / predicted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in stages:
        lines.append(f"| {r['stage']} | {r['rounds']} | {r['alive']:.3f} | {r['S']:.3f} | {r['whole']:.3f} | "
                     f"{100 * r['ece_S']:.1f} % | {100 * r['ece_whole']:.1f} % | {r['gain']:.2f} / "
                     f"{r['gain_fit']:.2f} | {r['n_hopeful']}: {r['gain_hopeful']:.2f} / {r['gain_fit_hopeful']:.2f} |")
    return "\n".join(lines)


def position_cells(r: dict) -> str:
    """One calibration report position as Markdown cells: j, rounds, accept rate, AUC, ECE before/after, τ_j,
    survival ECE before/after, the c_j ECE's noise floor (the per-drafter report and the study's table print the
    same columns; reports without a floor, built before it, print –)."""
    floor = r.get("ece_floor")
    return (f"{r['position']} | {r['rounds']} | {r['accept']:.2f} | {r['auc']:.3f} | "
            f"{100 * r['ece_before']:.1f} % | {100 * r['ece_after']:.1f} % | {r['temperature']:.2f} | "
            f"{100 * r['survival_ece_before']:.1f} % | {100 * r['survival_ece_after']:.1f} % | "
            + ("–" if floor is None else f"{100 * floor:.1f} %"))


def reliability_figure(z: torch.Tensor, hard: torch.Tensor, soft: torch.Tensor, cal: Calibration, title: str,
                       bins: int = 10):
    """Reliability diagrams (a matplotlib ``Figure``, Agg): per-position c_j (pooled over positions, on the rounds
    that reached j) and the survival S_j, before and after calibration."""
    from matplotlib.figure import Figure

    y = hard if cal.label == "hard" else soft
    w = prefix_weights(hard)
    survived = torch.cumprod(hard, 1) if cal.label == "hard" else torch.cumprod(soft.double(), 1)
    fig = Figure(figsize=(9, 4))
    for ax, (name, pre, post, yy, ww) in zip(fig.subplots(1, 2), [
            ("c_j (conditional)", calibrated(z, None), calibrated(z, cal), y, w),
            ("survival S_j", torch.cumprod(calibrated(z, None), 1), survival_of(z, cal), survived,
             torch.ones_like(w))]):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        for label, p in (("before", pre), ("after", post)):
            p, t, wt = p.reshape(-1), yy.double().reshape(-1), ww.double().reshape(-1)
            idx = (p * bins).long().clamp(0, bins - 1)
            xs, ys = [], []
            for b in range(bins):
                m = (idx == b) & (wt > 0)
                if m.any():
                    xs.append(float((p[m] * wt[m]).sum() / wt[m].sum()))
                    ys.append(float((t[m] * wt[m]).sum() / wt[m].sum()))
            ax.plot(xs, ys, marker="o", label=f"{label} (ECE {100 * ece(pre if label == 'before' else post, yy, ww):.1f} %)")
        ax.set_xlabel("predicted"), ax.set_ylabel("observed"), ax.set_title(name), ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- end to end, cached


def prompt_ids(target, prompts) -> list[list[int]]:
    """Benchmark prompts (``.turns``: the first turn, chat-templated) or token-id lists -> token-id lists."""
    out = []
    for p in prompts:
        turns = getattr(p, "turns", None)
        out.append(target.chat_ids([{"role": "user", "content": turns[0]}]) if turns else list(p))
    return out


def build_predictor(target, drafter, prompts, settings: AcceptanceSettings = AcceptanceSettings(),
                    continued: dict | None = None):
    """Collect rounds on the target's continuations of ``prompts`` (token-id lists; ``continued``: a memo of them
    for this target and prompt set, :func:`shared_continuations`), split 50/25/25 into train, calibration and
    test, train the add-on head (not for a drafter with its own head), calibrate, report -> (predictor, report,
    test rounds' (z, hard, soft))."""
    drafter.bind_target(target)
    if "gru" in settings.inputs:
        require_causal_state(drafter, f"AcceptanceSettings(inputs={settings.inputs!r})")
    own = own_predictor(drafter) if settings.own_head else None
    if own is None and not supports_predictor(drafter):
        raise NoAcceptancePredictor(f"the {drafter.kind} drafter drafts token by token: the add-on acceptance head "
                                    "reads a parallel drafter's block hidden states")
    seqs = shared_continuations(target, prompts, settings.max_new_tokens, continued)
    data = collect_rounds(target, drafter, [(s, len(p)) for s, p in zip(seqs, prompts)], settings)
    train, held, test = split(data, [2, 1, 1], settings.seed)
    head = None if own is not None else train_head(drafter, train, settings)
    pred = AcceptancePredictor(drafter_key(drafter), head, None,
                               {"source": "own head" if own is not None else "add-on head", **asdict(settings),
                                "rounds": {"train": int(train["H"].shape[0]), "calibration": int(held["H"].shape[0]),
                                           "test": int(test["H"].shape[0])}})

    def logits(d):
        dev = drafter.embed.weight.device
        with torch.no_grad():
            return pred.logits(drafter, d["H"].to(dev), d["prev"].to(dev)).double().cpu()

    cal = settings.calibration_label
    K = drafter.config.block_size - 1
    pred.calibration = fit_calibration(logits(held), held[cal], cal, settings.offsets,
                                       stage_tokens=K if settings.stage_fit else None,
                                       survival_fit=settings.survival_fit)
    zt = logits(test)
    report = calibration_report(zt, test["hard"], test["soft"], pred.calibration, K)
    pred.meta["test"] = report["pooled"]
    return pred, report, (zt, test["hard"], test["soft"])


def artifact_key(target, drafter, prompts, settings: AcceptanceSettings) -> dict:
    """The predictor artifact's key: the drafter's key, the target's fingerprint, the prompts and ``settings``
    (``inputs`` among them, so a drafter's hidden-state and GRU-state heads never share an artifact)."""
    fields = asdict(settings)
    if fields["inputs"] == "hidden":  # the key the hidden-state head had before the GRU variant: its caches stay
        del fields["inputs"]
    return {"drafter": drafter_key(drafter), "target": cache.config_hash(target.fingerprint()),
            "prompts": cache.config_hash([list(p) for p in prompts]), "settings": fields}


def acceptance_predictor(target, drafter, prompts, settings: AcceptanceSettings = AcceptanceSettings(),
                         name: str | None = None, root: Path | None = None,
                         continued: dict | None = None) -> tuple[AcceptancePredictor, Path]:
    """:func:`build_predictor`, cached as its own artifact ``acceptance/<name>-<hash>`` (the hash covers the
    drafter's key, the target's fingerprint, the prompts and ``settings``): ``predictor/``, ``report.json``,
    ``report.md`` and ``reliability.png``. ``continued``: the caller's memo of the target's continuations of
    ``prompts`` (:func:`shared_continuations`; filled only when a predictor is built). Returns (predictor,
    artifact directory)."""
    key = artifact_key(target, drafter, prompts, settings)
    name = name or drafter.kind
    path = cache.artifact_dir("acceptance", key, name=name, root=root)

    def build(out: Path):
        with cache.staging(out) as tmp:
            pred, report, (z, hard, soft) = build_predictor(target, drafter, prompts, settings, continued)
            pred.save(tmp / "predictor")
            (tmp / "report.json").write_text(json.dumps(report, indent=1))
            (tmp / "report.md").write_text(report_markdown(name, report) + "\n")
            reliability_figure(z, hard, soft, pred.calibration, f"{name}: reliability").savefig(
                tmp / "reliability.png", dpi=110)
            cache.mark_complete(tmp, key)

    return cache.reuse_or_build(path, lambda p: load_predictor(p / "predictor"), build), path
