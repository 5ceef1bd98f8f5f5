"""Read results back from MLflow: runs as DataFrames, the papers' tables rebuilt, comparison plots.

``notebooks/analysis.ipynb`` calls these functions; nothing here holds a number.
Conventions read (those of ``lit_domino.studies.ablation`` and ``lit_domino.studies.sweep``):

* a *result run* has the tag ``variant`` (plus ``preset``, ``seed``, ``table``) and the
  metric ``tau``; per benchmark/domain ``{name}/tau``, ``{name}/speedup``,
  ``{name}/backbone_tau``, ``{name}/acc_rate_pos_XX``; over all of them ``tau``,
  ``speedup``, ``acc_rate_pos_XX`` (conditional acceptance of draft position XX); ``exact_head/...``: the
  same drafter decoded with the exact head beside its candidate pool (no benchmark);
* sweep trials carry the tag ``sweep`` (left out of the ablation tables unless asked);
* the ablation's study run (tag ``table=summary``; ``lit_domino.study_runs``, the training runs nested under it)
  holds ``tables/rows.json``, the raw benchmark rows with each method's per-round ``tau_histogram``: the tables
  are rebuilt from them by the job's own code (``tables.tables_from_rows``), so they equal ``results/``'.

The tracking URI is the argument, else ``$MLFLOW_TRACKING_URI``, else the project's
``sqlite:///<project>/mlflow.db``. A missing or empty store gives empty frames, never an error.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from mlflow.entities import ViewType

from lit_domino.runtime.paths import project_root
# Reading the runs lives apart; its names stay importable from here (the notebook reads them as analysis.*).
from lit_domino.studies.analysis_runs import (BASE_COLUMNS, SPEC, TAG_COLUMNS, URI_ATTR, VARIANT_ORDER,  # noqa: F401
                                              runs_client, empty_runs, for_preset, store_missing, domains,
                                              latest_per_seed, load_runs, positions, presets, records,
                                              tracking_uri)
from lit_domino.studies.tables import ablation_table, main_table, records_from_rows, tables_from_rows

def rebuild_tables(df: pd.DataFrame, preset: str | None = None, uri: str | None = None) -> dict:
    """The main table and the Domino ablations of ``preset``, as the ablation job wrote them to ``results/``.

    From the preset's study run's ``tables/rows.json`` (:func:`study_rows`) through
    :func:`lit_domino.studies.tables.tables_from_rows`, the job's own code: the pool rows (``<variant>@full``) and
    the inner backbone's τ come from the rows' keys, as in the job; ``uri``: default the store ``df`` was loaded
    from (:func:`load_runs`), else the usual rule. Without a study run (runs logged by another
    tool, an older store), from the runs' per-benchmark metrics in ``df`` (no pool rows: those need the rows).
    Returns ``{"main": table, "ablations": table}`` (each with ``rows`` and ``markdown``), or {} without runs.
    """
    uri = uri or df.attrs.get(URI_ATTR)  # the store the runs came from, not the default one
    rows = study_rows(uri, preset).get(preset) if preset not in (None, "(none)") else None
    if rows:
        return tables_from_rows(rows)
    runs = latest_per_seed(for_preset(df, preset))
    recs = records(runs)
    if not recs:
        return {}
    doms = domains(runs)
    return {"main": main_table(recs, doms), "ablations": ablation_table(recs)}


def study_rows(uri: str | None = None, preset: str | None = None) -> dict[str, list[dict]]:
    """Preset → the raw benchmark rows (``tables/rows.json``) of its ablation study run (tag ``table=summary``,
    FINISHED): the full study's (``study`` tag ``ablation-<preset>``, whose tables are ``results/ablation-<preset>``)
    when there is one, else the latest subset's. Only ``preset`` when given; {} without study runs."""
    uri = tracking_uri(uri)
    if store_missing(uri):
        return {}
    client = runs_client(uri)
    exps = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if not exps:
        return {}
    runs = client.search_runs(exps, filter_string="tags.table = 'summary' and attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=200)
    chosen: dict[str, object] = {}
    for run in runs:
        p = run.data.tags.get("preset")
        if p is None or (preset is not None and p != preset):
            continue
        full = run.data.tags.get("study") == f"ablation-{p}"
        if p not in chosen or (full and chosen[p].data.tags.get("study") != f"ablation-{p}"):
            chosen[p] = run
    out = {}
    for p, run in chosen.items():
        try:
            with tempfile.TemporaryDirectory() as tmp, _no_progress_bar():
                path = client.download_artifacts(run.info.run_id, "tables/rows.json", tmp)
                out[p] = json.loads(Path(path).read_text())
        except Exception:  # noqa: BLE001 (a study run without its rows: the caller falls back)
            continue
    return out


def _cell(v) -> str:
    if isinstance(v, tuple) and len(v) == 2:
        mean, spread = v
        if mean is None or math.isnan(mean):
            return "–"
        return f"{mean:.3f} ± {spread:.3f}" if spread else f"{mean:.3f}"
    return "" if v is None else str(v)


def table_frame(table: dict) -> pd.DataFrame:
    """A rebuilt table as a DataFrame of display strings (``mean ± spread`` over seeds)."""
    rows = [{k: _cell(v) for k, v in row.items()} for row in table.get("rows", [])]
    return pd.DataFrame(rows)


def summary_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Per (preset, variant): runs, seeds, τ and speedup mean and std over seeds (latest run per seed)."""
    runs = latest_per_seed(df)
    if runs.empty:
        return pd.DataFrame(columns=["preset", "variant", "label", "runs", "seeds", "tau_mean", "tau_std",
                                     "speedup_mean", "speedup_std"])
    out = []
    for (preset, variant), g in runs.groupby(["preset", "variant"], dropna=False, sort=False):
        row = {"preset": preset, "variant": variant, "label": SPEC.label(variant), "runs": len(g),
               "seeds": ",".join(str(s) for s in sorted(g["seed"].unique()))}
        for m in ("tau", "speedup"):
            vals = g[m].dropna() if m in g else pd.Series(dtype=float)
            row[f"{m}_mean"] = float(vals.mean()) if len(vals) else float("nan")
            row[f"{m}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0 if len(vals) else float("nan")
        out.append(row)
    return pd.DataFrame(out)


def acceptance_curves(df: pd.DataFrame) -> pd.DataFrame:
    """Long frame ``preset, variant, position, rate, std``: conditional acceptance per draft position,
    mean over seeds (overall ``acc_rate_pos_XX``; else the mean of the per-domain ones)."""
    runs = latest_per_seed(df)
    rows = []
    doms = domains(runs)
    for _, run in runs.iterrows():
        ks = positions(runs) or sorted({k for d in doms for k in positions(runs, f"{d}/")})
        for k in ks:
            v = run.get(f"acc_rate_pos_{k:02d}")
            if v is None or (isinstance(v, float) and math.isnan(v)):
                vals = [run.get(f"{d}/acc_rate_pos_{k:02d}") for d in doms]
                vals = [x for x in vals if x is not None and not (isinstance(x, float) and math.isnan(x))]
                v = sum(vals) / len(vals) if vals else None
            if v is not None:
                rows.append({"preset": run["preset"], "variant": run["variant"], "seed": run["seed"],
                             "position": k, "rate": float(v)})
    if not rows:
        return pd.DataFrame(columns=["preset", "variant", "position", "rate", "std"])
    long = pd.DataFrame(rows)
    agg = long.groupby(["preset", "variant", "position"], dropna=False, sort=False)["rate"]
    out = agg.mean().to_frame("rate")
    out["std"] = agg.std(ddof=1).fillna(0.0)
    return out.reset_index()


def tau_histograms(uri: str | None = None, preset: str | None = None) -> pd.DataFrame:
    """Per-round τ counts per variant from the ablation's ``tables/rows.json`` (latest study run, tag
    ``table=summary``; temperature 0, seeds and benchmarks summed). Columns ``preset, variant, tau, rounds``;
    empty when no such artifact exists (then plot the per-run τ values instead)."""
    uri = tracking_uri(uri)
    empty = pd.DataFrame(columns=["preset", "variant", "tau", "rounds"])
    if store_missing(uri):
        return empty

    rows = []
    for p, data in study_rows(uri, preset).items():
        # rows of a store written before rows carried their MethodKey are left out
        keyed = [r for r in data if r.get("kind") != "drafter" or r.get("key")]
        for r in records_from_rows(keyed):  # the tables' variants: the exact head beside a pool is <variant>@full
            if r["kind"] != "drafter" or float(r.get("temperature", 0)) != 0.0:
                continue
            for tau, count in enumerate(r.get("tau_histogram") or []):
                if count:
                    rows.append({"preset": p, "variant": r["variant"], "tau": tau, "rounds": int(count)})
    if not rows:
        return empty
    return pd.DataFrame(rows).groupby(["preset", "variant", "tau"], sort=False)["rounds"].sum().reset_index()


class _no_progress_bar:
    """MLflow's artifact download progress bar off (it clutters notebook output)."""

    KEY = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"

    def __enter__(self):
        self.old = os.environ.get(self.KEY)
        os.environ[self.KEY] = "false"

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop(self.KEY, None)
        else:
            os.environ[self.KEY] = self.old


