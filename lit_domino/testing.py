"""Small random models for tests and examples: no training, no files, no network."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import Qwen3ForCausalLM

from lit_domino.target.load import Target
from lit_domino.target.qwen3 import qwen3_config


def random_target(
    vocab_size: int = 256,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_positions: int = 512,
    seed: int = 0,
    tokenizer=None,
) -> Target:
    """A randomly initialised tiny Qwen3 target (fp32, eval, frozen).

    The last vocabulary id is the MASK token; no tokenizer unless one is given.
    """
    torch.manual_seed(seed)
    config = qwen3_config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                          num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
                          head_dim=hidden_size // num_heads, max_positions=max_positions, rope_theta=10000.0,
                          tie_embeddings=True, eos_token_id=1, pad_token_id=0, bos_token_id=2)
    model = Qwen3ForCausalLM(config).eval().requires_grad_(False)
    mask_id = tokenizer.mask_token_id if tokenizer is not None else vocab_size - 1
    return Target(model=model, tokenizer=tokenizer, mask_token_id=int(mask_id), name=f"random-{seed}")


def lively_target(vocab_size: int = 128, hidden_size: int = 32, num_layers: int = 4, seed: int = 0,
                  max_positions: int = 256) -> Target:
    """A random target whose greedy continuations vary (the default init repeats the last token):
    its decoder weights are redrawn with std 0.3; no EOS, so every decode runs to max_new_tokens."""
    target = random_target(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers, num_heads=4,
                           num_kv_heads=2, intermediate_size=2 * hidden_size, max_positions=max_positions, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in target.model.model.layers.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    target.model.generation_config.eos_token_id = None
    return target


@torch.no_grad()
def lively_dflash2_(drafter, std: float = 0.3, selector_std: float = 1.0, seed: int = 5):
    """Random convolution taps and a strong selector on a DFlash 2 drafter, in place (a fresh one has identity
    convolutions: it drafts as DFlash), so every part of it shows in the logits and the picks."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in drafter.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.add_(torch.randn(conv.base_kernel.shape, generator=g) * std)
                conv.kernel_projection.weight.copy_(torch.randn(conv.kernel_projection.weight.shape, generator=g) * std)
        for p in drafter.selector.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * selector_std)
    return drafter


def hf_greedy(target: Target, prompt: list[int], n: int) -> list[int]:
    """The reference of every lossless test: Hugging Face ``generate`` (greedy) of ``n`` tokens after ``prompt``."""
    ids = torch.tensor([prompt], device=target.device)
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                                pad_token_id=0)
    return out[0, len(prompt):].tolist()


def compiled_graph_count(step) -> int:
    """The graphs dynamo compiled for ``step`` (a :func:`~lit_domino.models.sessions.compile_decode_step` result):
    the cache entries of its own code object (a torch debugging helper: no public API counts them)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(step._torchdynamo_orig_callable.__func__.__code__))


def hf_greedy_and_reference(target: Target, prompt: list[int], n: int, extra: int) -> tuple[list[int], list[int]]:
    """:func:`hf_greedy`'s ``n`` tokens and an :class:`OracleMix` reference (``prompt`` + ``n + extra`` greedy tokens)
    from one ``generate``: a greedy decode's first ``n`` tokens are the same forwards whatever follows them."""
    tokens = hf_greedy(target, prompt, n + extra)
    return tokens[:n], prompt + tokens


class OracleMix:
    """Wraps a real drafter: its sessions' drafts are replaced by the reference (greedy) tokens with
    probability ``p`` (never a stage's last token, which anchors the next DLoop stage), so real
    sessions see accepted drafts, partial acceptances and rejections.

    ``reference``: prompt + the target's greedy continuation, long enough for every round. ``every_token``: a
    stage's last token too (with ``p = 1`` a drafter that is always right, where no DLoop stage follows)."""

    def __init__(self, drafter, reference: list[int], seed: int = 0, p: float = 0.6, every_token: bool = False):
        self.inner, self.reference, self.p, self.every_token = drafter, reference, p, every_token
        self.config = drafter.config
        self.rng = torch.Generator().manual_seed(seed)

    def bind_target(self, target):
        return self.inner.bind_target(target)

    def __getattr__(self, name):  # the rest of the drafter interface (embeddings, heads, kind) is the inner one's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def draft_options(self):
        return self.inner.draft_options

    def new_session(self, **options):
        return _OracleSession(self, self.inner.new_session(**options))


class _OracleSession:
    def __init__(self, mix: OracleMix, inner):
        self.mix, self.inner, self.pos = mix, inner, 0

    def extend(self, tokens, features):
        self.inner.extend(tokens, features)
        self.pos = self.inner.length

    def crop(self, length):
        self.inner.crop(length)
        self.pos = length

    @property
    def stages(self):  # the inner session's stages (block hidden states: the acceptance predictor's inputs)
        return self.inner.stages

    def draft(self, anchor, num_tokens, temperature, generator):
        out = self.inner.draft(anchor, num_tokens, temperature, generator)
        toks, ref = out.tokens.clone(), self.mix.reference
        for k in range(num_tokens if self.mix.every_token else num_tokens - 1):
            if torch.rand((), generator=self.mix.rng) < self.mix.p and self.pos + 1 + k < len(ref):
                toks[k] = ref[self.pos + 1 + k]
        self.pos += num_tokens
        return SimpleNamespace(tokens=toks, logprobs=out.logprobs, probs=out.probs)


