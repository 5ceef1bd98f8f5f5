"""The export command behind ``experiments/export.py``: a trained drafter written in a field format.

Importing this module is cheap (the format modules, torch and the target load inside :func:`main`'s body,
once the paths and the format are checked), so bad input is answered in well under a second.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lit_domino.interop import FORMAT_KINDS  # light: the format modules load on first use
from lit_domino.runtime.command import CommandParser, UsageError, run_command
from lit_domino.runtime.inputs import check_drafter_config, check_drafter_source, check_target_spec


COMMAND_DOC = """Export a trained drafter to a field format: DFlash (backbone), SpecForge Domino, speculators EAGLE-3 / DSpark / DFlash 2.

    python experiments/export.py RUN_OR_DRAFTER_DIR OUT_DIR --format dflash|specforge-domino|eagle3|dspark|dflash2 \\
        [--target embedded:default]

RUN_OR_DRAFTER_DIR is a drafter directory (``save_pretrained``: config.json + model.safetensors) or a
training run directory holding one under ``drafter/``. ``--target`` (a model directory, hub id or
``embedded:<preset>``) binds the drafter first, so the export records the target's name and refuses a
target the drafter was not trained for; without it the drafter's recorded fingerprint is written.
"""
"""The command's description and epilog, and ``experiments/export.py``'s docstring (tests/test_entry_points.py)."""
PROG = "export.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = CommandParser.from_doc(PROG, COMMAND_DOC)
    p.add_argument("source", help="drafter directory, or a run directory with drafter/")
    p.add_argument("out", help="directory to write (not the source drafter's directory, nor inside it)")
    p.add_argument("--format", required=True, choices=list(FORMAT_KINDS))
    p.add_argument("--target", default=None, help="the target the drafter was trained for (recorded by name)")
    return p.parse_args(argv)


def check_paths(source_arg: str, out_arg: str) -> tuple[Path, Path, dict]:
    """The drafter directory (a run's ``drafter/`` when given a run), the output directory and the drafter's
    config; refuses a missing or non-drafter source, and an output that would overwrite the source."""
    if not Path(source_arg).expanduser().exists():
        raise UsageError(f"source {source_arg!r} does not exist")
    source = check_drafter_source(source_arg, "source", allow_run_dir=True)
    if source is None:  # a hub-id-like name that is not a local directory
        raise UsageError(f"source {source_arg!r} is not a local drafter directory")
    cfg = check_drafter_config(source, "source")
    out = Path(out_arg).expanduser()
    src, dst = source.resolve(), out.resolve()
    if dst == src or src in dst.parents:
        where = "the source drafter directory" if dst == src else f"inside the source drafter directory {str(source)!r}"
        raise UsageError(f"output {out_arg!r} is {where}: the export would overwrite the drafter it reads; "
                         "choose another directory")
    if out.exists() and not out.is_dir():
        raise UsageError(f"output {out_arg!r} is a file, not a directory")
    return source, out, cfg


def main(argv=None) -> Path:
    """Parse and check (no torch yet), then export; bad input is one line ``export.py: error: ...``."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]) -> Path:
    args = parse_args(argv)
    source, out, cfg = check_paths(args.source, args.out)
    check_target_spec(args.target)
    from lit_domino.interop import format_refusal  # torch-free: the format modules load on first use

    kind = cfg.get("kind")  # None: a foreign layout, converted by the format's own checks
    refusal = format_refusal(kind, args.format) if kind is not None else None
    if refusal:  # before torch and the target
        raise UsageError(refusal)
    from lit_domino.interop import export_drafter
    from lit_domino.interop import load_drafter
    from lit_domino.target.load import load_target

    target = load_target(args.target) if args.target else None
    drafter = load_drafter(source, target=target)
    out = export_drafter(drafter, out, format=args.format, target=target)
    print(f"wrote {args.format} drafter to {out}")
    return out
