"""The tree study (issue 31, item 5): do draft trees pay, per drafter, builder, budget and domain?

Stages (each printed as it runs):

1. the target (``load_target``);
2. per drafter (backbone, Domino, DSpark, DFlash 2, EAGLE-3): the ablation's base drafter
   (``experiment.train_variant`` on the preset's config, the ablation's cache: trained if missing, else reused);
   a drafter without a tree builder (the small LM) is skipped with a note;
3. the verify-cost curve C_v(n) of the target on this machine (:func:`lit_domino.decoding.cost.measure_verify_cost`,
   printed), then ONE :func:`lit_domino.decoding.harness.benchmark` call: per domain, at T = 0, the AR baseline
   and every drafter's chain (tree off) and each tree builder it has (``tree_builders``: backbone ``ddtree``;
   Domino, DSpark, DFlash 2 ``ddtree`` and ``path``; EAGLE-3 ``eagle`` and ``path``) at every budget and
   cost-aware (``TreeConfig(cost=C_v, budget=cost_cap)``), all interleaved per prompt. The rows (and the curve
   they were measured with) are cached under a key of the drafters and the evaluation settings;
4. tables in ``results/trees/trees-<preset>.md|json``, the figure ``trees-<preset>.png`` and MLflow
   (experiment ``trees-<preset>``, a ``tables-<preset>`` run with every cell as a metric and the files as
   artifacts).

Every drafter row must reproduce the AR baseline's tokens (T = 0): a row that does not stops the study with an
error (after the rows are written, for the diagnosis).

The GPU projection (labelled so everywhere): the measured rows with each round's verify time moved from the
measured curve to a GPU-shaped one, flat up to 64 nodes (C_v(n) = C_v(1)): verify' = max(verify - (C_v(n̄) -
C_v(1)), verify · C_v(1) / C_v(n̄)) with n̄ the row's nodes per round (the larger, i.e. the more conservative of
the two ways to remove the width's cost), draft and other time as measured, τ as measured;
projected speedup = speedup · (draft + verify + other) / (draft + verify' + other).

Sizing (2 CPU cores shared, drafters cached): the decode runs :func:`method_count` decodes per prompt (42 with the
default drafters, builders and budgets: 1 AR + 5 backbone + 9 Domino + 9 DSpark + 9 DFlash 2 + 9 EAGLE-3), so its
time scales with prompts × tokens; the default preset's size comes from a smoke timing (the arithmetic is in the
study file, ``configs/studies/trees.yaml``; docs/results.md has the default decode's run time).
"""

from __future__ import annotations

import time
from pathlib import Path

from lit_domino.data.benchmarks import load_benchmark
from lit_domino.decoding.cost import VerifyCost, measure_verify_cost
from lit_domino.decoding.harness import benchmark
from lit_domino.decoding.metric_names import row_metrics
from lit_domino.decoding.tree import TreeConfig
from lit_domino.runtime import cache
from lit_domino.runtime.jsonio import finite, write_json
from lit_domino.runtime.paths import project_root
from lit_domino.runtime.threads import pinned_threads
from lit_domino.studies.common import check_lossless, finite_mean, flat_verify_speedup, fmt, log_metrics, mlflow_name
from lit_domino.studies.skeleton import Stages
# The plan lives apart; its names stay importable from here.
from lit_domino.studies.trees_plan import STUDY_FILE, TREE_BUILDERS, TreesPlan, builders_of, study_plan  # noqa: F401
from lit_domino.training.configs import load_config

GPU_FLAT_NODES = 64
"""The GPU-shaped verify curve of the projection: C_v(n) = C_v(1) for n up to this many nodes."""
PROJECTION = (f"projection: the measured rows with the verify cost of a GPU-shaped curve (C_v(n) = C_v(1) for "
              f"n <= {GPU_FLAT_NODES}); τ and draft time as measured on this CPU")
ROW_KEYS = ("tau", "speedup", "draft_ms_per_round", "verify_ms_per_round", "nodes_per_round", "projected_speedup")


# --------------------------------------------------------------------------- plan


