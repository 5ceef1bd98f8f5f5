"""The ablation's MLflow runs, laid out as a researcher compares ablations.

Experiment ``ablation-<preset>`` (model-training mode, :func:`lit_domino.runtime.tracking.ensure_experiment`) holds:

* one **study run** per study (:class:`StudyRun`; named and tagged ``study`` by the study's name,
  ``ablation-<preset>`` or a subset's ``ablation-<preset>-<variants>-s<seeds>``; tags ``study_role=study``,
  ``table=summary``, ``preset``). It is RUNNING while the job runs (reopened by a rerun of the same study) and ends
  FINISHED, FAILED or KILLED with the job. Its metrics are the seed-aggregated results of every variant
  (:func:`study_metrics`: ``<variant>/tau``, ``<variant>/tau_spread``, ``<variant>/<benchmark>/tau``, the same
  for ``speedup``); its artifacts the tables (``tables/``: Markdown, JSON, the raw rows) and the plots
  (``plots/``: τ and speedup per variant, and each drafter's acceptance curves and τ histogram);
* the **training runs**, one per variant x seed, nested under the study run (tag ``mlflow.parentRunId``; a cached
  drafter's run moves under the study that decodes it, since its decoding metrics are that study's);
* the saved view :data:`VIEW_ID` of the runs table ("Views" menu): τ, speedup and τ per benchmark as columns,
  sorted by τ.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from lit_domino.runtime.tracking import default_tracking_uri, ensure_experiment, open_client, save_runs_view, store_lock

PARENT_TAG = "mlflow.parentRunId"
"""The tag MLflow nests a run under (the UI's expandable rows)."""
STUDY_TAG = "study"
"""Tag of the study run: the study's name (found again by a rerun of the same study)."""
VIEW_ID = "tau-speedup"
"""The saved view of an ablation experiment's runs table: ``#/experiments/<id>/runs?viewStateShareKey=tau-speedup``."""
VIEW_NAME = "τ and speedup"
KEY_METRICS = ("tau", "speedup", "speedup_vs_compiled_ar")
"""The metrics a study run aggregates over seeds, and the saved view's first columns: ``speedup`` is over the eager
plain decoder, ``speedup_vs_compiled_ar`` over the compiled one (a study that did not run it logs none)."""


def _column(kind: str, key: str) -> str:
    """A runs-table column as the MLflow UI names it (``metrics.`tau```)."""
    return f"{kind}.`{key}`"


def view_state(benchmarks: Sequence[str]) -> dict:
    """The runs-table state of :data:`VIEW_ID`: τ and speedup, then τ per benchmark and the variant and seed tags,
    in that order. Sorted by start time, MLflow's default: sorted by a metric, the table stops nesting the runs
    under the study run."""
    columns = [_column("metrics", k) for k in KEY_METRICS]
    columns += [_column("metrics", f"{b}/tau") for b in benchmarks]
    columns += [_column("tags", "variant"), _column("tags", "seed")]
    # wide enough for a metric's digits (the grid cuts them at its default width)
    return {"selectedColumns": columns, "columnOrder": columns, "columnWidths": {c: 120 for c in columns}}


def study_metrics(records: Iterable[Mapping], benchmarks: Sequence[str], metrics: Sequence[str] = KEY_METRICS
                  ) -> dict[str, float]:
    """Table records (one per variant, seed and benchmark; ``tables.records_from_rows``) → the study run's
    metrics: per variant the mean over seeds of the benchmarks' mean (``<variant>/tau``) and its spread (sample
    standard deviation over seeds, 0 with one seed: ``<variant>/tau_spread``), and the same per benchmark
    (``<variant>/<benchmark>/tau``, ``..._spread``); ``domino@full`` (the exact head beside a pool) is named
    ``domino_full`` (MLflow takes no ``@``). The aggregation is the tables' (``studies.tables.aggregate``)."""
    from lit_domino.studies.common import mlflow_name
    from lit_domino.studies.tables import aggregate

    records = list(records)
    out: dict[str, float] = {}
    for metric in metrics:
        for (variant, domain), (mean, spread) in aggregate(records, metric).items():
            if domain != "avg" and domain not in benchmarks:
                continue
            name = mlflow_name(f"{variant}/{metric}" if domain == "avg" else f"{variant}/{domain}/{metric}")
            if math.isfinite(mean):
                out[name] = mean
                out[f"{name}_spread"] = spread
    return out


def plot_study(records: Iterable[Mapping], order: Sequence[str], labels: Mapping[str, str]):
    """τ and speedup per variant (mean over seeds and benchmarks, bars; the spread over seeds, error bars):
    a matplotlib ``Figure`` (Agg)."""
    from matplotlib.figure import Figure

    from lit_domino.studies.tables import aggregate

    records = list(records)
    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, len(KEY_METRICS))
    for ax, metric in zip(axes, KEY_METRICS):
        cells = aggregate(records, metric)
        shown = {v for (v, d), (mean, _) in cells.items() if d == "avg" and math.isfinite(mean)}
        names = [v for v in order if v in shown] + sorted(shown - set(order))  # the peers have no τ
        means = [cells[(v, "avg")][0] for v in names]
        spreads = [cells[(v, "avg")][1] for v in names]
        ax.barh(range(len(names)), means, xerr=spreads, color="tab:blue", alpha=0.8)
        ax.set_yticks(range(len(names)), [labels.get(v, v) for v in names], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel({"tau": "τ (tokens per round, bonus included)",
                       "speedup": "speedup vs our AR baseline"}.get(metric, metric))
        if metric == "speedup":
            ax.axvline(1.0, color="grey", linewidth=0.8)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("mean over seeds and benchmarks (error bars: spread over seeds)", fontsize=9)
    fig.tight_layout()
    return fig


class StudyRun:
    """The study run of one ablation job: :meth:`open` once the configs are checked; as a context manager around
    the job it ends the run FINISHED, or FAILED (KILLED for Ctrl-C) when the job raises. Nothing is logged until
    :meth:`open` (a job that fails its argument checks leaves no run)."""

    def __init__(self):
        self.run_id: str | None = None
        self.uri: str | None = None

    def open(self, experiment: str, name: str, tags: Mapping[str, str], benchmarks: Sequence[str]) -> str:
        """Find (a rerun of the same study) or create the study run ``name`` in ``experiment``, RUNNING; the
        experiment's saved view (:func:`view_state`) is stored the first time. Returns the run id.

        Two jobs of one study started together share one study run: the find-or-create holds the store's lock."""
        self.uri = default_tracking_uri()
        client = open_client(self.uri)
        exp_id = ensure_experiment(experiment, self.uri)
        all_tags = {STUDY_TAG: name, "study_role": "study", "table": "summary", **dict(tags)}
        with store_lock(self.uri):
            save_runs_view(client, exp_id, VIEW_ID, VIEW_NAME, view_state(benchmarks))
            found = client.search_runs([exp_id], filter_string=f"tags.{STUDY_TAG} = '{name}'",
                                       order_by=["attributes.start_time DESC"], max_results=1)
            if found:
                self.run_id = found[0].info.run_id
                client.update_run(self.run_id, status="RUNNING")
            else:
                self.run_id = client.create_run(exp_id, run_name=name,
                                                tags={k: str(v) for k, v in all_tags.items()}).info.run_id
        if found:
            for key, value in all_tags.items():
                client.set_tag(self.run_id, key, str(value))
        return self.run_id

    def adopt(self, run_ids: Iterable[str | None]) -> None:
        """Nest the runs ``run_ids`` under the study run (cached drafters' runs, made by an earlier study)."""
        client = open_client(self.uri)
        for run_id in run_ids:
            if run_id and run_id != self.run_id and client.get_run(run_id).data.tags.get(PARENT_TAG) != self.run_id:
                client.set_tag(run_id, PARENT_TAG, self.run_id)

    def log(self, records: list[dict], benchmarks: Sequence[str], files: Iterable[Path], plots: Iterable[Path]) -> None:
        """The seed-aggregated metrics (:func:`study_metrics`), ``files`` under ``tables/``, ``plots`` under
        ``plots/``."""
        from lit_domino.studies.common import log_metrics

        client = open_client(self.uri)
        log_metrics(client, self.run_id, study_metrics(records, benchmarks))
        for path in files:
            client.log_artifact(self.run_id, str(path), "tables")
        for path in plots:
            client.log_artifact(self.run_id, str(path), "plots")

    def __enter__(self) -> StudyRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.run_id is None:
            return
        from lit_domino.runtime.tracking import _status_for

        status = "FINISHED" if exc is None else _status_for(exc)
        try:
            open_client(self.uri).set_terminated(self.run_id, status)
        except Exception as err:  # noqa: BLE001 (never masks the job's own exception)
            import logging

            logging.getLogger(__name__).warning("could not end the study run %s %s: %s", self.run_id, status, err)
