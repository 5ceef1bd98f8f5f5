"""Memory of one training step: the paper-shaped step of every method (measured) and an analytic model of
the Qwen3-8B paper preset on an 80 GB GPU.

``experiments/memory_bench.py`` (CPU, narrow hidden size, peak RSS of a fresh process per case) and
``experiments/gpu/paper_step.py`` (CUDA, the real Qwen3-8B shapes, ``torch.cuda.max_memory_allocated``)
both run :func:`run_case`: build a random target of the given shape (its decoder stack included: the
features are computed online, without the LM head, as the paper preset does), a drafter of the method,
one batch, then one training step (features, forward, loss, backward, AdamW step).

Paths: ``old`` = the full-logits reference (``loss_chunk_size: null``, dense attention masks), ``new`` =
the lean step (label-only chunked loss with recomputation, ``attention: auto``: flex block masks on
CUDA, dense on CPU, where flex has no backward).
"""

from __future__ import annotations

import dataclasses
import json
import math
import resource
import time
from dataclasses import dataclass

import torch
from transformers import Qwen3ForCausalLM

from lit_domino.models import build_drafter, drafter_config
from lit_domino.models.objectives import DEFAULT_CHUNK_SIZE, LossSettings, position_weights
from lit_domino.models.registry import config_class
from lit_domino.studies.memory_cases import METHODS, PATHS, method_kind
from lit_domino.target.qwen3 import qwen3_config
from lit_domino.target.load import Target


@dataclass
class StepShape:
    """The shapes of one training step (defaults: the paper preset on Qwen3-8B)."""

    vocab_size: int = 151_936
    """V (Qwen3's vocabulary)."""
    hidden_size: int = 4096
    """d, the target's (and the feature drafters') width."""
    target_layers: int = 36
    """The target's decoder layers."""
    num_heads: int = 32
    """Query heads (target and draft layers)."""
    num_kv_heads: int = 8
    """Key/value heads."""
    head_dim: int = 128
    """Head width."""
    intermediate_size: int = 12288
    """MLP width."""
    batch_size: int = 4
    """Sequences per step (per device)."""
    seq_len: int = 3072
    """T, tokens per sequence."""
    anchors: int = 512
    """A, blocks per sequence."""
    block_size: int = 16
    """B."""
    draft_layers: int = 5
    """Draft decoder layers (EAGLE-3 always has one)."""
    num_feature_layers: int = 5
    """n of the DFlash feature rule."""
    rank: int = 256
    """Domino's correction rank r and DSpark's Markov rank (256 both, at Qwen3-8B)."""
    gru_hidden: int = 1024
    """Domino's GRU width d_s."""
    ttt_steps: int = 7
    """EAGLE-3's training-time-test steps."""
    prompt_fraction: float = 0.1
    """Leading share of each sequence that is prompt (no labels)."""
    chunk_size: int = DEFAULT_CHUNK_SIZE
    """The new path's loss chunk (labelled rows per LM-head call)."""

    @classmethod
    def cpu_bench(cls, **overrides) -> "StepShape":
        """The paper's vocabulary and block shapes with a narrow width and one draft layer (fits a CPU)."""
        base = dict(hidden_size=64, target_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=192,
                    batch_size=1, seq_len=1024, anchors=128, draft_layers=1, num_feature_layers=2, gru_hidden=128)
        return cls(**{**base, **overrides})


def shaped_target(shape: StepShape, device, dtype=torch.float32, seed: int = 0) -> Target:
    """A random Qwen3 target of ``shape`` on ``device`` (its decoder stack, embedding and LM head)."""
    config = qwen3_config(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                          intermediate_size=shape.intermediate_size, num_layers=shape.target_layers,
                          num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                          max_positions=max(4096, shape.seq_len + shape.block_size), rope_theta=10000.0,
                          tie_embeddings=False, eos_token_id=1, pad_token_id=0, bos_token_id=2)
    previous = torch.get_default_dtype()
    torch.manual_seed(seed)
    try:  # built (and randomly initialised) directly on the device, in the target's dtype
        torch.set_default_dtype(dtype)
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval().requires_grad_(False)
    return Target(model=model, tokenizer=None, mask_token_id=shape.vocab_size - 1, name="shaped")


def make_batch(shape: StepShape, device, seed: int = 0) -> dict:
    """Token ids, masks and A distinct anchors per sequence among the response positions."""
    g = torch.Generator().manual_seed(seed)
    b, T, A = shape.batch_size, shape.seq_len, shape.anchors
    ids = torch.randint(3, shape.vocab_size - 1, (b, T), generator=g)
    start = int(T * shape.prompt_fraction)
    loss_mask = torch.zeros(b, T, dtype=torch.long)
    loss_mask[:, start:] = 1
    room = T - 1 - start
    if A > room:
        raise ValueError(f"{A} anchors do not fit {room} response positions (raise seq_len)")
    anchors = torch.stack([torch.randperm(room, generator=g)[:A].sort().values + start for _ in range(b)])
    batch = dict(input_ids=ids, loss_mask=loss_mask, attention_mask=torch.ones(b, T, dtype=torch.long),
                 anchors=anchors, anchor_mask=torch.ones(b, A, dtype=torch.bool))
    return {k: v.to(device) for k, v in batch.items()}