def tree_configs(plan: TreesPlan, curve: VerifyCost | None) -> list[TreeConfig | None]:
    """The tree settings decoded: None (the chain), then per builder every budget and (with a curve) cost-aware."""
    out: list[TreeConfig | None] = [None]
    for b in dict.fromkeys(b for bs in plan.builders.values() for b in bs):
        out += [TreeConfig(b, budget=n, top_k=plan.top_k) for n in plan.budgets]
        if plan.cost_aware and curve is not None:
            out.append(TreeConfig(b, budget=plan.cost_cap, top_k=plan.top_k, cost=curve))
    return out


def method_of(tree_label: str | None) -> dict:
    """A row's tree label (``key.tree``) → ``{"builder", "budget" (0: chain), "cost", "name"}``."""
    if tree_label is None:
        return {"builder": "chain", "budget": 0, "cost": False, "name": "chain"}
    core, *flags = tree_label.split("+")
    builder, _, sizes = core.partition(":")
    budget = int(sizes.partition("k")[0])
    cost = "cost" in flags
    return {"builder": builder, "budget": budget, "cost": cost,
            "name": f"{builder}:cost<={budget}" if cost else f"{builder}:{budget}"}


def method_count(plan: TreesPlan) -> int:
    """Decodes per prompt: the AR baseline and every drafter × its tree settings."""
    per = len(plan.budgets) + int(plan.cost_aware)
    return 1 + sum(1 + per * len(plan.builders[d]) for d in plan.drafters)


# --------------------------------------------------------------------------- measure


def check_budgets(target, drafters: dict, trees: list, prompts: dict) -> None:
    """Every tree fits every drafter's context with the longest prompt (the engine's check, before any decode)."""
    from lit_domino.decoding.engine import context_limit
    from lit_domino.decoding.harness import prompt_ids
    from lit_domino.decoding.tree import check_tree

    lengths = []
    for items in prompts.values():
        for item in items:
            ids = prompt_ids(item)
            if ids is None and getattr(item, "turns", None) and target.tokenizer is not None:
                ids = target.chat_ids([{"role": "user", "content": item.turns[0]}])
            lengths.append(len(ids or []))
    for name, drafter in drafters.items():
        for tree in trees:
            if tree is not None and tree.builder in drafter.tree_builders:
                check_tree(tree, target, drafter, compile=False, longest_prompt=max(lengths, default=1),
                           limit=context_limit(target, drafter))


def measure(target, drafters: dict, prompts: dict, plan: TreesPlan, progress: bool = True) -> list[dict]:
    """The verify-cost curve, then the one interleaved benchmark → its rows plus one ``{"kind": "verify_cost"}``
    record (the curve the cost-aware rows used)."""
    with pinned_threads(plan.threads or None):  # the curve on the threads the rounds run on
        check_budgets(target, drafters, tree_configs(plan, None) + [TreeConfig(budget=plan.cost_cap)], prompts)
        curve = measure_verify_cost(target, repeats=plan.curve_repeats)
        trees = tree_configs(plan, curve)
        rows = benchmark(target, drafters, prompts, max_new_tokens=int(plan.max_new_tokens), trees=trees,
                         pool_sizes=[plan.pool_size], repeats=plan.repeats, hf_baseline=False,
                         progress=progress, seed=int(plan.seed))
    return rows + [{"kind": "verify_cost", "widths": list(curve.widths), "seconds": list(curve.seconds)}]


def split_rows(rows: list[dict]) -> tuple[list[dict], VerifyCost]:
    """The benchmark rows and the verify-cost curve of :func:`measure`'s output."""
    curves = [r for r in rows if r.get("kind") == "verify_cost"]
    if len(curves) != 1:
        raise ValueError(f"the tree study's rows hold {len(curves)} verify-cost records, expected 1")
    curve = VerifyCost(tuple(curves[0]["widths"]), tuple(curves[0]["seconds"]))
    return [r for r in rows if r.get("kind") != "verify_cost"], curve


# --------------------------------------------------------------------------- tables




def projected_speedup(row: dict, curve: VerifyCost) -> float:
    """The row's speedup with its verify time on the GPU-shaped curve (module docstring; a projection)."""
    v, n = row.get("verify_ms_per_round"), row.get("nodes_per_round")
    if not finite(v) or not finite(n) or n > GPU_FLAT_NODES:
        return float("nan")
    c1, cn = 1e3 * curve.seconds_at(1), 1e3 * curve.seconds_at(max(1, round(n)))
    return flat_verify_speedup(row, max(v - (cn - c1), v * c1 / cn))


