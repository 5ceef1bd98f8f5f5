"""MLflow runs as DataFrames (:mod:`lit_domino.studies.analysis` reads its tables and plots from them): the store
(the argument, else ``$MLFLOW_TRACKING_URI``, else the project's), the result runs with their tags and metrics, the
latest per seed, and the domains, positions, records and presets they hold. A missing or empty store gives empty
frames, never an error."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Iterable

import pandas as pd
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from lit_domino.runtime.paths import project_root
from lit_domino.studies.tables import EXACT_HEAD_METRICS, load_spec


TAG_COLUMNS = ("variant", "preset", "seed", "table", "sweep")
BASE_COLUMNS = ("run_id", "experiment", "run_name", "status", "start_time", *TAG_COLUMNS)
SPEC = load_spec()
"""The ablation study's table spec (row order, labels): ``experiments/configs/studies/ablation.yaml``."""
VARIANT_ORDER = SPEC.variants
_POS = re.compile(r"^acc_rate_pos_(\d+)$")
URI_ATTR = "tracking_uri"
"""``DataFrame.attrs`` key of the store :func:`load_runs` read (pandas keeps attrs through filters and sorts)."""
_NON_DOMAINS = {"train", "val", "sweep", "importance", "optuna", EXACT_HEAD_METRICS}


def tracking_uri(uri: str | None = None) -> str:
    """``uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<project>/mlflow.db``."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"


def store_missing(uri: str) -> bool:
    """A SQLite store whose file does not exist (opening it would create an empty one)."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        return path != ":memory:" and not Path(path).is_file()
    if uri.startswith("file:") or "://" not in uri:
        path = uri[len("file://"):] if uri.startswith("file://") else uri.removeprefix("file:")
        return not Path(path).exists()
    return False


def runs_client(uri: str | None):

    return MlflowClient(tracking_uri(uri))


def empty_runs() -> pd.DataFrame:
    return pd.DataFrame(columns=list(BASE_COLUMNS))


def load_runs(uri: str | None = None, *, experiments: Iterable[str] | None = None, include_sweeps: bool = False,
              statuses: Iterable[str] | None = ("FINISHED",), require_metric: str | None = "tau") -> pd.DataFrame:
    """Every run with a ``variant`` tag (and ``require_metric``) as one row: ids, tags, latest metrics.

    Columns: ``run_id, experiment, run_name, status, start_time, variant, preset, seed (int),
    table, sweep`` then one column per metric under its MLflow name (``tau``,
    ``embedded-math/tau``, ``acc_rate_pos_01`` ...). Sweep trials (tag ``sweep``) are left
    out unless ``include_sweeps``; ``statuses=None`` keeps runs in any state.
    """
    uri = tracking_uri(uri)
    if store_missing(uri):
        return empty_runs()

    client = runs_client(uri)
    exps = client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
    if experiments is not None:
        wanted = set(experiments)
        exps = [e for e in exps if e.name in wanted]
    names = {e.experiment_id: e.name for e in exps}
    rows = []
    for exp_id in names:
        token = None
        while True:
            page = client.search_runs([exp_id], filter_string="", max_results=1000, page_token=token)
            for run in page:
                tags = run.data.tags
                if not tags.get("variant") or tags.get("sweep_role") == "study":
                    continue
                if tags.get("sweep") and not include_sweeps:
                    continue
                if statuses is not None and run.info.status not in set(statuses):
                    continue
                if require_metric and require_metric not in run.data.metrics:
                    continue
                row = {"run_id": run.info.run_id, "experiment": names[exp_id],
                       "run_name": tags.get("mlflow.runName", run.info.run_name), "status": run.info.status,
                       "start_time": pd.to_datetime(run.info.start_time, unit="ms") if run.info.start_time else None}
                row.update({k: tags.get(k) for k in TAG_COLUMNS})
                row.update(run.data.metrics)
                rows.append(row)
            token = page.token
            if not token:
                break
    if not rows:
        return empty_runs()
    df = pd.DataFrame(rows)
    df["seed"] = pd.to_numeric(df["seed"], errors="coerce").fillna(0).astype(int)
    order = {v: i for i, v in enumerate(VARIANT_ORDER)}
    df["_order"] = df["variant"].map(lambda v: order.get(v, len(order)))
    df = df.sort_values(["preset", "_order", "variant", "seed", "start_time"], na_position="last")
    df = df.drop(columns="_order").reset_index(drop=True)
    df.attrs[URI_ATTR] = uri  # rebuild_tables reads the study rows of the same store
    return df


def latest_per_seed(df: pd.DataFrame) -> pd.DataFrame:
    """The most recent run of each (preset, variant, seed): reruns do not count twice."""
    if df.empty:
        return df
    return (df.sort_values("start_time").groupby(["preset", "variant", "seed"], dropna=False).tail(1)
            .sort_index().reset_index(drop=True))


def domains(df: pd.DataFrame) -> list[str]:
    """Benchmark/domain names that have a ``{name}/tau`` column, in first-seen order."""
    out = []
    for col in df.columns:
        if isinstance(col, str) and col.endswith("/tau") and col.count("/") == 1:
            name = col[: -len("/tau")]
            if name not in _NON_DOMAINS and name not in out and df[col].notna().any():
                out.append(name)
    return out


def positions(df: pd.DataFrame, prefix: str = "") -> list[int]:
    """Draft positions k with an ``{prefix}acc_rate_pos_{k:02d}`` column."""
    ks = []
    for col in df.columns:
        if isinstance(col, str) and col.startswith(prefix):
            m = _POS.match(col[len(prefix):])
            if m and "/" not in col[len(prefix):]:
                ks.append(int(m.group(1)))
    return sorted(set(ks))


def records(df: pd.DataFrame) -> list[dict]:
    """Runs → ``lit_domino.studies.tables`` records ``{variant, seed, domain, tau, speedup, backbone_tau}``."""
    out = []
    for _, run in df.iterrows():
        for d in domains(df):
            tau = run.get(f"{d}/tau")
            if tau is None or (isinstance(tau, float) and math.isnan(tau)):
                continue
            rec = {"variant": run["variant"], "seed": int(run["seed"]), "domain": d, "preset": run.get("preset")}
            for metric in ("tau", "speedup", "backbone_tau"):
                v = run.get(f"{d}/{metric}")
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    rec[metric] = float(v)
            out.append(rec)
    return out


def presets(df: pd.DataFrame) -> list[str]:
    if df.empty:
        return []
    return [p for p in df["preset"].dropna().unique().tolist()] + (["(none)"] if df["preset"].isna().any() else [])


def for_preset(df: pd.DataFrame, preset: str | None) -> pd.DataFrame:
    if preset is None or df.empty:
        return df
    if preset == "(none)":
        return df[df["preset"].isna()]
    return df[df["preset"] == preset]