SHAPE_OPTIONS = {
    "domino": lambda s: {"head": {"rank": s.rank, "gru_hidden": s.gru_hidden}},
    "dspark": lambda s: {"head": {"rank": s.rank}},  # DeepSpec's Markov rank: 256 at Qwen3-8B, as Domino's r
    # the selector's rank r over the top 16; 16 channels per dynamic tap where 16 divides d (speculators')
    "dflash2": lambda s: {"head": {"rank": s.rank, "top_k": min(16, s.vocab_size),
                                   "conv_group_size": math.gcd(16, s.hidden_size)}},
    "eagle3": lambda s: {"num_layers": 1, "ttt_steps": s.ttt_steps},  # EAGLE-3 always has one layer
}
"""A method's own config fields at a step shape (its head), beyond the shared ones :func:`build` sets."""


def build(method: str, shape: StepShape, target: Target, path: str):
    """The method's drafter for ``target`` with the path's training options: the block size, and for the
    drafters reading the DFlash-rule features (its ``feature_rule``) the shape's draft layers and n."""
    kind, _ = method_kind(method)
    kw = dict(block_size=shape.block_size)
    rule = config_class(kind).feature_rule
    if rule in ("dflash", "dspark"):  # the parallel drafters: DFlash's n layers (DSpark's then the last one)
        kw.update(num_layers=shape.draft_layers, feature_layers=target.layer_ids(rule, shape.num_feature_layers))
    kw.update(SHAPE_OPTIONS.get(kind, lambda s: {})(shape))
    drafter = build_drafter(drafter_config(kind, target, **kw), target).to(target.device).train()
    drafter.train_options.attention = "dense" if path == "old" else "auto"
    drafter.train_options.chunk_size = None if path == "old" else shape.chunk_size
    return drafter


def train_step(method: str, drafter, target: Target, batch: dict, path: str, optimizer, autocast=None) -> float:
    """One step: online target features (no LM head), forward, loss (the method's own ``batch_loss``),
    backward, optimizer step → loss."""
    _, causal = method_kind(method)
    with torch.no_grad():
        features = (target.forward_features(batch["input_ids"], drafter.config.feature_layers, batch["attention_mask"])
                    if drafter.config.reads_features else None)
    settings = LossSettings(position_weights(drafter.config.block_size).to(target.device), lam=0.5,
                            chunk_size=drafter.train_options.chunk_size)
    ctx = autocast if autocast is not None else torch.autocast("cpu", enabled=False)
    with ctx:
        loss = drafter.batch_loss(batch, features, settings, causal)[0]
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def run_case(method: str, path: str, shape: StepShape, device: str = "cpu", dtype=torch.float32,
             steps: int = 1) -> dict:
    """Build and run ``steps`` training steps; peak memory (CUDA: max allocated; CPU: peak RSS) and timing."""
    if method not in METHODS or path not in PATHS:
        raise ValueError(f"method must be one of {METHODS} and path one of {PATHS}, got {method!r}, {path!r}")
    dev = torch.device(device)
    t0 = time.perf_counter()
    target = shaped_target(shape, dev, dtype)
    drafter = build(method, shape, target, path)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4)
    batch = make_batch(shape, dev)
    response_tokens = int(batch["loss_mask"].sum())
    setup_s = time.perf_counter() - t0
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else None
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    times, losses = [], []
    for _ in range(steps):
        t = time.perf_counter()
        losses.append(train_step(method, drafter, target, batch, path, opt, autocast))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return dict(method=method, path=path, device=dev.type, peak_bytes=int(peak), before_step_bytes=int(before),
                step_bytes=int(peak - before), step_seconds=times, setup_seconds=setup_s, loss=losses,
                response_tokens=response_tokens, shape=dataclasses.asdict(shape),
                drafter_params=sum(p.numel() for p in drafter.parameters()))


# --------------------------------------------------------------------------- analytic model (Qwen3-8B, paper)

GB = 1e9


