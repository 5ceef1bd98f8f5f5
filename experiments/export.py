"""Export a trained drafter to a field format: DFlash (backbone), SpecForge Domino, speculators EAGLE-3.

    python experiments/export.py RUN_OR_DRAFTER_DIR OUT_DIR --format dflash|specforge-domino|eagle3 \\
        [--target embedded:default]

RUN_OR_DRAFTER_DIR is a drafter directory (``save_pretrained``: config.json + model.safetensors) or a
training run directory holding one under ``drafter/``. ``--target`` (a model directory, hub id or
``embedded:<preset>``) binds the drafter first, so the export records the target's name and refuses a
target the drafter was not trained for; without it the drafter's recorded fingerprint is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="drafter directory, or a run directory with drafter/")
    p.add_argument("out", help="directory to write")
    p.add_argument("--format", required=True, choices=["dflash", "specforge-domino", "eagle3"])
    p.add_argument("--target", default=None, help="the target the drafter was trained for (recorded by name)")
    return p.parse_args(argv)


def main(argv=None) -> Path:
    args = parse_args(argv)
    from lit_domino.interop import export_drafter  # here, so that --help answers without importing torch
    from lit_domino.models import load_drafter
    from lit_domino.target import load_target

    source = Path(args.source).expanduser()
    if (source / "drafter" / "config.json").is_file():
        source = source / "drafter"
    target = load_target(args.target) if args.target else None
    drafter = load_drafter(source, target=target)
    out = export_drafter(drafter, args.out, format=args.format, target=target)
    print(f"wrote {args.format} drafter to {out}")
    return out


if __name__ == "__main__":
    main()
