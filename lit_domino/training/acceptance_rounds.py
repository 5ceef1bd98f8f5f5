"""Rounds for acceptance predictors (:mod:`lit_domino.training.acceptance`, step 1): the target's continuations of
the prompts, the drafter's rounds drafted at anchors along them, and each drafted position's inputs and labels."""

from __future__ import annotations

import torch

from lit_domino.decoding.acceptance import stage_inputs
from lit_domino.training.acceptance_settings import AcceptanceSettings


@torch.no_grad()
def continuations(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Each prompt followed by the target's greedy continuation (regenerated data)."""
    from lit_domino.decoding import generate

    out = []
    for p in prompts:
        res = generate(target, None, torch.tensor([p]), max_new_tokens=max_new_tokens, threads=None)
        out.append(list(p) + list(res.tokens))
    return out


def shared_continuations(target, prompts: list[list[int]], max_new_tokens: int, memo: dict | None) -> list[list[int]]:
    """:func:`continuations`, kept in ``memo`` when one is given: a caller's dict for one target and prompt set (a
    study builds all its predictors on one; regenerating the continuations was about half of each build)."""
    if memo is None:
        return continuations(target, prompts, max_new_tokens)
    if max_new_tokens not in memo:
        memo[max_new_tokens] = continuations(target, prompts, max_new_tokens)
    return memo[max_new_tokens]


@torch.no_grad()
def collect_rounds(target, drafter, sequences: list[tuple[list[int], int]], settings: AcceptanceSettings) -> dict:
    """Draft ``settings.stages`` stages at anchors of each ``(sequence, prompt_length)`` -> a dict of tensors over
    rounds n and round positions P = stages·K: ``H`` [n, P, d], ``prev`` [n, P], ``soft`` [n, P], ``hard`` [n, P].

    Greedy rounds with hard labels on the rows a round reaches (:func:`reads_off_continuation`) are labelled from
    the sequence itself, the target's greedy continuation: up to the first wrong draft the target's picks are the
    sequence's next tokens, and nothing after it is read (its hard labels are 0, its soft ones NaN). That skips a
    target forward over the whole prefix per round, most of the collection's time; a round whose
    drafts all match as far as the sequence goes, with drafts beyond its end, is verified by the target."""
    from lit_domino.decoding.round import feature_layers
    from lit_domino.runtime.inference import eval_mode

    K = drafter.config.block_size - 1
    layers = feature_layers(drafter)
    options = {} if settings.pool_size is None else {"pool_size": settings.pool_size}
    T = settings.temperature
    gen = torch.Generator(device=target.device).manual_seed(settings.seed)
    rows = {"H": [], "prev": [], "soft": [], "hard": []}
    limit = min(target.model.config.max_position_embeddings, drafter.config.max_position_embeddings)
    read_off = reads_off_continuation(settings)
    with eval_mode(target.model, drafter):
        for seq, plen in sequences:
            ids = torch.tensor(seq, device=target.device)
            last = min(len(seq) - 1, limit - 2 - settings.stages * K)
            if last <= plen:
                continue
            n = settings.anchors_per_sequence
            feats = target.forward_features(ids[None], layers)[0] if layers is not None else None
            if settings.anchors == "decode":
                starts = decode_starts(drafter, ids, feats, plen, last, K, options, T, gen)
                anchors = [starts[len(starts) * i // n] for i in range(min(n, len(starts)))]
            else:
                anchors = sorted({plen + (last - plen) * i // n for i in range(n)})
            for a in anchors:  # the committed context is seq[:a]; the anchor seq[a] is the round's x
                session = drafter.new_session(**options)
                session.extend(ids[:a], None if feats is None else feats[:a])
                anchor, Hs, prevs, stages = ids[a: a + 1], [], [], []
                for _ in range(settings.stages):
                    st = session.draft(anchor, K, T, gen)
                    H, prev = stage_inputs(session.stages[-1].hidden, anchor, st.tokens)
                    Hs.append(H.float()), prevs.append(prev), stages.append(st)
                    anchor = st.tokens[-1:]
                drafts = torch.cat([s.tokens for s in stages])
                truth = ids[a + 1: a + 1 + drafts.numel()]
                match = torch.cumprod((drafts[: truth.numel()] == truth).float(), 0)
                if read_off and (truth.numel() == drafts.numel() or (match.numel() > 0 and match[-1] == 0)):
                    hard = torch.cat([match, match.new_zeros(drafts.numel() - match.numel())])
                    rows["soft"].append(torch.full_like(hard, float("nan")))
                    rows["hard"].append(hard)
                else:
                    ctx = torch.cat([ids[: a + 1], drafts])[None]
                    logits = target.model(input_ids=ctx).logits[0, a: a + drafts.numel()]
                    t = T if T > 0 else 1.0
                    p = torch.softmax(logits.float() / t, -1)
                    q = torch.cat([torch.softmax(s.logits.float() / t, -1) for s in stages])
                    rows["soft"].append(1.0 - 0.5 * (q - p).abs().sum(-1))
                    rows["hard"].append((drafts == logits.argmax(-1)).float())
                rows["H"].append(torch.cat(Hs)), rows["prev"].append(torch.cat(prevs))
    if not rows["H"]:
        raise ValueError("no round could be collected: the sequences are too short for a round of drafts")
    return {k: torch.stack(v).cpu() for k, v in rows.items()}


def reads_off_continuation(settings: AcceptanceSettings) -> bool:
    """Whether :func:`collect_rounds` may label rounds from the sequence (greedy drafting, hard training and
    calibration labels, the head trained on the rows a round reaches): every label it reads lies before a round's
    first wrong draft."""
    return (settings.temperature <= 0 and settings.label == "hard" and settings.calibration_label == "hard"
            and settings.head_rows == "reached")


def decode_starts(drafter, ids: torch.Tensor, feats, plen: int, last: int, K: int, options: dict, temperature: float,
                  generator) -> list[int]:
    """The round starts (anchor positions) of the drafter's plain speculative decode of ``ids`` from ``plen``, up
    to ``last``: one session cropped and extended as the engine does, each round's accepted drafts the leading ones
    that equal ``ids`` (the target's greedy continuation, so exact at T = 0; at T > 0 the drafts are sampled and
    read against it)."""
    session = drafter.new_session(**options)
    session.extend(ids[:plen], None if feats is None else feats[:plen])
    starts, a = [], plen
    while a <= last:
        starts.append(a)
        drafts = session.draft(ids[a: a + 1], K, temperature, generator).tokens.reshape(-1)
        truth = ids[a + 1: a + 1 + K]
        n = min(truth.numel(), drafts.numel())
        acc = int(torch.cumprod((drafts[:n] == truth[:n]).long(), 0).sum()) if n else 0
        session.crop(a)
        session.extend(ids[a: a + acc + 1], None if feats is None else feats[a: a + acc + 1])
        a += acc + 1
    return starts


def split(data: dict, parts: list[float], seed: int = 0) -> list[dict]:
    """Random disjoint row splits of a rounds dict in the proportions ``parts``."""
    n = data["H"].shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    cuts = [0] + [round(n * sum(parts[: i + 1]) / sum(parts)) for i in range(len(parts))]
    return [{k: v[perm[cuts[i]: cuts[i + 1]]] for k, v in data.items()} for i in range(len(parts))]
