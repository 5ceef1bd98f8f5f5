"""What a sequential head costs next to the backbone's draft as the drafter grows: Domino's (issue #14's cost
ratio) and DSpark's Markov head (issue #29; DeepSpec reports +0.2-1.3 % over its backbone).

A Domino round is the backbone's block forward and LM head (parallel, grows with d and V) followed by the
head's sequential loop over the K = B-1 positions (grows with d_s, r and the candidate pool, and costs a fixed
number of small ops per position). On the embedded default preset (d = 128, V = 4096) those small ops are
dispatch-bound on a CPU and the head adds far more to the backbone's draft (docs/results.md) than the papers'
+2.8 % at Qwen3-8B scale. A DSpark round is the same backbone block followed by the Markov head's loop: per position the
pick's W1 row, the variant's step and ``base + W2·u`` (a rank-r update of the V logits: W2's V x r read per
position). :func:`measure` times them on randomly initialised drafters of the papers' proportions
(:meth:`DrafterSize.papers`: Domino's r = d/16 and d_s = d/4; DSpark's rank the same r, 256 at Qwen3-8B as
DeepSpec's), in steady-state rounds (draft a block, roll back, commit a few tokens with their
features: what ``generate`` charges to its draft phase), so the crossing point is measured, not argued.
Random weights cost what trained ones do: the head's work does not depend on its values. A DFlash 2 round is
the backbone's block with the grouped dynamic convolutions around each layer's attention and MLP, then the
candidate selector's loop (the unary top-16, per position one predecessor row and a c x r product; rank r as
above): its ratio is the whole DFlash 2 over DFlash (z-lab reports ~+1.3 % draft latency).

    python experiments/head_cost.py --sizes 128:4096,256:8192,512:16384,1024:32768,2048:65536 --pool-sizes full,64
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lit_domino.runtime.command import CommandParser, UsageError, run_command
from lit_domino.runtime.paths import project_root

# torch and the models are imported where they are used: the sizes are parsed and checked before they load


@dataclass(frozen=True)
class DrafterSize:
    """One drafter shape: the target's width and vocabulary, and the Domino head's rank and GRU state."""

    hidden: int
    """d, the target's (and the drafter's) hidden size."""
    vocab: int
    """V, the target's vocabulary (the drafter's LM head, W_up's rows, the input-projection table)."""
    rank: int
    """r, Domino's correction rank and DSpark's Markov rank (papers: 256 at d = 4096, both)."""
    gru_hidden: int
    """d_s, the GRU state (papers: 1024 at d = 4096)."""

    @classmethod
    def papers(cls, hidden: int, vocab: int) -> "DrafterSize":
        """The papers' proportions r = d/16, d_s = d/4 (Qwen3-8B: 256, 1024), no smaller than the embedded
        default preset's head (r 64, d_s 128), which they give at d = 128."""
        if hidden < 16 or hidden % 16 or vocab < 2:
            raise UsageError(f"a drafter size needs d a multiple of 16 (>= 16) and V >= 2, got d={hidden}, V={vocab}")
        return cls(hidden, vocab, max(64, hidden // 16), max(128, hidden // 4))

    @classmethod
    def parse(cls, spec: str) -> "DrafterSize":
        """``"d:V"`` -> :meth:`papers` (d, V)."""
        try:
            d, v = (int(x) for x in spec.split(":"))
        except ValueError:
            raise UsageError(f"a size is 'd:V' (e.g. 1024:32768), got {spec!r}") from None
        return cls.papers(d, v)


def _target(size: DrafterSize):
    from lit_domino.testing import random_target

    heads = max(1, size.hidden // 128) if size.hidden >= 128 else 2  # head_dim 128 from d = 128, as Qwen3
    return random_target(vocab_size=size.vocab, hidden_size=size.hidden, num_layers=2, num_heads=heads,
                         num_kv_heads=max(1, heads // 4) if heads % 4 == 0 else heads,
                         intermediate_size=3 * size.hidden, max_positions=4096)


HEADS = ("domino", "dspark", "dflash2")
"""The drafters with a sequential head that :func:`measure` times against their backbone."""


def head_options(kind: str, size: DrafterSize) -> dict:
    """The ``drafter_config`` overrides of ``kind``'s head at ``size`` (none for the backbone)."""
    if kind == "domino":
        return {"head": {"rank": size.rank, "gru_hidden": size.gru_hidden}}
    if kind == "dspark":  # DeepSpec's head: vanilla Markov bias of rank r, the confidence head (unused decoding)
        return {"head": {"rank": size.rank, "head_type": "vanilla"}}
    if kind == "dflash2":  # the selector's rank r over the unary top 16; 2 taps in groups of 16 (speculators')
        return {"head": {"rank": size.rank, "top_k": min(16, size.vocab)}}
    return {}


def build_pair(size: DrafterSize, block_size: int, device, heads=HEADS, num_layers: int = 1) -> tuple:
    """A random target of ``size`` and its ``num_layers``-layer backbone and head drafters (``heads``), their
    backbones equal (the ratio is then the head's cost alone) -> (target, {"backbone": ..., kind: ...}) on
    ``device``."""
    import torch

    from lit_domino.models.io import build_drafter, drafter_config

    target = _target(size)
    target.model.to(device)
    drafters = {}
    for kind in ("backbone", *heads):
        torch.manual_seed(0)  # the same backbone weights in all: a method builds its head after its backbone
        cfg = drafter_config(kind, target, block_size=block_size, num_layers=num_layers, **head_options(kind, size))
        drafters[kind] = build_drafter(cfg, target).to(device).eval()
        if kind == "dflash2":  # its layers are rebuilt with the convolutions: give them the backbone's weights
            drafters[kind].load_state_dict(drafters["backbone"].state_dict(), strict=False)
    return target, drafters


class _Rounds:
    """Steady-state draft rounds of one drafter: ``draft`` a block, ``crop`` it, ``extend`` by ``accept`` + 1
    committed tokens (anchor + accepted) with their features; what ``generate`` charges to its draft phase."""

    def __init__(self, drafter, pool_size, *, rounds: int, accept: int, prompt_len: int, device):
        import torch

        cfg = drafter.config
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, cfg.vocab_size - 1, (prompt_len,), generator=gen).to(device)
        width = cfg.num_features * cfg.hidden_size
        self.feats = torch.randn(prompt_len + (rounds + 1) * (accept + 1), width, generator=gen).to(device,
                                                                                                    drafter.dtype)
        self.session = drafter.new_session(**({} if pool_size is None else {"pool_size": pool_size}))
        self.session.extend(prompt, self.feats[:prompt_len])
        self.start, self.anchor, self.accept, self.num_tokens = prompt_len, prompt[-1:], accept, cfg.block_size - 1
        self.cuda = torch.device(device).type == "cuda"

    def __call__(self) -> float:
        """One round -> its seconds."""
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        stage = self.session.draft(self.anchor, self.num_tokens)
        self.session.crop(self.start)
        a = self.accept
        self.session.extend(torch.cat([self.anchor, stage.tokens[:a]]), self.feats[self.start: self.start + a + 1])
        if self.cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        self.start, self.anchor = self.start + a + 1, stage.tokens[a: a + 1]
        return seconds


def check_measure(sizes: list[DrafterSize], pool_sizes: list[int | None], *, block_size: int, rounds: int,
                  accept: int, heads=HEADS, num_layers: int = 1) -> None:
    """:func:`measure`'s input, checked whole before the first drafter is built (no torch needed)."""
    if not sizes:
        raise UsageError("no drafter sizes to measure (--sizes d:V,...)")
    unknown = [h for h in heads if h not in HEADS]
    if unknown or not heads:
        raise UsageError(f"--heads: unknown head {', '.join(map(repr, unknown)) or '(none given)'}; choose from "
                         f"{', '.join(HEADS)}")
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise UsageError(f"--num-layers must be an integer >= 1 (draft layers of every drafter), got {num_layers!r}")
    if block_size < 2 or not 0 <= accept <= block_size - 2:
        raise UsageError(f"need block_size >= 2 and 0 <= accept <= block_size - 2, got {block_size}, {accept}")
    if rounds < 1:
        raise UsageError(f"rounds must be >= 1, got {rounds}")


def measure(sizes: list[DrafterSize], pool_sizes: list[int | None], *, block_size: int = 8, rounds: int = 100,
            accept: int = 2, prompt_len: int = 128, device: str = "cpu", heads=HEADS,
            num_layers: int = 1) -> list[dict]:
    """One row per size and head (Domino: per pool): the backbone's and the head drafter's draft ms per round
    (``drafter_ms``), the head's share (``head_ms``) and their ratio. DSpark's head has no pool: one row (P None).

    The drafters take turns round by round (the order reversed every round; one untimed warm-up round
    each), so each of the ``rounds`` samples pairs them at the same context length and the same moment: on a
    shared machine whose speed drifts within seconds, batches of rounds per drafter disagreed by more
    than the head costs. Times are medians over the rounds; ``ratio`` is the median of the paired ratios."""
    check_measure(sizes, pool_sizes, block_size=block_size, rounds=rounds, accept=accept, heads=heads,
                  num_layers=num_layers)
    import torch

    from lit_domino.models.sessions import check_pool_size

    for size in sizes:  # every size's pools, before the first drafter is built
        for P in pool_sizes if "domino" in heads else ():
            try:
                check_pool_size(P, size.vocab)
            except ValueError as err:
                raise UsageError(f"--pool-sizes {P} at size {size.hidden}:{size.vocab}: {err}") from None
    dev = torch.device(device)
    rows = []
    for size in sizes:
        target, drafters = build_pair(size, block_size, dev, heads, num_layers)
        arms = [("backbone", None)] + [(h, P) for h in heads for P in (pool_sizes if h == "domino" else [None])]
        with torch.inference_mode():  # as generate's; the drafters are built outside it (decode tables track versions)
            runs = {arm: _Rounds(drafters[arm[0]], arm[1], rounds=rounds, accept=accept, prompt_len=prompt_len,
                                 device=dev) for arm in arms}
            times: dict[tuple, list[float]] = {arm: [] for arm in arms}
            for i in range(rounds + 1):
                for arm in arms[:: -1 if i % 2 else 1]:
                    seconds = runs[arm]()
                    if i:  # round 0 is the warm-up: the prompt's context K/V, lazy tables, allocator growth
                        times[arm].append(seconds)
        backbone = times[("backbone", None)]
        for head, P in arms[1:]:
            drafter = times[(head, P)]
            ms = (1e3 * statistics.median(backbone), 1e3 * statistics.median(drafter))
            rows.append({"head": head, **asdict(size), "num_layers": num_layers, "block_size": block_size,
                         "pool_size": P, "backbone_ms": ms[0], "drafter_ms": ms[1], "head_ms": ms[1] - ms[0],
                         "ratio": statistics.median(d / b for d, b in zip(drafter, backbone))})
        del target, drafters, runs
    return rows


# --------------------------------------------------------------------------- the command

COMMAND_DOC = """A sequential head's draft time over the backbone's as the drafter grows: Domino's and DSpark's Markov head
(random drafters of the papers' proportions).

    python experiments/head_cost.py                                     # d 128 .. 2048, a few minutes on a CPU
    python experiments/head_cost.py --sizes 4096:151936 --block-size 16 --rounds 10   # Qwen3-8B's shape
    python experiments/head_cost.py --heads dspark --sizes 4096:151936 --num-layers 5 --rounds 10  # DeepSpec's

Each size ``d:V`` builds a random target and drafters with r = d/16, d_s = d/4 (at least the embedded default's
64 and 128; :mod:`lit_domino.studies.head_cost`; DSpark's Markov rank is the same r, 256 at d = 4096) and
times steady-state draft rounds of the backbone, of Domino with each ``--pool-sizes`` pool and of DSpark, in
turns round by round. Writes ``results/head-cost-<time>.md`` + ``.json``.
"""
"""The command's description and epilog, and ``experiments/head_cost.py``'s docstring (tests/test_entry_points.py)."""
PROG = "head_cost.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = CommandParser.from_doc(PROG, COMMAND_DOC)
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
    p.add_argument("--out", default=str(project_root() / "results"), help="output directory (default: results/)")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    """Parse and check the sizes and pools (no torch yet), then measure; bad input is one line."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]) -> list[dict]:
    args = parse_args(argv)
    from lit_domino.studies.bench_plan import parse_pool_sizes  # light, as lit_domino.studies.head_cost's import
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
