"""A study's summary: counts, best trial, parameter importances, Optuna's plots (PNG) and ``summary.json``,
all also logged to the study's MLflow run (artifacts ``optuna/``, metrics ``importance/<param>``)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any, Callable

import matplotlib.pyplot as plt  # the CLI runs headless (MPLBACKEND=Agg); a notebook keeps its backend
import optuna
import yaml
from matplotlib.ticker import NullFormatter
from optuna.trial import TrialState
from optuna.visualization import matplotlib as ovm

from lit_domino.runtime.paths import project_root
from lit_domino.studies.sweep.storage import SPACE_ATTR, trial_counts
from lit_domino.studies.sweep.tracking import RUN_ATTR, mlflow_client


def same_objective_warning(values: list[float], objective: str = "value") -> str | None:
    """A warning when every finished trial (>= 2) has the same objective, else None.

    A first sweep that trains too few steps shows it: Domino's correction starts at zero (W_up = 0), so after a
    few dozen steps it flips no pick, every rank and λ schedule drafts the backbone's tokens and the trials' τ agree
    to 16 digits; the best trial and the importances then say nothing."""
    if len(values) < 2 or not all(math.isclose(v, values[0], rel_tol=1e-12, abs_tol=1e-12) for v in values):
        return None
    return (f"warning: all {len(values)} finished trials have the same {objective} = {values[0]!r}: the parameters "
            "changed nothing, so the best trial and the importances below are arbitrary. That usually means too "
            "few training steps: the zero-started Domino correction has not yet changed a single draft pick. "
            "Train longer (--max-steps) before comparing trials")


def summarize(study: optuna.Study, out_dir: str | Path | None = None, *, log_to_mlflow: bool = True,
              tracking_uri: str | None = None, echo: Callable[[str], None] = print) -> dict:
    """Print the best trial and parameter importances; write the Optuna plots (PNG) and log them to the
    study's MLflow run. Returns ``{"best": ..., "importances": ..., "plots": [paths], "counts": ...}``."""
    out = Path(out_dir) if out_dir else project_root() / "results" / "sweeps" / study.study_name
    out.mkdir(parents=True, exist_ok=True)
    counts = {k: v for k, v in trial_counts(study).items() if v}
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    objective = study.user_attrs.get("objective", "value")
    echo(f"study {study.study_name!r}: {sum(counts.values())} trials {counts}; objective = {objective} (maximize)")
    result: dict[str, Any] = {"counts": counts, "best": None, "importances": None, "plots": []}
    space = study.user_attrs.get(SPACE_ATTR)
    if space:
        result["space"] = json.loads(space)
        echo("search space of this study (reuse it with --space):")
        echo("  " + yaml.safe_dump(result["space"], sort_keys=False).rstrip().replace("\n", "\n  "))
    if not complete:
        echo("no completed trials yet: nothing to summarise")
        return result
    if warning := same_objective_warning([t.value for t in complete], objective):
        echo(warning)
        result["warning"] = warning
    best = study.best_trial
    result["best"] = {"number": best.number, "value": best.value, "params": best.params,
                      "mlflow_run_id": best.user_attrs.get("mlflow_run_id"),
                      **{k: best.user_attrs[k] for k in ("tau", "speedup") if k in best.user_attrs}}
    echo(f"best trial #{best.number}: {objective} = {best.value:.4f}")
    for k, v in best.params.items():
        echo(f"  {k:>20} = {v}")
    if best.user_attrs.get("mlflow_run_id"):
        echo(f"  MLflow run {best.user_attrs['mlflow_run_id']}")
    plots = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning of every plot, matplotlib's layout warnings
        if len(complete) < 2:
            echo(f"parameter importances: need at least 2 completed trials (have {len(complete)})")
        else:
            try:
                imp = optuna.importance.get_param_importances(study)
                result["importances"] = dict(imp)
                echo("parameter importances:")
                for k, v in imp.items():
                    echo(f"  {k:>20}  {v:.3f}")
                plots["importances"] = ovm.plot_param_importances
            except Exception as err:
                echo(f"parameter importances unavailable: {type(err).__name__}: {err}")
        plots["history"] = ovm.plot_optimization_history
        plots["slice"] = ovm.plot_slice
        if any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
            plots["intermediate_values"] = ovm.plot_intermediate_values
        for name, fn in plots.items():
            try:
                ax = fn(study)
                fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
                for a in fig.axes:  # log axes: major ticks only (minor labels overlap)
                    if a.get_xscale() == "log":
                        a.xaxis.set_minor_formatter(NullFormatter())
                path = out / f"{name}.png"
                fig.savefig(path, dpi=100, bbox_inches="tight")
                plt.close(fig)
                result["plots"].append(path)
            except Exception as err:
                echo(f"plot {name} skipped: {type(err).__name__}: {err}")
    (out / "summary.json").write_text(json.dumps({k: v for k, v in result.items() if k != "plots"}, indent=2,
                                                 default=str))
    echo(f"plots: {', '.join(str(p) for p in result['plots'])}")
    run_id = study.user_attrs.get(RUN_ATTR)
    if log_to_mlflow and run_id:
        try:
            client, _ = mlflow_client(tracking_uri)
            for path in [*result["plots"], out / "summary.json"]:
                client.log_artifact(run_id, str(path), "optuna")
            if result["importances"]:
                for k, v in result["importances"].items():
                    client.log_metric(run_id, f"importance/{k}", float(v))
            echo(f"logged to MLflow run {run_id} (artifacts optuna/)")
        except Exception as err:
            echo(f"could not log the plots to MLflow: {err}")
    return result