# --------------------------------------------------------------------------- the chi-square test of sampling (T > 0)


def chi_square_target(vocab_size: int = 8, seed: int = 3) -> Target:
    """The chi-square tests' target: a 2-layer Qwen3 over ``vocab_size`` tokens whose distribution is sharpened
    (random init gives near-uniform logits) and that never stops (no EOS), so (x_1, x_2) spreads over few cells."""
    target = random_target(vocab_size=vocab_size, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                           intermediate_size=32, max_positions=64, seed=seed)
    with torch.no_grad():
        target.model.model.norm.weight.mul_(6.0)
    target.model.generation_config.eos_token_id = None
    return target


def exact_joint(target: Target, prompt: list[int], temperature: float = 1.0, at: int = 1) -> torch.Tensor:
    """P(x_at, x_at+1) of sampling ``target`` after ``prompt``, the tokens x_0 .. x_at-1 before the pair marginalised
    (``[V, V]``; enumerates the V^(at+2) continuations in batched forwards, so for tiny vocabularies and small
    ``at``). ``at`` > 1 reaches the tokens a round's later stages draft (a DLoop stage after the first)."""
    def law(seqs):  # the next token's distribution after each row of seqs [n, T] -> [n, V]
        with torch.no_grad():
            logits = target.model(input_ids=seqs).logits[:, -1]
        return torch.softmax(logits.double() / temperature, -1)

    def extend(seqs, V):  # every row followed by every token: [n, T] -> [n * V, T + 1]
        return torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(len(seqs))[:, None]], 1)

    seqs, weight = torch.tensor([prompt]), torch.ones(1, dtype=torch.double)
    V = law(seqs).shape[-1]
    for _ in range(at):  # every x_0 .. x_at-1 and its probability
        weight = (weight[:, None] * law(seqs)).reshape(-1)
        seqs = extend(seqs, V)
    first, second = law(seqs), law(extend(seqs, V)).reshape(len(seqs), V, V)
    return torch.einsum("n,na,nab->ab", weight, first, second)


def opens_every_stage(res, max_stages: int, K: int, max_new_tokens: int) -> bool:
    """Whether every round of ``res`` (decoded under a DLoop gate that always opens) drafted ``max_stages`` stages
    of K, except where its drafts and bonus already covered the tokens still wanted (no later stage could emit
    one), and at least one round drafted them all."""
    wanted = max_new_tokens - 1  # the prefill's token is emitted before the first round
    for n, acc in zip(res.stages_per_round, res.accepted_per_round):
        if n != max_stages and n * K + 1 < wanted:
            return False
        wanted -= acc + 1
    return max_stages in res.stages_per_round

def sampled_pairs(target: Target, drafter, prompt: list[int], n: int, at: int = 1, **generate_kwargs):
    """``n`` seeded decodes of ``at + 2`` tokens: the counts of (x_at, x_at+1) (``[V, V]``, :func:`exact_joint`'s
    law) and every accepted count seen."""
    counts, accepted = sampled_pair_counts(target, drafter, prompt, n, (at,), **generate_kwargs)
    return counts[at], accepted


def sampled_pair_counts(target: Target, drafter, prompt: list[int], n: int, ats: tuple[int, ...],
                        **generate_kwargs) -> tuple[dict[int, torch.Tensor], set[int]]:
    """``n`` seeded decodes of ``max(ats) + 2`` tokens, counting every pair (x_at, x_at+1) of ``ats`` in the same
    decodes: ``{at: counts [V, V]}`` and every accepted count seen. Each pair's counts are a sample of its law
    whatever follows it (a lossless decode's every marginal is the target's), so one decode serves every pair."""
    from lit_domino.decoding import generate

    V = target.model.get_input_embeddings().weight.shape[0]
    counts, accepted = {at: torch.zeros(V, V, dtype=torch.double) for at in ats}, set()
    for seed in range(n):
        res = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=max(ats) + 2, seed=seed,
                       **generate_kwargs)
        for at in ats:
            counts[at][res.tokens[at], res.tokens[at + 1]] += 1
        accepted.update(res.accepted_per_round)
    return counts, accepted


def chi_square(observed: torch.Tensor, expected: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson's statistic; cells with expected < min_expected are pooled into one cell."""
    observed, expected = observed.double().flatten(), expected.double().flatten()
    small = expected < min_expected
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())


def dof_after_pooling(expected: torch.Tensor, min_expected: float = 5.0) -> int:
    small = expected.flatten() < min_expected
    return int((~small).sum()) + (1 if small.any() else 0) - 1


def chi2_critical(dof: int, alpha: float = 1e-3) -> float:
    """Critical value of chi-square(dof) at level alpha (scipy if installed, else Wilson-Hilferty)."""
    try:
        from scipy.stats import chi2

        return float(chi2.isf(alpha, dof))
    except ImportError:
        z = {1e-3: 3.0902, 1e-2: 2.3263}[alpha]
        return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


def passes_chi_square(counts: torch.Tensor, law: torch.Tensor) -> tuple[bool, float]:
    """Whether ``counts`` are distributed as ``law`` at level 1e-3 (and the statistic)."""
    expected = law * counts.sum()
    stat = chi_square(counts, expected)
    return stat < chi2_critical(dof_after_pooling(expected)), stat