def records(rows: list[dict], curve: VerifyCost) -> list[dict]:
    """One record per drafter × method × domain (T = 0): the table's cells and the projection."""
    out = []
    for r in rows:
        if r.get("kind") != "drafter" or float(r.get("temperature", 0.0)) != 0.0:
            continue
        m = method_of((r.get("key") or {}).get("tree"))
        rec = {"drafter": r["drafter"], "method": m["name"], "builder": m["builder"], "budget": m["budget"],
               "cost_aware": m["cost"], "domain": r["benchmark"], "label": r["method"],
               **{k: r.get(k) for k in ROW_KEYS[:-1]}, "other_ms_per_round": r.get("other_ms_per_round"),
               "match_baseline": r.get("match_baseline"), "accepted_rank_counts": r.get("accepted_rank_counts") or []}
        rec["projected_speedup"] = projected_speedup(r, curve)
        out.append(rec)
    return out


def _avg_rows(recs: list[dict], domains: list[str]) -> list[dict]:
    """Per drafter × method: the mean over domains of each cell, and τ / speedup relative to the drafter's chain."""
    groups: dict[tuple, list[dict]] = {}
    for rec in recs:
        groups.setdefault((rec["drafter"], rec["method"]), []).append(rec)
    out = []
    for (drafter, method), rs in groups.items():
        avg = {"drafter": drafter, "method": method, "builder": rs[0]["builder"], "budget": rs[0]["budget"],
               "cost_aware": rs[0]["cost_aware"], "domain": "avg", **{k: finite_mean(x.get(k) for x in rs) for k in ROW_KEYS}}
        out.append(avg)
    chains = {a["drafter"]: a for a in out if a["method"] == "chain"}
    for a in out:
        c = chains.get(a["drafter"]) or {}
        for k in ("tau", "speedup", "projected_speedup"):
            a[f"{k}_vs_chain"] = a[k] / c[k] if finite(a[k]) and finite(c.get(k)) and c[k] else float("nan")
    return out


def trees_table(recs: list[dict], plan: TreesPlan) -> dict:
    """Per drafter × method × domain (and the domain mean): τ, speedup, draft / verify ms per round, nodes
    verified per round and the GPU projection's speedup."""
    domains = list(plan.prompts)
    avg = _avg_rows(recs, domains)
    lines = ["| drafter | method | domain | τ | speedup vs AR | draft ms/round | verify ms/round | nodes/round | "
             "projected speedup (GPU-shaped C_v) |", "|---|---|---|---|---|---|---|---|---|"]
    for a in avg:
        cells = [x for x in recs if x["drafter"] == a["drafter"] and x["method"] == a["method"]]
        for rec in sorted(cells, key=lambda x: domains.index(x["domain"])) + [a]:
            lines.append(f"| {rec['drafter']} | {rec['method']} | {rec['domain']} | {fmt(rec['tau'])} | "
                         f"{fmt(rec['speedup'], suffix='x')} | {fmt(rec['draft_ms_per_round'])} | "
                         f"{fmt(rec['verify_ms_per_round'])} | {fmt(rec['nodes_per_round'], 1)} | "
                         f"{fmt(rec['projected_speedup'], suffix='x')} |")
    return {"name": "trees", "rows": recs, "average": avg, "projection": PROJECTION, "markdown": "\n".join(lines)}


def summary_table(avg: list[dict]) -> dict:
    """Per drafter × method, over the domains: τ and speedup, each against the drafter's chain, and the projection."""
    lines = ["| drafter | method | τ | τ vs chain | speedup | speedup vs chain | projected speedup (GPU) | "
             "projected vs chain |", "|---|---|---|---|---|---|---|---|"]
    for a in avg:
        lines.append(f"| {a['drafter']} | {a['method']} | {fmt(a['tau'])} | {fmt(a['tau_vs_chain'], suffix='x')} | "
                     f"{fmt(a['speedup'], suffix='x')} | {fmt(a['speedup_vs_chain'], suffix='x')} | "
                     f"{fmt(a['projected_speedup'], suffix='x')} | {fmt(a['projected_speedup_vs_chain'], suffix='x')} |")
    return {"name": "summary", "rows": avg, "projection": PROJECTION, "markdown": "\n".join(lines)}


