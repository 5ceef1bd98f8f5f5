"""The papers' tables, rebuilt from measured results: main comparison and Domino ablations.

Input is a list of result records, one per (variant, seed, domain):
``{"variant", "seed", "domain", "tau", "speedup", ...}``, made from the decode's benchmark rows by
:func:`records_from_rows` (:func:`tables_from_rows`: rows → tables, the one path the ablation job and the
notebook share). Seeds are aggregated to
mean ± spread (sample standard deviation; 0 with one seed). A difference between
two variants smaller than their combined spread is reported as "within spread",
never as a win. Every table is written as Markdown (for people) and JSON (for code).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from lit_domino.decoding.metric_names import MethodKey
from lit_domino.training.configs import CONFIG_DIR
from lit_domino.runtime.jsonio import write_json

STUDY_FILE = CONFIG_DIR / "studies" / "ablation.yaml"

EXACT_HEAD = "@full"
"""Suffix of a variant decoded with the exact head beside the preset's candidate pool (``domino@full``)."""
EXACT_HEAD_METRICS = "exact_head"
"""Prefix of the exact head's metrics in a pooled variant's MLflow run (``exact_head/tau``): no benchmark."""


def decode_pool_size(preset: str, study_file: Path = STUDY_FILE) -> int | None:
    """The candidate pool Domino's head decodes with on ``preset`` (None: the exact head): the ablation study
    file's ``presets.<preset>.pool_size``, the one place it is set; the DLoop study decodes alike."""
    return (yaml.safe_load(Path(study_file).read_text())["presets"].get(preset) or {}).get("pool_size")


@dataclass(frozen=True)
class TableSpec:
    """What the tables show, from the study file (``experiments/configs/studies/ablation.yaml``)."""

    main: tuple[str, ...]
    """The main table's rows, in order (``variants.main``)."""
    variants: tuple[str, ...]
    """Every variant of the study, in order: the main rows, then the ablations (``variants``)."""
    labels: dict
    """Variant → the name tables, plots and the notebook print (``labels``)."""
    published: dict
    """Variant → the papers' figure printed beside its row (``published``)."""
    ablations: tuple[dict, ...]
    """The ablation rows: ``{study, metric, from, to, label, published[, inner_backbone]}`` (``ablations``)."""

    def label(self, variant: str) -> str:
        return self.labels.get(variant, variant)


def load_spec(path: Path = STUDY_FILE) -> TableSpec:
    """The table spec of a study file."""
    study = yaml.safe_load(Path(path).read_text())
    main = tuple(study["variants"]["main"])
    return TableSpec(main, main + tuple(study["variants"].get("ablations") or ()), dict(study.get("labels") or {}),
                     dict(study.get("published") or {}), tuple(study.get("ablations") or ()))


def mean_spread(values: list[float]) -> tuple[float, float]:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def aggregate(records: list[dict], metric: str) -> dict[tuple[str, str], tuple[float, float]]:
    """(variant, domain) → (mean, spread) of ``metric`` over seeds; domain "avg" = mean over domains."""
    per = defaultdict(lambda: defaultdict(list))  # variant → seed → values over domains
    cells = defaultdict(list)
    for r in records:
        if metric in r and r[metric] is not None:
            cells[(r["variant"], r["domain"])].append(r[metric])
            per[r["variant"]][r["seed"]].append(r[metric])
    out = {key: mean_spread(vals) for key, vals in cells.items()}
    for variant, seeds in per.items():  # average over domains per seed, then over seeds
        out[(variant, "avg")] = mean_spread([statistics.fmean(v) for v in seeds.values()])
    return out


def fmt(cell: tuple[float, float] | None, digits: int = 2, suffix: str = "") -> str:
    if cell is None or math.isnan(cell[0]):
        return "–"
    mean, spread = cell
    return f"{mean:.{digits}f}{suffix} ± {spread:.{digits}f}" if spread > 0 else f"{mean:.{digits}f}{suffix}"


