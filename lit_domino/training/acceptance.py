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

The steps live in their own modules: :mod:`~lit_domino.training.acceptance_rounds` (1),
:mod:`~lit_domino.training.calibration` (3), :mod:`~lit_domino.training.calibration_metrics` (AUC, ECE) and
:mod:`~lit_domino.training.acceptance_report` (tables, figure); this one holds the settings, the head and the cached
end to end build.

:func:`acceptance_predictor` runs it end to end, cached as its own artifact (``acceptance/``) keyed by the
drafter's weights (:func:`~lit_domino.decoding.acceptance.drafter_key`), the target and the settings.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from lit_domino.runtime import cache
from lit_domino.decoding.acceptance import (AcceptanceHead, AcceptancePredictor,
                                           NoAcceptancePredictor, drafter_key, input_width, load_predictor,
                                           own_predictor, require_causal_state, supports_predictor)
# The steps live apart (rounds, calibration maths, metrics, reports); their names stay importable from here.
from lit_domino.training.acceptance_report import (MIN_REPORT_ROUNDS, calibration_report,  # noqa: F401
                                                   position_cells, reliability_figure, report_markdown,
                                                   stage_markdown, stage_rows)
from lit_domino.training.acceptance_rounds import (collect_rounds, continuations, decode_starts,  # noqa: F401
                                                   reads_off_continuation, shared_continuations, split)
from lit_domino.training.calibration import (MIN_CALIBRATION_WEIGHT, MIN_STAGE_ROUNDS, calibrated,  # noqa: F401
                                             fit_calibration, fit_stages, fit_survival, isotonic, prefix_weights,
                                             stage_events, survival_of)
from lit_domino.training.calibration_metrics import auc, ece, ece_floor  # noqa: F401
from lit_domino.training.acceptance_settings import ANCHORS, HEAD_ROWS, AcceptanceSettings  # noqa: F401



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
