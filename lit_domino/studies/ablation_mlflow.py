"""The ablation's MLflow logging: each variant's decoding metrics and plots in its training run, nested under the
study's run, which gets the seed-aggregated metrics, the tables and every plot."""

from __future__ import annotations

from pathlib import Path

from lit_domino.decoding.metric_names import drafter_metrics
from lit_domino.runtime.tracking import default_tracking_uri, ensure_run, open_client, run_tags
from lit_domino.studies.common import log_metrics
from lit_domino.studies.study_runs import StudyRun, plot_study
from lit_domino.studies.tables import EXACT_HEAD, EXACT_HEAD_METRICS, STUDY_FILE, aggregate, fmt, load_spec


def peer_table(records: list[dict], domains: list[str]) -> str:
    """Markdown: our drafters' speedups beside the two HF peers, per domain."""
    speed = aggregate(records, "speedup")
    names = sorted({r["variant"] for r in records})
    lines = ["| method | " + " | ".join(domains + ["avg"]) + " |", "|---|" + "---|" * (len(domains) + 1)]
    for v in names:
        lines.append(f"| {v} | " + " | ".join(fmt(speed.get((v, d)), suffix="x") for d in domains + ["avg"]) + " |")
    return "\n".join(lines)


def log_to_mlflow(preset: str, trained: list, records: list[dict], out_dir: Path, main_variants: list[str],
                  study: StudyRun, domains: list[str]) -> None:
    """Decoding metrics + plots into each variant's training run (tag ``table``: ``main`` for the
    ``main_variants``, the plan's ``tables["main"]``, else ``ablations``; tag ``decode_pool_size``: the
    candidate pool a Domino variant decoded with, absent for the exact head; the exact head's metrics beside a
    pool: ``exact_head/...``), each run nested under the ``study`` run; into the study run the seed-aggregated
    metrics, the tables and every plot (``lit_domino.studies.study_runs``).

    A cached drafter whose training run is not in the current store (a deleted ``mlflow.db``, another
    ``MLFLOW_TRACKING_URI``) gets a run recreated from its report (``tracking.ensure_run``), with a warning."""
    from lit_domino.decoding.plots import plot_position_acceptance, plot_tau_histogram

    uri = default_tracking_uri()
    client = open_client(uri)
    plots = []
    for t in trained:
        if not t.run_id:
            continue
        t.run_id = ensure_run(
            t.run_id, f"ablation-{preset}", f"{t.variant}-{preset}-s{t.seed}",
            tags=run_tags(t.variant, preset, t.seed, extra={"drafter_dir": str(t.drafter_dir)}),
            metrics={f"train/{k}": t.report[k] for k in ("drafter_parameters", "train_seconds", "train_tokens_per_s",
                                                           "peak_rss_mb") if t.report.get(k) is not None},
            tracking_uri=uri)
        study.adopt([t.run_id])
        mine = [r for r in records if r["variant"] == t.variant and r["seed"] == t.seed and r["temperature"] == 0]
        if not mine:
            continue
        per_domain = {r["domain"]: r for r in mine}
        log_metrics(client, t.run_id, drafter_metrics(mine))
        client.set_tag(t.run_id, "table", "main" if t.variant in main_variants else "ablations")
        pools = {r.get("pool_size") for r in mine} - {None}
        if pools:
            client.set_tag(t.run_id, "decode_pool_size", ",".join(map(str, sorted(pools))))
        exact = [r for r in records if r["variant"] == t.variant + EXACT_HEAD and r["seed"] == t.seed
                 and r["temperature"] == 0]
        if exact:  # the same drafter decoded with the exact head, for the pool rows
            log_metrics(client, t.run_id, {f"{EXACT_HEAD_METRICS}/{k}": v for k, v in drafter_metrics(exact).items()})
        for name, fig in (("acceptance_per_position.png", plot_position_acceptance(per_domain, t.variant)),
                          ("tau_histogram.png", plot_tau_histogram(per_domain, t.variant))):
            path = out_dir / "plots" / f"{t.variant}-s{t.seed}-{name}"
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=100)
            client.log_artifact(t.run_id, str(path), "plots")
            plots.append(path)
    greedy = [r for r in records if r["temperature"] == 0]
    spec = load_spec(STUDY_FILE)
    path = out_dir / "plots" / "study-tau-speedup.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_study(greedy, spec.variants, spec.labels).savefig(path, dpi=100)
    study.log(greedy, domains, sorted(out_dir.glob("*.md")) + sorted(out_dir.glob("*.json")), [path, *plots])
