"""A sequential head's draft time over the backbone's as the drafter grows: Domino's and DSpark's Markov head
(random drafters of the papers' proportions).

    python experiments/head_cost.py                                     # d 128 .. 2048, a few minutes on a CPU
    python experiments/head_cost.py --sizes 4096:151936 --block-size 16 --rounds 10   # Qwen3-8B's shape
    python experiments/head_cost.py --heads dspark --sizes 4096:151936 --num-layers 5 --rounds 10  # DeepSpec's

Each size ``d:V`` builds a random target and drafters with r = d/16, d_s = d/4 (at least the embedded default's
64 and 128; :mod:`lit_domino.studies.head_cost`; DSpark's Markov rank is the same r, 256 at d = 4096) and
times steady-state draft rounds of the backbone, of Domino with each ``--pool-sizes`` pool and of DSpark, in
turns round by round. Writes ``results/head-cost-<time>.md`` + ``.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lit_domino.runtime.command import CommandParser, run_command  # noqa: E402 (light: no torch)

PROG = "head_cost.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = CommandParser(prog=PROG, description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="128:4096,256:8192,512:16384,1024:32768,2048:65536",
                   help="d:V,... target widths and vocabularies (default: 128:4096 = the embedded default's, "
                        "up to 2048:65536)")
    p.add_argument("--pool-sizes", default="full,64",
                   help="Domino candidate pools: full or integers (default: full,64)")
    p.add_argument("--heads", default="domino,dspark,dflash2",
                   help="the head drafters timed against the backbone: domino, dspark, dflash2 (default: all)")
    p.add_argument("--num-layers", type=int, default=1,
                   help="draft layers of every drafter (default: 1; DeepSpec's DSpark on Qwen3-8B: 5)")
    p.add_argument("--block-size", type=int, default=8, help="B, K = B-1 drafts per round (default: 8; papers: 16)")
    p.add_argument("--accept", type=int, default=2,
                   help="drafts committed per round (the context grows by accept+1; default: 2)")
    p.add_argument("--rounds", type=int, default=100,
                   help="timed rounds per drafter, taken in turns round by round; medians (default: 100)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: 1, as the benchmarks)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=str(ROOT / "results"), help="output directory (default: results/)")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    """Parse and check the sizes and pools (no torch yet), then measure; bad input is one line."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]) -> list[dict]:
    args = parse_args(argv)
    from lit_domino.studies.bench import parse_pool_sizes  # light, as lit_domino.studies.head_cost's import
    from lit_domino.studies.head_cost import DrafterSize, check_measure, measure
    from lit_domino.runtime.inputs import check_positive

    sizes = [DrafterSize.parse(s.strip()) for s in args.sizes.split(",") if s.strip()]
    pools = parse_pool_sizes(args.pool_sizes)
    heads = tuple(h.strip() for h in args.heads.split(",") if h.strip())
    check_measure(sizes, pools, block_size=args.block_size, rounds=args.rounds, accept=args.accept, heads=heads,
                  num_layers=args.num_layers)
    check_positive(args.threads, "--threads")
    from lit_domino.decoding.harness import markdown_table
    from lit_domino.runtime.threads import pinned_threads
    from lit_domino.runtime.jsonio import write_json

    with pinned_threads(args.threads):
        rows = measure(sizes, pools, block_size=args.block_size, rounds=args.rounds, accept=args.accept,
                       device=args.device, heads=heads, num_layers=args.num_layers)
    table = markdown_table(rows, ["head", "hidden", "vocab", "rank", "gru_hidden", "num_layers", "block_size",
                                  "pool_size", "backbone_ms", "drafter_ms", "head_ms", "ratio"])
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"head-cost-{time.strftime('%Y%m%d-%H%M%S')}"
    title = "# Head cost (Domino, DSpark) vs the backbone's draft"
    stem.with_suffix(".md").write_text(f"{title}\n\n{vars(args)}\n\n{table}\n")
    write_json({"args": vars(args), "rows": rows}, stem.with_suffix(".json"))
    print(f"wrote {stem}.md and .json")
    return rows


if __name__ == "__main__":
    main()