def compare(a: tuple[float, float], b: tuple[float, float]) -> str:
    """Verdict for b vs a: a difference within the combined spread is not a win."""
    if a is None or b is None or math.isnan(a[0]) or math.isnan(b[0]):
        return "–"
    diff, spread = b[0] - a[0], math.hypot(a[1], b[1])
    if abs(diff) <= spread:
        return f"within spread (Δ {diff:+.2f}, spread {spread:.2f})"
    return f"{'better' if diff > 0 else 'worse'} (Δ {diff:+.2f}, ratio {b[0] / a[0]:.2f})" if a[0] else f"Δ {diff:+.2f}"


COMPILED_SPEEDUP = "speedup_vs_compiled_ar"
"""The speedup over the compiled plain decoder (the fastest the suite has), where ``speedup`` is over the eager one."""
SPEEDUP_HEADS = {"speedup": "speedup (eager plain)", COMPILED_SPEEDUP: "speedup (compiled plain)"}
"""How the two speedups are labelled in every table, so that nobody mistakes one for the other."""


def speedup_metrics(records: list[dict]) -> list[str]:
    """``speedup``, and ``speedup_vs_compiled_ar`` where the decode ran the compiled plain decoder too."""
    return ["speedup"] + ([COMPILED_SPEEDUP] if any(r.get(COMPILED_SPEEDUP) is not None for r in records) else [])