# --------------------------------------------------------------------------- plots


def _variants(frame: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(frame["variant"].tolist()))
    order = {v: i for i, v in enumerate(VARIANT_ORDER)}
    return sorted(present, key=lambda v: (order.get(v, len(order)), v))


def _figure(width: float = 7.0, height: float = 4.2, ncols: int = 1):

    fig = Figure(figsize=(width, height))
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def plot_acceptance_curves(df: pd.DataFrame, preset: str | None = None, title: str | None = None):
    """Per-position conditional acceptance, one line per variant (± std over seeds); a matplotlib Figure."""
    curves = acceptance_curves(for_preset(df, preset))
    fig, (ax,) = _figure()
    for v in _variants(curves) if not curves.empty else []:
        c = curves[curves["variant"] == v].sort_values("position")
        ax.errorbar(c["position"], c["rate"], yerr=c["std"], marker="o", capsize=3, label=SPEC.label(v))
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(k accepted | positions < k accepted)")
    ax.set_ylim(0, 1.02)
    ax.set_title(title or f"per-position acceptance{f' ({preset})' if preset else ''}")
    ax.grid(alpha=0.3)
    if not curves.empty:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no acc_rate_pos_XX metrics", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    return fig


def plot_tau_histograms(df: pd.DataFrame, hist: pd.DataFrame | None = None, preset: str | None = None):
    """τ histograms, one panel per variant: the fraction of rounds committing τ tokens (from ``hist``,
    see :func:`tau_histograms`), else the distribution of the runs' per-(seed, benchmark) mean τ."""

    hist = for_preset(hist, preset) if hist is not None else None
    per_round = hist is not None and not hist.empty
    recs = pd.DataFrame(records(latest_per_seed(for_preset(df, preset)))) if not per_round else None
    source = hist if per_round else recs
    names = _variants(source) if source is not None and not source.empty else []
    ncols = min(3, max(1, len(names)))
    nrows = max(1, math.ceil(len(names) / ncols))
    fig = Figure(figsize=(3.4 * ncols, 2.6 * nrows + 0.6))
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True).ravel()
    for ax in axes[len(names):]:
        ax.set_visible(len(names) == 0 and ax is axes[0])
    if not names:
        axes[0].text(0.5, 0.5, "no runs", ha="center", va="center", transform=axes[0].transAxes)
    for ax, v, color in zip(axes, names, _colors(len(names))):
        if per_round:
            h = hist[hist["variant"] == v]
            total = max(1, int(h["rounds"].sum()))
            ax.bar(h["tau"], h["rounds"] / total, color=color)
            mean = float((h["tau"] * h["rounds"]).sum() / total)
            ax.axvline(mean, color="black", lw=1, ls="--")
            ax.set_title(f"{SPEC.label(v)}\nmean τ/round {mean:.2f}", fontsize=9)
        else:
            vals = recs.loc[recs["variant"] == v, "tau"].to_numpy()
            ax.hist(vals, bins=8, color=color)
            ax.set_title(f"{SPEC.label(v)}\n{len(vals)} (seed, benchmark) values", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    xlabel = "τ (tokens committed per round, bonus included)" if per_round else "mean τ of a (seed, benchmark)"
    ylabel = "fraction of rounds" if per_round else "count"
    fig.supxlabel(xlabel, fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    fig.suptitle(f"τ histograms{f' ({preset})' if preset else ''}", fontsize=11)
    fig.tight_layout()
    return fig


def _colors(n: int) -> list:

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def plot_speedup_bars(df: pd.DataFrame, preset: str | None = None, metric: str = "speedup"):
    """Grouped bars: ``metric`` per variant for every benchmark and the average, error bars = std over seeds."""
    recs = pd.DataFrame(records(latest_per_seed(for_preset(df, preset))))
    fig, (ax,) = _figure(width=9.0)
    if recs.empty or metric not in recs:
        ax.text(0.5, 0.5, f"no {metric} metrics", ha="center", va="center", transform=ax.transAxes)
        return fig
    per_seed_avg = recs.groupby(["variant", "seed"])[metric].mean().reset_index().assign(domain="avg")
    data = pd.concat([recs[["variant", "seed", "domain", metric]], per_seed_avg], ignore_index=True)
    doms = list(dict.fromkeys(recs["domain"].tolist())) + ["avg"]
    names = _variants(recs)
    width = 0.8 / max(1, len(names))
    for j, v in enumerate(names):
        sub = data[data["variant"] == v].groupby("domain")[metric]
        means, stds = sub.mean(), sub.std(ddof=1).fillna(0.0)
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(doms))]
        ax.bar(xs, [means.get(d, float("nan")) for d in doms], width=width,
               yerr=[stds.get(d, 0.0) for d in doms], capsize=2, label=SPEC.label(v))
    ax.set_xticks(range(len(doms)), doms)
    if metric == "speedup":
        ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_ylabel(f"{metric} (vs our AR baseline)" if metric == "speedup" else metric)
    ax.set_title(f"{metric} per variant{f' ({preset})' if preset else ''}")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- sweeps