def memory_model(shape: StepShape | None = None, target_params: float = 8.19e9, gpu_gb: float = 80.0) -> dict:
    """Bytes of one Domino training step at the paper preset (bf16-mixed: fp32 master weights, bf16 compute)
    per GPU, term by term with its formula, for the old (full logits, dense mask) and new (lean) paths."""
    s = shape or StepShape()
    b, T, A, B, V, d = s.batch_size, s.seq_len, s.anchors, s.block_size, s.vocab_size, s.hidden_size
    H, KV, hd, I, L, n = s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size, s.draft_layers, \
        s.num_feature_layers
    N = A * B  # block queries per sequence
    chunk = s.chunk_size
    layer = d * (H * hd) * 2 + d * (KV * hd) * 2 + 3 * d * I  # q,o + k,v + SwiGLU
    head = 3 * s.gru_hidden * (d + s.gru_hidden) + (d + s.gru_hidden) * s.rank + s.rank * V
    P = L * layer + n * d * d + head  # drafter parameters
    rows = [
        ("target weights (bf16)", "P_target · 2", target_params * 2),
        ("drafter weights (fp32)", f"P = L·layer + n·d² + head = {P / 1e9:.2f}e9; P · 4", P * 4),
        ("drafter grads (fp32)", "P · 4", P * 4),
        ("AdamW states (fp32)", "P · 8", P * 8),
        ("target features (bf16)", "b·T·n·d · 2", b * T * n * d * 2),
        ("target hidden states, transient (bf16)", "b·T·d·(L_t+1) · 2 (output_hidden_states)",
         b * T * d * (s.target_layers + 1) * 2),
        ("drafter layer activations (bf16)", "L · b·N·(8d + 3I) · 2 + L · b·(T+N)·2·KV·hd · 2",
         L * b * N * (8 * d + 3 * I) * 2 + L * b * (T + N) * 2 * KV * hd * 2),
        ("Domino head states (bf16)", "b·N·(4·d_s + r) · 2", b * N * (4 * s.gru_hidden + s.rank) * 2),
    ]
    old = rows + [
        ("attention scores, dense mask + math kernel (bf16)", "L · b·H·N·(T+N) · 2 (probs kept for backward)",
         L * b * H * N * (T + N) * 2),
        ("dense mask (bool)", "b·N·(T+N)", b * N * (T + N)),
        ("full logits (base, ΔL, final; bf16)", "3 · b·N·V · 2", 3 * b * N * V * 2),
        ("CE fp32 copies + log-softmax (two terms)", "4 · b·N·V · 4", 4 * b * N * V * 4),
    ]
    new = rows + [
        ("attention, flex block mask", "L · b·H·N·4 (logsumexp) + block mask O(N·(T+N)/128²)", L * b * H * N * 4),
        ("logits chunk (base, final, fp32 copies, log-softmax, grad)", f"6 · chunk·V · 4, chunk = {chunk}",
         6 * chunk * V * 4),
    ]
    act = [i for i, r in enumerate(new) if r[0].startswith("drafter layer activations")][0]
    ckpt = list(new)
    ckpt[act] = ("drafter layer activations, activation_checkpointing (bf16)",
                 "L · b·N·d · 2 (layer inputs) + one layer's b·N·(8d + 3I) · 2 + b·(T+N)·2·KV·hd · 2",
                 L * b * N * d * 2 + b * N * (8 * d + 3 * I) * 2 + b * (T + N) * 2 * KV * hd * 2)
    return {"old": old, "new": new, "new + activation_checkpointing": ckpt, "gpu_gb": gpu_gb, "drafter_params": P}


PATH_KEYS = ("old", "new", "new + activation_checkpointing")


def memory_model_table(model: dict) -> str:
    lines = []
    lines.append("Activations are an estimate (per query row: residual, norms, attention in/out ≈ 8d, SwiGLU 3I; "
                 "keys/values of context + blocks); the transient target hidden states are freed before the "
                 "drafter's forward, so summing them is conservative.")
    for path in PATH_KEYS:
        total = sum(r[2] for r in model[path])
        fits = "fits" if total / GB <= model["gpu_gb"] else "does NOT fit"
        lines += [f"\n**{path} path** (total {total / GB:.1f} GB: {fits} in {model['gpu_gb']:.0f} GB)\n",
                  "| term | formula | GB |", "|---|---|---:|"]
        lines += [f"| {name} | {formula} | {value / GB:.2f} |" for name, formula, value in model[path]]
    return "\n".join(lines)


def main_case(argv=None) -> None:
    """``python -m lit_domino.studies.memory METHOD PATH SHAPE_JSON DEVICE``: one case, its JSON on stdout (a fresh
    process per case: ru_maxrss is the peak of this process only)."""
    import sys

    method, path, shape_json, device = (argv or sys.argv[1:])[:4]
    torch.set_num_threads(int(__import__("os").environ.get("LIT_DOMINO_BENCH_THREADS", "1")))
    print(json.dumps(run_case(method, path, StepShape(**json.loads(shape_json)), device)))


if __name__ == "__main__":
    main_case()
