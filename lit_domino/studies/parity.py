"""Behaviour snapshots: prove that a refactor changed nothing a researcher can see.

:func:`capture` trains every variant of the ablation study under a preset (seed 0, through ``train_variant``, in the
current cache) and records what the suite's users see: the logged ``train/loss`` curve, the final
validation metrics, and for every evaluation prompt the tokens, τ and accepted-per-round of greedy
speculative decoding, of T = 1 sampling with a fixed seed, and with a DLoop gate. :func:`compare`
reports the largest differences between two snapshots. Run ``capture`` before and after a change,
each in its own cache (``LIT_DOMINO_CACHE``, ``MLFLOW_TRACKING_URI``)::

    python experiments/parity.py capture before.json      # on the old commit
    python experiments/parity.py capture after.json       # on the new one
    python experiments/parity.py compare before.json after.json
"""

from __future__ import annotations

import json
from pathlib import Path

from lit_domino.training.configs import PRESETS, load_config
from lit_domino.runtime.command import CommandParser, UsageError, run_command

# torch, MLflow and the models load inside capture(): the command's input is checked before them
BENCHMARKS = ("embedded-math", "embedded-code", "embedded-chat")
GATE_SPEC = {"threshold": -1.0, "max_stages": 3}
"""A loose DLoop gate, so later stages are really drafted on the smoke drafters."""


def capture(out: str | Path, preset: str = "smoke", prompts: int = 2, max_new_tokens: int = 32) -> dict:
    """Train (or reuse) every variant at seed 0 and record its losses and decodes into ``out`` (JSON)."""
    import torch

    from lit_domino.data.benchmarks import load_benchmark
    from lit_domino.decoding import DLoopConfig, generate
    from lit_domino.training.experiment import train_variant
    from lit_domino.interop import load_drafter
    from lit_domino.models.capabilities import capabilities_of
    from lit_domino.runtime.threads import pinned_threads
    from lit_domino.runtime.jsonio import write_json
    from lit_domino.studies.tables import load_spec
    from lit_domino.target.load import load_target
    from lit_domino.runtime.tracking import open_client

    gate = DLoopConfig(**GATE_SPEC)
    client = open_client()
    snapshot = {}
    with pinned_threads(1):
        for variant in load_spec().variants:  # the ablation study's variants
            trained = train_variant(load_config(variant, preset, 0), experiment=f"parity-{preset}", progress=False)
            target = load_target(load_config(variant, preset, 0)["data"]["target"])
            history = sorted(client.get_metric_history(trained.run_id, "train/loss"), key=lambda m: m.step)
            drafter = load_drafter(trained.drafter_dir, target=target)
            decodes = {}
            for name in BENCHMARKS:
                for i, item in enumerate(load_benchmark(name, prompts)):
                    ids = torch.tensor([target.chat_ids([{"role": "user", "content": item.turns[0]}])])
                    greedy = generate(target, drafter, ids, max_new_tokens=max_new_tokens)
                    sample = generate(target, drafter, ids, max_new_tokens=max_new_tokens, temperature=1.0, seed=123)
                    row = {"tokens": greedy.tokens, "tau": greedy.tau, "accepted": greedy.accepted_per_round,
                           "sample_tokens": sample.tokens, "sample_tau": sample.tau}
                    if capabilities_of(drafter).loop_training:
                        looped = generate(target, drafter, ids, max_new_tokens=max_new_tokens, dloop=gate)
                        row.update(dloop_tokens=looped.tokens, dloop_tau=looped.tau)
                    decodes[f"{name}/{i}"] = row
            snapshot[variant] = {"train_loss": [[m.step, m.value] for m in history],
                                 "val": {k: v for k, v in trained.report.items() if k.startswith("val/")},
                                 "decode": decodes}
    write_json(snapshot, out)
    return snapshot


def compare(a: dict, b: dict) -> list[dict]:
    """Per variant: the largest |Δ| of the loss curve and validation metrics, and whether every decode matched."""
    rows = []
    for variant in sorted(set(a) | set(b)):
        if variant not in a or variant not in b:
            rows.append({"variant": variant, "missing_in": "before" if variant not in a else "after"})
            continue
        x, y = a[variant], b[variant]
        same_steps = [s for s, _ in x["train_loss"]] == [s for s, _ in y["train_loss"]]
        loss = max((abs(p - q) for (_, p), (_, q) in zip(x["train_loss"], y["train_loss"])), default=0.0)
        val = max((abs(x["val"][k] - y["val"].get(k, float("nan"))) for k in x["val"]), default=0.0)
        decodes = {k: x["decode"][k] == y["decode"].get(k) for k in x["decode"]}
        rows.append({"variant": variant, "loss_points": len(x["train_loss"]), "same_steps": same_steps,
                     "max_abs_loss_diff": loss, "max_abs_val_diff": val,
                     "decodes_identical": f"{sum(decodes.values())}/{len(decodes)}"})
    return rows


PROG = "parity.py"


def read_snapshot(path: str) -> dict:
    """A snapshot written by :func:`capture`; a missing or unreadable file is a :class:`UsageError` naming it."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"snapshot {path!r} " + ("is not a file" if p.exists() else "does not exist"))
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"snapshot {path!r} is not readable JSON ({type(err).__name__}: {err})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) and "decode" in v for v in data.values()):
        raise UsageError(f"snapshot {path!r} is not a parity snapshot (parity.py capture writes one)")
    return data


def main(argv=None) -> None:
    """``experiments/parity.py capture OUT [--preset P]`` | ``compare BEFORE AFTER``; errors are one line."""
    run_command(PROG, _run, argv)


def _run(argv: list[str]) -> None:
    parser = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    cap = sub.add_parser("capture", help="train every variant (seed 0) and snapshot losses and decodes")
    cap.add_argument("out")
    cap.add_argument("--preset", default="smoke", choices=PRESETS)
    cmp_ = sub.add_parser("compare", help="largest differences between two snapshots")
    cmp_.add_argument("before")
    cmp_.add_argument("after")
    args = parser.parse_args(argv)
    if args.cmd == "capture":
        out = Path(args.out).expanduser()
        if out.is_dir() or not out.parent.is_dir():
            raise UsageError(f"output {args.out!r}: " + ("is a directory" if out.is_dir() else
                                                         f"its directory {str(out.parent)!r} does not exist"))
        capture(out, args.preset)
        return
    before, after = read_snapshot(args.before), read_snapshot(args.after)
    for row in compare(before, after):
        print(row)
