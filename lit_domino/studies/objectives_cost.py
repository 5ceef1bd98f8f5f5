"""What each training objective costs per step: milliseconds per optimizer step (forward, backward, AdamW) of each
drafter under each objective row of the objectives study, and its ratio to the drafter's own loss.

Measured in one process, interleaved (every repeat steps every drafter x objective once, in turn, so drifting
background load hits all alike), on one thread, on a synthetic batch of the preset's shapes (its batch size,
sequence length, anchors, block size and feature layers) against a random target of the preset's embedded recipe:
a step's cost depends on the shapes only, so nothing is built or trained first. The median over the repeats.
"""

from __future__ import annotations

import statistics
import time

from lit_domino.studies.objectives import name_of, rows_of, study_plan


def _target(spec: str):
    """A random target of the embedded recipe ``spec`` names (its shapes), or the target itself otherwise."""
    from lit_domino.target.embedded import parse_spec
    from lit_domino.target.load import load_target
    from lit_domino.testing import random_target

    if not spec.startswith("embedded:"):
        return load_target(spec)
    recipe, _ = parse_spec(spec[len("embedded:"):])
    return random_target(vocab_size=recipe.vocab_size, hidden_size=recipe.hidden_size, num_layers=recipe.num_layers,
                         num_heads=recipe.num_heads, num_kv_heads=recipe.num_kv_heads,
                         intermediate_size=recipe.intermediate_size, max_positions=recipe.max_positions)


def _batch(data: dict, width: int, vocab: int, seed: int = 0) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    b, T, A = int(data["batch_size"]), int(data["max_length"]), int(data["num_anchors"])
    loss_mask = torch.ones(b, T, dtype=torch.long)
    loss_mask[:, : T // 4] = 0  # a prompt
    return {"input_ids": torch.randint(0, vocab - 1, (b, T), generator=g),
            "features": torch.randn(b, T, width, generator=g), "loss_mask": loss_mask,
            "attention_mask": torch.ones(b, T, dtype=torch.long),
            "anchors": torch.randint(T // 4, T - 2, (b, A), generator=g), "anchor_mask": torch.ones(b, A, dtype=bool)}


def _module(drafter: str, preset: str, spec, target):
    """The drafter's training module on ``preset`` with objective ``spec``, built on the preset's feature layers,
    and its synthetic batch; Domino mid-curriculum (λ = 0.5: both terms in the graph)."""
    import torch

    from lit_domino.training.configs import load_config, module_class, resolve_feature_rule

    cfg = load_config(drafter, preset, 0)
    cls, data = module_class(cfg), cfg["data"]
    init = {k: v for k, v in (cfg["model"].get("init_args") or {}).items() if k not in ("target", "block_size")}
    module = cls(**init, target=target, block_size=int(data["block_size"]), objective=spec)
    rule = resolve_feature_rule({}, cls, spec)["feature_rule"]
    layers = target.layer_ids(rule, int(data.get("num_feature_layers") or 3))
    module.build_drafter(feature_layers=layers)
    module.current_lambda = lambda: 0.5
    optimizer = torch.optim.AdamW([p for p in module.drafter.parameters() if p.requires_grad], lr=1e-4)
    return module, optimizer, _batch(data, len(layers) * target.hidden_size, target.vocab_size)


def step_costs(preset: str = "smoke", drafters=None, objectives=None, repeats: int = 5, warmup: int = 1) -> list[dict]:
    """``[{"drafter", "objective", "ms", "ratio"}]``: the median ms per step over ``repeats`` interleaved rounds (after
    ``warmup``) of every drafter x objective row, and its ratio to the drafter's ``own`` row."""
    import torch

    from lit_domino.training.configs import load_config

    plan = study_plan(preset, drafters, objectives, seeds=[0])
    target = _target(load_config(plan.drafters[0], preset, 0)["data"]["target"])
    runs = {}
    for drafter in plan.drafters:
        for row in rows_of(plan, drafter):
            runs[(drafter, row)] = _module(drafter, preset, plan.specs[row], target)
    times = {key: [] for key in runs}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for r in range(warmup + repeats):
            for key, (module, optimizer, batch) in runs.items():
                t = time.perf_counter()
                module.forward_step(batch, "train").loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if r >= warmup:
                    times[key].append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    ms = {key: 1e3 * statistics.median(v) for key, v in times.items()}
    return [{"drafter": d, "objective": row, "name": name_of(d, row), "ms": round(m, 2),
             "ratio": round(m / ms[(d, "own")], 3)} for (d, row), m in ms.items()]


def cost_table(costs: list[dict]) -> str:
    """Markdown: objective rows x drafters, ms per step (× the drafter's own loss)."""
    drafters = list(dict.fromkeys(c["drafter"] for c in costs))
    rows = list(dict.fromkeys(c["objective"] for c in costs))
    cell = {(c["drafter"], c["objective"]): f"{c['ms']:.1f} ms ({c['ratio']:.2f}x)" for c in costs}
    lines = ["| objective | " + " | ".join(drafters) + " |", "|---|" + "---|" * len(drafters)]
    lines += ["| " + " | ".join([row] + [cell.get((d, row), "–") for d in drafters]) + " |" for row in rows]
    return "\n".join(lines)