def sweep_trials(uri: str | None = None, study: str | None = None) -> pd.DataFrame:
    """Finished sweep trials (tag ``sweep``): study, trial number, sampled params (``trial.*``), objective."""
    uri = tracking_uri(uri)
    if store_missing(uri):
        return pd.DataFrame()

    client = runs_client(uri)
    exps = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if not exps:
        return pd.DataFrame()
    flt = "attributes.status = 'FINISHED'" + (f" and tags.sweep = '{study}'" if study else "")
    rows = []
    for run in client.search_runs(exps, filter_string=flt, max_results=5000):
        tags = run.data.tags
        if not tags.get("sweep") or tags.get("sweep_role") == "study" or "objective" not in run.data.metrics:
            continue
        row = {"study": tags["sweep"], "trial": int(tags.get("optuna.trial", -1)), "run_id": run.info.run_id,
               "objective": run.data.metrics["objective"], "tau": run.data.metrics.get("tau"),
               "speedup": run.data.metrics.get("speedup")}
        for k, v in run.data.params.items():
            if k.startswith("trial."):
                row[k[len("trial."):]] = _parse(v)
        rows.append(row)
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).sort_values(["study", "objective"], ascending=[True, False]).reset_index(drop=True)


def _parse(value: str):
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def plot_sweep(trials: pd.DataFrame, x: str = "rank", study: str | None = None):
    """Objective against one swept parameter (log x for numeric ranks), one colour per λ kind if swept."""
    fig, (ax,) = _figure()
    t = trials if study is None else trials[trials["study"] == study]
    if t.empty or x not in t:
        ax.text(0.5, 0.5, "no sweep trials", ha="center", va="center", transform=ax.transAxes)
        return fig
    hue = "lambda_kind" if "lambda_kind" in t else None
    groups = t.groupby(hue) if hue else [("trials", t)]
    for name, g in groups:
        ax.scatter(g[x], g["objective"], label=str(name))
    if pd.api.types.is_numeric_dtype(t[x]) and (t[x] > 0).all():
        ax.set_xscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel("objective")
    ax.set_title(f"sweep {study or ''}: objective vs {x}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title=hue)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- running the notebook


def execute_notebook(path: str | Path | None = None, out: str | Path | None = None, uri: str | None = None,
                     timeout: int = 600):
    """Execute ``notebooks/analysis.ipynb`` headless (nbclient) against ``uri`` (default: the usual rule)
    and write the executed copy to ``out`` (default ``results/analysis.ipynb``); returns the notebook."""
    import nbformat  # the dev extra (pytest's notebook test): the library itself runs without it
    from nbclient import NotebookClient

    path = Path(path or project_root() / "notebooks" / "analysis.ipynb")
    out = Path(out or project_root() / "results" / "analysis.ipynb")
    nb = nbformat.read(path, as_version=4)
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = tracking_uri(uri)  # the kernel inherits the environment
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return nb
