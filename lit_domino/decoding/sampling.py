"""Token picks and verification rules: greedy matching and Leviathan/Chen rejection sampling.

Notation for one round: the target ran on ``[anchor, d_1 .. d_m]``; its ``logits[k]``
(k = 0..m) give p_{k+1}, the target's distribution of the token after the first
k+1 inputs. Draft token ``d_k`` (k = 1..m) competes with p_k; ``p_{m+1}`` gives the bonus.
"""

from __future__ import annotations

import torch

from lit_domino.models.sessions import greedy_ids, is_greedy

GREEDY_BELOW = 1e-5
"""Temperatures below this decode greedily: ``generate`` runs exactly the T = 0 path (:func:`effective_temperature`).

Near 0, softmax(logits / T) is a point mass on the argmax anyway (at T = 1e-5 a logit 1e-4 below the top one
keeps e^-10 of its mass), and in float32 logits / T overflows to inf once T < |logit| / 3.4e38: T = 1e-45 made
``torch.multinomial`` fail with "probability tensor contains either inf, nan or element < 0". Every temperature
a user samples at (0.1 .. 2) is far above it."""


def effective_temperature(temperature: float | None) -> float:
    """The temperature decoding uses: 0.0 (greedy) for T < :data:`GREEDY_BELOW` (or None), else ``float(T)``."""
    if temperature is None or temperature < GREEDY_BELOW:
        return 0.0
    return float(temperature)


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """p = softmax(logits / T) in float32."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Argmax at T = 0, else one sample of softmax(logits / T); ``logits [..., V]`` → ids ``[...]``."""
    if is_greedy(temperature):
        return greedy_ids(logits)
    p = target_probs(logits, temperature)
    flat = p.reshape(-1, p.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(p.shape[:-1])


def verify_greedy(drafts: torch.Tensor, logits: torch.Tensor) -> tuple[int, int]:
    """Greedy verification → ``(acc, bonus)``.

    ``drafts [m]``, ``logits [m+1, V]``. The target's greedy pick after each prefix is
    ``t = argmax(logits)``; draft d_k is accepted iff all of d_1..d_k equal t_0..t_{k-1}:
    ``acc = sum(cumprod(d == t[:-1]))``, and the bonus is the target's own pick ``t[acc]``
    (the correction at the first mismatch, or a free extra token if all m match).
    """
    t = greedy_ids(logits)
    acc = int(torch.cumprod((drafts == t[:-1]).long(), 0).sum())
    return acc, int(t[acc])


def accept_greedy(drafts: torch.Tensor, logits: torch.Tensor) -> tuple[int, list[int]]:
    """Greedy verification on the device with ONE host copy → ``(acc, committed)``.

    The rule of :func:`verify_greedy`; ``committed = t[:acc+1]``: the accepted drafts equal the target's picks
    ``t`` and ``t[acc]`` is the bonus, so ``acc`` and the picks travel to the host together.
    """
    t = greedy_ids(logits)  # [m+1]
    acc = torch.cumprod((drafts == t[:-1]).long(), 0).sum()
    host = torch.cat([acc.view(1), t]).tolist()
    acc = host[0]
    return acc, host[1: acc + 2]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the distribution to resample from after rejecting a draft from q.

    If it has no mass (p == q up to rounding) any rejection had probability ~0; fall back to p.
    """
    r = torch.clamp(p - q, min=0)
    total = r.sum()
    return r / total if total > 0 else p


def verify_sampling(
    drafts: torch.Tensor,
    q: torch.Tensor,
    logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, Chen et al. 2023) → ``(acc, bonus)``.

    ``drafts [m]`` were drawn with d_k ~ q_k (``q [m, V]``), p_k = softmax(logits[k-1] / T).
    Accept d_k with probability ``min(1, p_k(d_k) / q_k(d_k))`` (drawn as ``u * q <= p``,
    u ~ U(0,1), no division); at the first rejection k the committed token is drawn from
    ``norm(max(0, p_k - q_k))``; if all m are accepted the bonus is drawn from p_{m+1}.
    Every committed token is then distributed exactly as the target's p.
    """
    m = drafts.shape[0]
    p = target_probs(logits, temperature)  # [m+1, V]
    q = q.to(p)
    idx = drafts.view(-1, 1)
    p_d = p[:m].gather(1, idx).squeeze(1)  # p_k(d_k)
    q_d = q.gather(1, idx).squeeze(1)  # q_k(d_k)
    u = torch.rand(m, generator=generator, device=p.device)
    accepted = (u * q_d <= p_d).long()
    acc = int(torch.cumprod(accepted, 0).sum())
    dist = residual(p[acc], q[acc]) if acc < m else p[m]
    bonus = torch.multinomial(dist, 1, generator=generator)
    return acc, int(bonus)


def one_hot_probs(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q for a deterministic draft (a drafter that returns no ``probs``): all mass on its token."""
    return torch.nn.functional.one_hot(tokens.long(), vocab_size).float()
