"""The eval callback: real speculative decoding of held-out prompts during training, logged to MLflow.

Training metrics such as ``val/tau_sim`` are estimates from teacher-forced blocks;
this callback runs the actual engine (:func:`lit_domino.decoding.generate`) with the
module's drafter and logs what decoding really achieves, per domain:
``{domain}/tau``, ``{domain}/accepted_per_round``, ``{domain}/speedup`` (vs our AR
baseline on the same prompts, same process), ``{domain}/tpot_ms``,
``{domain}/acc_rate_pos_{k:02d}``, and overall ``tau`` / ``speedup``. With an
``MLFlowLogger`` attached it also stores two PNG plots per evaluation (per-position
acceptance curve, τ histogram) as run artifacts under ``spec_eval/``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import MLFlowLogger

from lit_domino.decoding.dloop import DLoopConfig
from lit_domino.decoding.engine import generate
from lit_domino.decoding.metrics import summarize
from lit_domino.decoding.plots import plot_position_acceptance, plot_tau_histogram
from lit_domino.decoding.metric_names import POSITIONS, drafter_metrics

log = logging.getLogger(__name__)


def _check_prompts(prompts: Mapping[str, Sequence[Sequence[int]]]) -> dict[str, list[list[int]]]:
    if not isinstance(prompts, Mapping) or not prompts:
        raise ValueError("SpeculativeEvalCallback needs prompts: a dict {domain: [token-id prompt, ...]}, "
                         "got an empty or non-dict value")
    out = {}
    for domain, items in prompts.items():
        items = [list(torch.as_tensor(p).reshape(-1).tolist()) if isinstance(p, torch.Tensor) else list(p)
                 for p in items]
        if not items:
            raise ValueError(f"SpeculativeEvalCallback: domain {domain!r} has no prompts")
        for p in items:
            if not p or not all(isinstance(t, int) and t >= 0 for t in p):
                raise ValueError(f"SpeculativeEvalCallback: domain {domain!r} has an empty prompt or one that is "
                                 "not a list of non-negative token ids")
        if "/" in str(domain):
            raise ValueError(f"domain names are metric prefixes and cannot contain '/': {domain!r}")
        out[str(domain)] = items
    return out


def evaluate_speculative(
    target,
    drafter,
    prompts: Mapping[str, Sequence[Sequence[int]]],
    *,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    block_size: int | None = None,
    dloop: DLoopConfig | None = None,
    measure_speedup: bool = True,
    seed: int = 0,
) -> tuple[dict[str, float], dict[str, dict]]:
    """Decode ``prompts`` per domain; returns ``(flat metrics, per-domain summaries)``.

    Flat metric names: ``{domain}/tau``, ``{domain}/accepted_per_round``,
    ``{domain}/speedup``, ``{domain}/tpot_ms``, ``{domain}/acc_rate_pos_{k:02d}``,
    and ``tau`` / ``speedup`` over all prompts (pooled, not a mean over domains); non-finite values left out.
    """
    prompts = _check_prompts(prompts)
    per_domain: dict[str, dict] = {}
    everything, everything_base = [], []

    def run(drafter_, ids, i):
        return generate(target, drafter_, torch.tensor([ids]), max_new_tokens=max_new_tokens,
                        temperature=temperature, block_size=block_size if drafter_ is not None else None,
                        dloop=dloop if drafter_ is not None else None, seed=seed + i)

    first = next(iter(prompts.values()))[0]
    run(drafter, first, 0)  # untimed warm-up (lazy inits, allocator)
    if measure_speedup:
        run(None, first, 0)
    for domain, items in prompts.items():
        results = [run(drafter, p, i) for i, p in enumerate(items)]
        base = [run(None, p, i) for i, p in enumerate(items)] if measure_speedup else None
        per_domain[domain] = summarize(results, base)
        everything += results
        everything_base += base or []
    overall = summarize(everything, everything_base or None)
    rows = [{**row, "benchmark": domain} for domain, row in per_domain.items()]
    metrics = drafter_metrics(rows, keys=("tau", "accepted_per_round", "tpot_ms", "speedup", POSITIONS),
                              mean_keys=("tau", "speedup"), overall=overall)
    return metrics, per_domain


class SpeculativeEvalCallback(Callback):
    """Decode held-out prompts with ``pl_module.drafter`` (bound to ``pl_module.target``) and log the results.

    Runs at the end of every ``every_n_epochs``-th validation epoch (not during the
    sanity check) and at fit end (``at_fit_end``; skipped if that step was just
    evaluated). ``prompts``: ``{domain: [token ids, ...]}``; the first ``num_prompts``
    of each domain are decoded with ``max_new_tokens`` each (cheap defaults: 4 x 32).
    Validation-epoch results go through ``pl_module.log`` (so they can be monitored);
    fit-end results go straight to the trainer's loggers. ``last_metrics`` keeps the
    latest results. Under DDP only global rank 0 decodes; it broadcasts its results, so
    every rank logs (and can monitor) the same values.
    """

    def __init__(
        self,
        prompts: Mapping[str, Sequence[Sequence[int]]],
        num_prompts: int = 4,
        max_new_tokens: int = 32,
        every_n_epochs: int = 1,
        temperature: float = 0.0,
        block_size: int | None = None,
        dloop: DLoopConfig | str | None = None,
        at_fit_end: bool = True,
        measure_speedup: bool = True,
        plots: bool = True,
        seed: int = 0,
    ):
        super().__init__()
        for name, value in (("num_prompts", num_prompts), ("max_new_tokens", max_new_tokens),
                            ("every_n_epochs", every_n_epochs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SpeculativeEvalCallback: {name} must be a positive integer, got {value!r}")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"SpeculativeEvalCallback: temperature must be >= 0, got {temperature!r}")
        self.prompts = {d: p[:num_prompts] for d, p in _check_prompts(prompts).items()}
        self.max_new_tokens = max_new_tokens
        self.every_n_epochs = every_n_epochs
        self.temperature = float(temperature)
        self.block_size = block_size
        self.dloop = DLoopConfig.parse(dloop) if isinstance(dloop, str) else dloop
        self.at_fit_end = at_fit_end
        self.measure_speedup = measure_speedup
        self.plots = plots
        self.seed = seed
        self.last_metrics: dict[str, float] = {}
        self._last_step: int | None = None

    # ------------------------------------------------------------------ hooks

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        metrics = self._evaluate(trainer, pl_module)
        for name, value in metrics.items():
            pl_module.log(name, value, on_step=False, on_epoch=True, batch_size=1)

    def on_fit_end(self, trainer, pl_module) -> None:
        if not self.at_fit_end or self._last_step == trainer.global_step:
            return
        metrics = self._evaluate(trainer, pl_module)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})

    # ------------------------------------------------------------------ work

    def _evaluate(self, trainer, pl_module) -> dict[str, float]:
        """Decode on global rank 0 only (batch 1, the same prompts on every rank would only repeat it);
        the other ranks wait and receive its results, so every rank logs the same values."""
        drafter = getattr(pl_module, "drafter", None)
        target = getattr(pl_module, "target", None)
        if drafter is None or target is None:
            raise RuntimeError("SpeculativeEvalCallback needs a LightningModule exposing .drafter (bound to .target)")
        result = None
        if trainer.is_global_zero:
            result = evaluate_speculative(
                target, drafter, self.prompts, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                block_size=self.block_size, dloop=self.dloop, measure_speedup=self.measure_speedup, seed=self.seed)
        if trainer.world_size > 1:
            result = trainer.strategy.broadcast(result, src=0)
        metrics, per_domain = result
        self.last_metrics, self.last_per_domain = metrics, per_domain
        self._last_step = trainer.global_step
        if self.plots and trainer.is_global_zero:
            self._log_plots(trainer, per_domain)
        return metrics

    def _log_plots(self, trainer, per_domain) -> None:
        for logger in trainer.loggers:
            if not isinstance(logger, MLFlowLogger):
                continue
            tag = f"epoch{trainer.current_epoch:03d}_step{trainer.global_step:06d}"
            try:
                for name, fig in (("acceptance", plot_position_acceptance(per_domain, f"acceptance ({tag})")),
                                  ("tau_hist", plot_tau_histogram(per_domain, f"τ histogram ({tag})"))):
                    logger.experiment.log_figure(logger.run_id, fig, f"spec_eval/{name}_{tag}.png")
            except Exception as err:  # a plot must never kill training
                log.warning("SpeculativeEvalCallback: could not log plots to MLflow: %s", err)