def rank_fractions(counts: list[int]) -> dict:
    """Accepted-rank counts (index = sibling rank) → ``{"accepted", "rank0", "rank1", "rank2+"}`` (fractions)."""
    total = sum(counts)
    if not total:
        return {"accepted": 0, "rank0": float("nan"), "rank1": float("nan"), "rank2+": float("nan")}
    return {"accepted": total, "rank0": counts[0] / total, "rank1": (counts[1] if len(counts) > 1 else 0) / total,
            "rank2+": sum(counts[2:]) / total}


def _add(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def siblings_table(recs: list[dict]) -> dict:
    """How often an accepted node was its parent's rank-0, rank-1 or lower candidate: per builder (all drafters,
    budgets and domains pooled), then per drafter × builder. The chain's nodes are all rank 0: not listed."""
    per_builder: dict[str, list[int]] = {}
    per_pair: dict[tuple, list[int]] = {}
    for rec in recs:
        if rec["builder"] == "chain":
            continue
        c = rec.get("accepted_rank_counts") or []
        per_builder[rec["builder"]] = _add(per_builder.get(rec["builder"], []), c)
        per_pair[(rec["drafter"], rec["builder"])] = _add(per_pair.get((rec["drafter"], rec["builder"]), []), c)
    rows = [{"drafter": "all", "builder": b, **rank_fractions(c)} for b, c in per_builder.items()]
    rows += [{"drafter": d, "builder": b, **rank_fractions(c)} for (d, b), c in per_pair.items()]
    lines = ["| builder | drafter | accepted nodes | rank 0 | rank 1 | rank ≥ 2 |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['builder']} | {r['drafter']} | {r['accepted']} | {fmt(r['rank0'], 3)} | "
                     f"{fmt(r['rank1'], 3)} | {fmt(r['rank2+'], 3)} |")
    lines += ["", "An accepted node's rank among its parent's candidates (0 = the drafter's top pick there); "
              "rank ≥ 1 is what a tree adds over the chain."]
    return {"name": "siblings", "rows": rows, "markdown": "\n".join(lines)}


def cost_table(curve: VerifyCost, recs: list[dict]) -> dict:
    """The measured verify-cost curve C_v(n) and its ratio to C_v(1); beside it, the verify time per round the
    decode itself saw, per budget (every drafter and domain pooled; chain = budget 0): the curve in situ."""
    rows = [{"nodes": w, "ms": 1e3 * s, "ratio": s / curve.seconds_at(1)} for w, s in zip(curve.widths, curve.seconds)]
    lines = ["| n (nodes beyond the anchor) | C_v(n) ms | C_v(n) / C_v(1) |", "|---|---|---|"]
    lines += [f"| {r['nodes']} | {r['ms']:.3f} | {r['ratio']:.2f} |" for r in rows]
    in_decode = []
    for budget in sorted({r["budget"] for r in recs if not r["cost_aware"]}):
        sel = [r for r in recs if r["budget"] == budget and not r["cost_aware"]]
        in_decode.append({"budget": budget, "nodes_per_round": finite_mean(r["nodes_per_round"] for r in sel),
                          "verify_ms_per_round": finite_mean(r["verify_ms_per_round"] for r in sel)})
    lines += ["", "| budget (0 = chain) | nodes per round | verify ms per round in the decode |", "|---|---|---|"]
    lines += [f"| {r['budget']} | {fmt(r['nodes_per_round'], 1)} | {fmt(r['verify_ms_per_round'])} |" for r in in_decode]
    lines += ["", f"GPU projection's curve: C_v(n) = C_v(1) = {1e3 * curve.seconds_at(1):.3f} ms for n <= "
                  f"{GPU_FLAT_NODES} ({PROJECTION})."]
    return {"name": "verify_cost", "rows": rows, "in_decode": in_decode, "markdown": "\n".join(lines)}


def figure(avg: list[dict], path: Path) -> Path:
    """τ, speedup and the projected speedup against the budget, one line per drafter × builder (the chain at
    budget 0 on every line of its drafter; the cost-aware tree a star at its mean nodes per round)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("tau", "τ (tokens per round)"), ("speedup", "speedup vs AR (measured)"),
              ("projected_speedup", "speedup vs AR (projection: GPU-shaped C_v)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.0))
    chains = {a["drafter"]: a for a in avg if a["builder"] == "chain"}
    pairs = dict.fromkeys((a["drafter"], a["builder"]) for a in avg if a["builder"] != "chain")
    for ax, (key, title) in zip(axes, panels):
        for i, (drafter, builder) in enumerate(pairs):
            pts = sorted((a["budget"], a[key]) for a in avg if a["drafter"] == drafter and a["builder"] == builder
                         and not a["cost_aware"])
            if drafter in chains:
                pts = [(0, chains[drafter][key])] + pts
            color = f"C{i % 10}"
            ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", color=color, label=f"{drafter} {builder}")
            for a in avg:
                if a["drafter"] == drafter and a["builder"] == builder and a["cost_aware"]:
                    ax.plot([a["nodes_per_round"]], [a[key]], marker="*", markersize=12, color=color)
        if key != "tau":
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("tree budget, nodes per round (0 = chain)")
    axes[0].legend(fontsize=7)
    fig.suptitle("★ = the cost-aware tree at its mean nodes per round", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table_metrics(tables: dict, curve: VerifyCost) -> dict[str, float]:
    """Every cell as an MLflow metric: ``{drafter}.{method}.{domain|avg}.{key}`` (the projection's key says so),
    ``siblings.{builder}.{drafter}.{rank0|rank1|rank2+}`` and ``verify_cost.n{n}_ms``."""
    cells = tables["trees"]["rows"] + tables["trees"]["average"]
    out = row_metrics(cells, ROW_KEYS, by=lambda r: (r["drafter"], r["method"], r["domain"]), sep=".")
    out.update(row_metrics(tables["siblings"]["rows"], ("rank0", "rank1", "rank2+"),
                           by=lambda r: ("siblings", r["builder"], r["drafter"]), sep="."))
    out.update({f"verify_cost.n{w}_ms": 1e3 * s for w, s in zip(curve.widths, curve.seconds)})
    return {mlflow_name(k): v for k, v in out.items()}


def log_to_mlflow(plan: TreesPlan, tables: dict, curve: VerifyCost, files: list[Path]) -> str:
    """A ``tables-<preset>`` run in experiment ``trees-<preset>``: every cell a metric, the files as artifacts."""
    import mlflow
    from lit_domino.runtime.tracking import mlflow_run, open_client

    preset = plan.preset
    with mlflow_run(f"trees-{preset}", f"tables-{preset}", tags={"table": "trees", "preset": preset}) as run:
        mlflow.log_params({"drafters": ",".join(plan.drafters), "budgets": ",".join(map(str, plan.budgets)),
                           "builders": ";".join(f"{d}:{','.join(b)}" for d, b in plan.builders.items()),
                           "top_k": plan.top_k, "cost_cap": plan.cost_cap, "repeats": plan.repeats,
                           "max_new_tokens": plan.max_new_tokens,
                           "pool_size": "full" if plan.pool_size is None else plan.pool_size})
        log_metrics(open_client(), run.info.run_id, table_metrics(tables, curve))
        for path in files:
            mlflow.log_artifact(str(path), "tables")
        return run.info.run_id


def report(rows: list[dict], plan: TreesPlan, out_dir: Path, mlflow_enabled: bool = True,
           seconds: float = 0.0) -> dict:
    """:func:`measure`'s rows → the tables, figure, JSON and MLflow run; raises if any row is not lossless."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    preset = plan.preset
    bench_rows, curve = split_rows(rows)
    recs = records(bench_rows, curve)
    main = trees_table(recs, plan)
    tables = {"trees": main, "summary": summary_table(main["average"]), "siblings": siblings_table(recs),
              "verify_cost": cost_table(curve, recs)}
    write_json(bench_rows, out_dir / f"rows-{preset}.json")
    check_lossless(bench_rows, out_dir / f"rows-{preset}.json", "tree study")
    md = out_dir / f"trees-{preset}.md"
    sections = [f"# Tree study ({preset})", "", "Speedup = our AR time per token / the method's (prefill excluded), "
                "T = 0, every row token-identical to AR.", *[f"- {note}" for note in plan.skipped.values()], "",
                "## Summary (mean over domains)", "", tables["summary"]["markdown"], "",
                "## Per domain", "", main["markdown"], "", f"Projected speedup: {PROJECTION}.", "",
                "## Sibling ranks of accepted nodes", "", tables["siblings"]["markdown"], "",
                "## Verify-cost curve (measured on this machine)", "", tables["verify_cost"]["markdown"], ""]
    md.write_text("\n".join(sections))
    js = write_json({"preset": preset, "plan": plan.as_dict(), "seconds": round(seconds, 1),
                     "projection": PROJECTION,
                     **{name: {k: v for k, v in t.items() if k != "markdown"} for name, t in tables.items()}},
                    out_dir / f"trees-{preset}.json")
    png = figure(main["average"], out_dir / f"trees-{preset}.png")
    files = [md, js, png]
    run_id = log_to_mlflow(plan, tables, curve, files) if mlflow_enabled else None
    return {"tables": tables, "files": files, "run_id": run_id, "curve": curve, "markdown": "\n".join(sections)}


# --------------------------------------------------------------------------- the study


def eval_key(plan: TreesPlan, trained: dict, target) -> dict:
    """The decoded rows' cache key: every drafter, the evaluation settings and the target."""
    return {"drafters": {k: str(t.drafter_dir) for k, t in trained.items()}, "plan": plan.key_fields(),
            "target": target.fingerprint()}


def run_trees_study(preset: str = "smoke", drafters=None, builders=None, budgets=None, top_k=None,
                    out_dir: Path | None = None, progress: bool = True, mlflow_enabled: bool = True) -> dict:
    """The whole study (module docstring) → :func:`report`'s dict plus ``plan``, ``rows`` and ``seconds``."""
    from lit_domino.interop import load_drafter
    from lit_domino.target.load import load_target
    from lit_domino.training.experiment import drafter_artifact, train_variant

    stages = Stages("trees")
    plan = study_plan(preset, drafters, builders, budgets, top_k)
    out_dir = Path(out_dir or project_root() / "results" / "trees")
    for note in plan.skipped.values():
        stages.log(note)
    cfgs = {kind: load_config(kind, preset, plan.seed, {}) for kind in plan.drafters}  # the ablation's configs
    target_spec = next(iter(cfgs.values()))["data"]["target"]
    stages.log(f"preset {preset}: drafters {plan.builders}, budgets {plan.budgets} + cost-aware <= "
               f"{plan.cost_cap}, top-k {plan.top_k}; {method_count(plan)} decodes per prompt")
    stages.log(f"stage 1/4 target {target_spec}")
    target = load_target(target_spec)
    trained = {}
    for i, (kind, cfg) in enumerate(cfgs.items()):
        cached = cache.is_complete(drafter_artifact(cfg))
        stages.log(f"stage 2/4 [{i + 1}/{len(cfgs)}] {kind}: base drafter{' (cached)' if cached else ''}")
        trained[kind] = train_variant(cfg, experiment=f"trees-{preset}", table="trees", progress=progress)
    def decode() -> list[dict]:
        t1 = time.time()
        prompts = {name: load_benchmark(name, int(n)) for name, n in plan.prompts.items()}
        loaded = {k: load_drafter(t.drafter_dir, target=target) for k, t in trained.items()}
        stages.log(f"stage 3/4 verify-cost curve, then decode {method_count(plan)} methods on {plan.prompts} "
                   f"x {plan.max_new_tokens} tokens")
        rows = measure(target, loaded, prompts, plan, progress)
        stages.log(f"stage 3/4 decode took {time.time() - t1:.0f} s")
        return rows

    rows = stages.decode(eval_key(plan, trained, target), f"trees-{preset}", decode)
    stages.log("stage 4/4 tables")
    out = report(rows, plan, out_dir, mlflow_enabled, seconds=time.time() - stages.t0)
    print("\n" + out["markdown"])
    where = f"; MLflow experiment trees-{preset}" if out["run_id"] else ""
    print(f"\nwritten to {out_dir}{where}")
    seconds = stages.done()
    return {**out, "plan": plan, "rows": rows, "seconds": seconds}