def main_table(records: list[dict], domains: list[str], spec: TableSpec | None = None) -> dict:
    """Main comparison: τ and speedup per domain and on average, one row per drafter of ``spec.main`` (in order);
    the speedup over the compiled plain decoder beside the eager one's where the decode measured it."""
    spec = spec or load_spec()
    speeds = speedup_metrics(records)
    tau = aggregate(records, "tau")
    speed = {m: aggregate(records, m) for m in speeds}
    cols = list(domains) + ["avg"]
    rows = []
    for v in spec.main:
        if not any(k[0] == v for k in tau):
            continue
        row = {"variant": v, "label": spec.label(v), "published": spec.published.get(v, "")}
        for d in cols:
            row[f"{d}/tau"] = tau.get((v, d))
            for m in speeds:
                row[f"{d}/{m}"] = speed[m].get((v, d))
        rows.append(row)
    header = (["drafter"] + [f"{d} τ" for d in cols] + [f"{d} {SPEEDUP_HEADS[m]}" for m in speeds for d in cols]
              + ["published (Qwen3-8B)"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["label"]] + [fmt(row[f"{d}/tau"]) for d in cols]
        cells += [fmt(row[f"{d}/{m}"], suffix="x") for m in speeds for d in cols] + [row["published"]]
        lines.append("| " + " | ".join(cells) + " |")
    return {"name": "main", "columns": cols, "speedups": speeds, "rows": rows, "markdown": "\n".join(lines)}


def ablation_table(records: list[dict], spec: TableSpec | None = None) -> dict:
    """The ablations of ``spec.ablations`` (averages over domains; the paper's: head, causal inputs, curriculum)."""
    spec = spec or load_spec()
    tables = {"tau": aggregate(records, "tau"), "speedup": aggregate(records, "speedup")}
    compiled = aggregate(records, COMPILED_SPEEDUP) if COMPILED_SPEEDUP in speedup_metrics(records) else None
    base_tau = aggregate(records, "backbone_tau")  # the backbone's own τ inside a Domino drafter
    rows = []
    for ab in spec.ablations:
        a, b, table = ab["from"], ab["to"], tables[ab["metric"]]
        ca, cb = table.get((a, "avg")), table.get((b, "avg"))
        if ca is None or cb is None:  # a variant this run did not decode (a subset, or no pool to compare)
            continue
        row = {"study": ab["study"], "label": ab["label"], "metric": ab["metric"], "from": a, "to": b,
               "from_value": ca, "to_value": cb, "verdict": compare(ca, cb), "published": ab.get("published", "")}
        if ab.get("inner_backbone"):
            row["backbone_tau_from"] = base_tau.get((a, "avg"))
            row["backbone_tau_to"] = base_tau.get((b, "avg"))
        if ab["metric"] == "speedup" and compiled is not None:  # the same rows over the compiled plain decoder
            cf, ct = compiled.get((a, "avg")), compiled.get((b, "avg"))
            row.update(compiled_from=cf, compiled_to=ct, compiled_verdict=compare(cf, ct))
        rows.append(row)
    header = ["ablation", "metric", "from", "to", "verdict", "backbone τ inside Domino (from → to)"]
    header += [f"{SPEEDUP_HEADS[COMPILED_SPEEDUP]}: from → to, verdict"] if compiled is not None else []
    header += ["published"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        suffix = "x" if r["metric"] == "speedup" else ""
        metric = SPEEDUP_HEADS["speedup"] if r["metric"] == "speedup" else r["metric"]
        inner = (f"{fmt(r.get('backbone_tau_from'))} → {fmt(r.get('backbone_tau_to'))}"
                 if "backbone_tau_from" in r else "")
        cells = [r["label"], metric, fmt(r["from_value"], suffix=suffix), fmt(r["to_value"], suffix=suffix),
                 r["verdict"], inner]
        if compiled is not None:
            cells.append(f"{fmt(r['compiled_from'], suffix='x')} → {fmt(r['compiled_to'], suffix='x')}, "
                         f"{r['compiled_verdict']}" if "compiled_from" in r else "")
        lines.append("| " + " | ".join(cells + [r["published"]]) + " |")
    return {"name": "ablations", "rows": rows, "markdown": "\n".join(lines)}


def records_from_rows(rows: list[dict]) -> list[dict]:
    """Benchmark rows → table records ``{variant, seed, domain, temperature, tau, speedup, ...}``, read from each
    row's :class:`MethodKey`; a drafter decoded with the exact head beside a candidate pool (the plan's
    ``exact_head``) is the variant ``<variant>@full``; Domino's backbone decoded alone (view ``backbone``) is its
    record's ``backbone_tau``."""
    keys = [MethodKey.of(r["key"]) if r["kind"] == "drafter" else None for r in rows]
    pooled = {k.base() for k in keys if k is not None and k.pool is not None}
    inner_tau = {(k.whole(), r["benchmark"], r["temperature"]): r["tau"]
                 for k, r in zip(keys, rows) if k is not None and k.view == "backbone"}
    records = []
    for k, r in zip(keys, rows):
        if k is not None and k.view is not None:
            continue
        if k is not None:
            variant, seed = k.drafter + (EXACT_HEAD if k.base() in pooled and k.pool is None else ""), k.seed
        elif r["method"] == "ar":
            continue
        else:
            variant, seed = r["method"], 0
        rec = {"variant": variant, "seed": int(seed or 0), "domain": r["benchmark"], **r}
        rec["backbone_tau"] = inner_tau.get((k.base(), r["benchmark"], r["temperature"])) if k else None
        records.append(rec)
    return records


def tables_from_rows(rows: list[dict], domains: list[str] | None = None, spec: TableSpec | None = None) -> dict:
    """The main table and the ablations (``{"main", "ablations"}``) of a decode's benchmark rows: what the ablation
    job writes to ``results/`` and the notebook rebuilds from the study run's ``tables/rows.json``. ``domains``:
    the column order (default: the benchmarks in the rows' order)."""
    records = [r for r in records_from_rows(rows) if r["kind"] == "drafter"]
    if domains is None:
        domains = list(dict.fromkeys(r["benchmark"] for r in rows))
    spec = spec or load_spec()
    return {"main": main_table(records, list(domains), spec), "ablations": ablation_table(records, spec)}


def _cell(obj):
    """A (mean, spread) cell → ``{"mean", "spread"}`` in the JSON; anything else unchanged."""
    if isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(x, float) for x in obj):
        return {"mean": obj[0], "spread": obj[1]}
    return obj


def write_table(table: dict, directory: Path, stem: str) -> tuple[Path, Path]:
    """``<stem>.md`` and ``<stem>.json`` (strict JSON: a NaN cell's mean/spread is null) in ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    md, js = directory / f"{stem}.md", directory / f"{stem}.json"
    md.write_text(table["markdown"] + "\n")
    write_json({k: v for k, v in table.items() if k != "markdown"}, js, indent=2, convert=_cell)
    return md, js
