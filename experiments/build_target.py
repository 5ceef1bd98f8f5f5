"""Build an embedded target from its recipe (cached, resumable), and optionally ship it with the package.

    python experiments/build_target.py --preset large              # build (or reuse) embedded:large@recipe
    python experiments/build_target.py --preset large --ship       # ... and write lit_domino/assets/targets/large

The shipped copy is what ``load_target("embedded:large")`` loads; see lit_domino/target/embedded.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lit_domino.runtime.command import CommandParser, run_command  # noqa: E402 (light: no torch)


def main(argv=None):
    p = CommandParser(prog="build_target", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="default", help="an embedded target recipe (default: default)")
    p.add_argument("--ship", action="store_true", help="write the shipped copy into lit_domino/assets/targets/")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = p.parse_args(argv)
    from lit_domino.target.embedded import preset_config

    cfg = preset_config(args.preset)  # an unknown preset: one line, before torch loads
    import torch

    from lit_domino.target import recipe as tiny_target

    if args.threads:
        torch.set_num_threads(args.threads)
    built = tiny_target.build_tiny_target(cfg)
    print(f"built {built}: {tiny_target.target_report(cfg)}")
    if args.ship:
        print(f"shipped {tiny_target.ship_target(cfg, built)}")


if __name__ == "__main__":
    run_command("build_target", main)
