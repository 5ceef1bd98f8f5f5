"""The command behind ``experiments/build_target.py``: build an embedded target from its recipe, optionally ship it.

Importing this module is cheap: the recipe (torch, Lightning) loads once the preset is known, so a mistyped
preset is one line before torch is imported.
"""

from __future__ import annotations

import argparse

from lit_domino.runtime.command import CommandParser, UsageError, run_command

COMMAND_DOC = """Build an embedded target from its recipe (cached, resumable), and optionally ship it with the package.

    python experiments/build_target.py --preset large              # build (or reuse) embedded:large@recipe
    python experiments/build_target.py --preset large --ship       # ... and write lit_domino/assets/targets/large

The shipped copy is what ``load_target("embedded:large")`` loads; see lit_domino/target/embedded.py.
"""
"""The command's description, and ``experiments/build_target.py``'s docstring (tests/test_entry_points.py)."""
PROG = "build_target"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = CommandParser(prog=PROG, description=COMMAND_DOC.split("\n")[0])
    p.add_argument("--preset", default="default", help="an embedded target recipe (default: default)")
    p.add_argument("--ship", action="store_true", help="write the shipped copy into lit_domino/assets/targets/")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    return p.parse_args(argv)


def main(argv=None):
    """Parse and check the preset (no torch yet), then build; bad input is one line ``build_target: error: ...``."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]):
    args = parse_args(argv)
    from lit_domino.target.embedded import preset_config

    cfg = preset_config(args.preset)  # an unknown preset: one line, before torch loads
    if hasattr(cfg, "build"):  # a shaped random target (lit_domino.target.rehearsal): built in seconds, never shipped
        if args.ship:
            raise UsageError(f"--ship: embedded:{args.preset} is a random target built in seconds; nothing to ship")
        built = cfg.build()
        print(f"built {built}")
        return built
    import torch

    from lit_domino.target import recipe as tiny_target

    if args.threads:
        torch.set_num_threads(args.threads)
    built = tiny_target.build_tiny_target(cfg)
    print(f"built {built}: {tiny_target.target_report(cfg)}")
    if args.ship:
        print(f"shipped {tiny_target.ship_target(cfg, built)}")
