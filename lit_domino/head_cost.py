"""What Domino's head costs next to the backbone's draft as the drafter grows (issue #14's cost ratio).

A Domino round is the backbone's block forward and LM head (parallel, grows with d and V) followed by the
head's sequential loop over the K = B-1 positions (grows with d_s, r and the candidate pool, and costs a fixed
number of small ops per position). On the embedded default preset (d = 128, V = 4096) those small ops are
dispatch-bound on a CPU and the head adds ~40 % to the backbone's draft; the papers report +2.8 % at
Qwen3-8B scale. :func:`measure` times both on randomly initialised drafters of the papers' proportions
(:meth:`DrafterSize.papers`), in steady-state rounds (draft a block, roll back, commit a few tokens with their
features: what ``generate`` charges to its draft phase), so the crossing point is measured, not argued.
Random weights cost what trained ones do: the head's work does not depend on its values.

    python experiments/head_cost.py --sizes 128:4096,512:16384,1024:32768,2048:65536 --pool-sizes full,64
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from lit_domino.models.io import build_drafter, drafter_config
from lit_domino.models.sessions import check_pool_size
from lit_domino.testing import random_target


@dataclass(frozen=True)
class DrafterSize:
    """One drafter shape: the target's width and vocabulary, and the Domino head's rank and GRU state."""

    hidden: int
    """d, the target's (and the drafter's) hidden size."""
    vocab: int
    """V, the target's vocabulary (the drafter's LM head, W_up's rows, the input-projection table)."""
    rank: int
    """r, the correction's rank (papers: 256 at d = 4096)."""
    gru_hidden: int
    """d_s, the GRU state (papers: 1024 at d = 4096)."""

    @classmethod
    def papers(cls, hidden: int, vocab: int) -> "DrafterSize":
        """The papers' proportions r = d/16, d_s = d/4 (Qwen3-8B: 256, 1024), no smaller than the embedded
        default preset's head (r 64, d_s 128), which they give at d = 128."""
        if hidden < 16 or hidden % 16 or vocab < 2:
            raise ValueError(f"a drafter size needs d a multiple of 16 (>= 16) and V >= 2, got d={hidden}, V={vocab}")
        return cls(hidden, vocab, max(64, hidden // 16), max(128, hidden // 4))

    @classmethod
    def parse(cls, spec: str) -> "DrafterSize":
        """``"d:V"`` -> :meth:`papers` (d, V)."""
        try:
            d, v = (int(x) for x in spec.split(":"))
        except ValueError as err:
            raise ValueError(f"a size is 'd:V' (e.g. 1024:32768), got {spec!r}") from err
        return cls.papers(d, v)


def _target(size: DrafterSize):
    heads = max(1, size.hidden // 128) if size.hidden >= 128 else 2  # head_dim 128 from d = 128, as Qwen3
    return random_target(vocab_size=size.vocab, hidden_size=size.hidden, num_layers=2, num_heads=heads,
                         num_kv_heads=max(1, heads // 4) if heads % 4 == 0 else heads,
                         intermediate_size=3 * size.hidden, max_positions=4096)


def build_pair(size: DrafterSize, block_size: int, device) -> tuple:
    """A random target of ``size`` and its one-layer backbone and Domino drafters, their backbones equal (the
    ratio is then the head's cost alone) -> (target, {"backbone": ..., "domino": ...}) on ``device``."""
    target = _target(size)
    target.model.to(device)
    drafters = {}
    for kind in ("backbone", "domino"):
        torch.manual_seed(0)  # the same backbone weights in both: Domino builds its head after its backbone
        head = {"head": {"rank": size.rank, "gru_hidden": size.gru_hidden}} if kind == "domino" else {}
        cfg = drafter_config(kind, target, block_size=block_size, num_layers=1, **head)
        drafters[kind] = build_drafter(cfg, target).to(device).eval()
    return target, drafters


@torch.inference_mode()  # as generate's; the drafters are built outside it (their decode tables track versions)
def _rounds(drafter, pool_size, *, rounds: int, accept: int, prompt_len: int, device) -> list[float]:
    """Seconds per steady-state round: ``draft`` a block, ``crop`` it, ``extend`` by ``accept`` + 1 committed
    tokens (anchor + accepted) with their features, as ``generate``'s draft phase; one warm-up round first."""
    cfg = drafter.config
    width = cfg.num_features * cfg.hidden_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size - 1, (prompt_len,), generator=gen).to(device)
    feats = torch.randn(prompt_len + (rounds + 1) * (accept + 1), width, generator=gen).to(device, drafter.dtype)
    session = drafter.new_session(**({} if pool_size is None else {"pool_size": pool_size}))
    session.extend(prompt, feats[:prompt_len])
    start, anchor, out = prompt_len, prompt[-1:], []
    for i in range(rounds + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        stage = session.draft(anchor, cfg.block_size - 1)
        session.crop(start)
        session.extend(torch.cat([anchor, stage.tokens[:accept]]), feats[start: start + accept + 1])
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:  # the first round is the warm-up (allocator growth, lazy tables)
            out.append(time.perf_counter() - t0)
        start, anchor = start + accept + 1, stage.tokens[accept: accept + 1]
    return out


def measure(sizes: list[DrafterSize], pool_sizes: list[int | None], *, block_size: int = 8, rounds: int = 20,
            repeats: int = 3, accept: int = 2, prompt_len: int = 128, device: str = "cpu") -> list[dict]:
    """One row per size and pool: the backbone's and Domino's draft ms per round (median over ``repeats``
    interleaved batches of ``rounds`` rounds, the order reversed on every other batch) and their ratio."""
    if block_size < 2 or not 0 <= accept <= block_size - 2:
        raise ValueError(f"need block_size >= 2 and 0 <= accept <= block_size - 2, got {block_size}, {accept}")
    if rounds < 1 or repeats < 1:
        raise ValueError(f"rounds and repeats must be >= 1, got {rounds}, {repeats}")
    dev = torch.device(device)
    rows = []
    for size in sizes:
        for P in pool_sizes:
            check_pool_size(P, size.vocab)
        target, drafters = build_pair(size, block_size, dev)
        arms = [("backbone", None)] + [("domino", P) for P in pool_sizes]
        times: dict[tuple, list[float]] = {arm: [] for arm in arms}
        for rep in range(repeats):
            for kind, P in arms[:: -1 if rep % 2 else 1]:
                times[(kind, P)].append(statistics.mean(_rounds(drafters[kind], P, rounds=rounds, accept=accept,
                                                                prompt_len=prompt_len, device=dev)))
        backbone_ms = 1e3 * statistics.median(times[("backbone", None)])
        for P in pool_sizes:
            domino_ms = 1e3 * statistics.median(times[("domino", P)])
            rows.append({**asdict(size), "block_size": block_size, "pool_size": P, "backbone_ms": backbone_ms,
                         "domino_ms": domino_ms, "head_ms": domino_ms - backbone_ms, "ratio": domino_ms / backbone_ms})
        del target, drafters
    return rows
