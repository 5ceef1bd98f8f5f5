"""Target-regenerated training data: the target answers the training prompts itself.

Like DFlash and EAGLE-3, drafters learn the target's own outputs, not the corpus
answers: acceptance depends on matching *the target*. Each user turn of a corpus
example becomes one training sequence ``template(prompt so far) + target answer``,
with ``loss_mask = 1`` exactly on the generated answer tokens (EOS included).

The result is a ``datasets.Dataset`` on disk in the artifact cache, keyed by the
target's fingerprint and this config. Generation is batched and written in shards,
so an interrupted regeneration resumes at the first missing shard.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import datasets
from tqdm.auto import tqdm

from lit_domino import cache
from lit_domino.data.corpora import build_corpus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegenConfig:
    """What to regenerate, and how (the hash of this + the target keys the cache)."""

    domains: tuple[tuple[str, int | None], ...] = (("math", 2000), ("code", 1000), ("chat", 1000))
    """Corpus domains and how many examples of each (None = the whole split)."""
    split: str = "train"
    """Corpus split whose prompts are answered (validation data uses "eval")."""
    corpus_seed: int = 0
    max_prompt_tokens: int = 384
    """Prompts longer than this are skipped (and counted); they would leave no room to answer."""
    max_new_tokens: int = 256
    """Answer budget per turn; answers cut here keep their tokens but have no EOS."""
    temperature: float = 0.0
    """0 = greedy (the papers' default); > 0 samples the answers."""
    batch_size: int = 32
    """Prompts generated together (left-padded); sorted by length to waste little padding."""
    shard_size: int = 256
    """Prompts per on-disk shard: the unit of resume."""
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens <= 0 or self.max_prompt_tokens <= 0:
            raise ValueError("max_new_tokens and max_prompt_tokens must be positive")


def encode_conversation(tokenizer, messages) -> tuple[list[int], list[int]]:
    """Token ids of a whole chat and a mask that is 1 on assistant-content tokens (+ their EOS).

    Computed from character offsets of the rendered text, so it is exact whatever
    the tokenizer merges at turn boundaries.
    """
    text, spans = "", []
    for m in messages:
        head = f"<|im_start|>{m['role']}\n"
        start = len(text) + len(head)
        text += head + m["content"] + "<|im_end|>"
        if m["role"] == "assistant":
            spans.append((start, len(text)))
        text += "\n"
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= a and b <= e for s, e in spans) and b > a) for a, b in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def _prompt_ids(target, turns: list[str], answers: list[str]) -> list[int]:
    """Chat-template ids of the conversation so far, ending with the assistant generation prompt."""
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return target.chat_ids(messages, add_generation_prompt=True)


@torch.no_grad()
def generate_batch(target, prompts: list[list[int]], max_new_tokens: int, temperature: float, generator_seed: int):
    """Answer a batch of prompts with the target (left padding); returns answers cut after EOS."""
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_ids[0]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.tensor(p)
        attn[r, width - len(p) :] = 1
    device = torch.device(target.device)
    # HF sampling draws from the global generator: seed it inside a fork, so the caller's random
    # state is the same whether this ran (cold cache) or not (warm cache)
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(generator_seed)
        out = target.model.generate(
            input_ids=ids.to(device),
            attention_mask=attn.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=None,
            top_k=None,
            eos_token_id=target.eos_token_ids,
            pad_token_id=pad,
        )[:, width:].tolist()
    eos = set(target.eos_token_ids)
    answers = []
    for row in out:
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        answers.append(row[:cut])
    return answers


def regen_dir(target, cfg: RegenConfig, root: Path | None = None) -> Path:
    key = {"target": target.fingerprint(), "target_name": target.name, "regen": asdict(cfg)}
    return cache.artifact_dir("regen", key, name=f"{cfg.split}", root=root)


def _work_items(target, cfg: RegenConfig):
    """(uid, domain, turns) for every prompt, sorted by prompt length (stable), plus the skip count."""
    items, skipped = [], 0
    for domain, n in cfg.domains:
        for ex in build_corpus(domain, cfg.split, n, seed=cfg.corpus_seed):
            turns = [m["content"] for m in ex.messages if m["role"] == "user"]
            if len(_prompt_ids(target, turns[:1], [])) > cfg.max_prompt_tokens:
                skipped += 1
                continue
            items.append((ex.uid, domain, turns))
    items.sort(key=lambda it: len(it[2][0]))
    return items, skipped


def _load_dataset(path: Path):
    return datasets.load_from_disk(str(path / "dataset"))


def _load_shard(shard_path: Path):
    """A finished shard, or None (not finished, or unreadable: then it is regenerated, with a warning)."""
    if not cache.is_complete(shard_path):
        return None
    try:
        return datasets.load_from_disk(str(shard_path))
    except Exception as err:  # noqa: BLE001 (datasets' FileNotFoundError/OSError for damaged files)
        log.warning("regenerated shard %s could not be read (%s: %s); regenerating it", shard_path,
                    type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        cache.invalidate(shard_path)
        return None


def regenerate(target, cfg: RegenConfig, root: Path | None = None, progress: bool = True):
    """Build (or reuse, or resume) the regenerated dataset; returns a ``datasets.Dataset``.

    One process builds it while others wait and reuse it (:func:`lit_domino.cache.building`);
    a corrupt cached dataset is rebuilt (finished shards that are intact are kept); the
    caller's random state is left as it was (same batches from a cold or a warm cache).
    """
    path = regen_dir(target, cfg, root)
    return cache.reuse_or_build(path, _load_dataset, lambda p: _build(target, cfg, p, progress))


def _build(target, cfg: RegenConfig, path: Path, progress: bool) -> None:
    if target.tokenizer is None:
        raise ValueError("regeneration needs a target with a tokenizer (chat template)")
    items, skipped = _work_items(target, cfg)
    if not items:
        raise ValueError(
            f"no prompts to regenerate: domains {cfg.domains} of split {cfg.split!r} gave "
            f"{skipped} prompts, all longer than max_prompt_tokens={cfg.max_prompt_tokens}"
        )
    shards = [items[i : i + cfg.shard_size] for i in range(0, len(items), cfg.shard_size)]
    done = sum(cache.is_complete(path / f"shard_{k:05d}", warn=False) for k in range(len(shards)))
    bar = tqdm(total=len(items), desc=f"regenerate {cfg.split}", disable=not progress, initial=done * cfg.shard_size)
    t0, new_tokens, parts = time.time(), 0, []
    for k, shard in enumerate(shards):
        shard_path = path / f"shard_{k:05d}"
        part = _load_shard(shard_path)
        if part is None:
            rows, new_tokens = _regenerate_shard(target, cfg, shard, k, bar, new_tokens)
            with cache.staging(shard_path) as tmp:  # a shard is whole or absent
                datasets.Dataset.from_list(rows).save_to_disk(str(tmp))
                cache.mark_complete(tmp, {"shard": k})
            part = datasets.load_from_disk(str(shard_path))
        parts.append(part)
    bar.close()
    elapsed = time.time() - t0
    ds = datasets.concatenate_datasets(parts)
    with cache.staging(path / "dataset") as tmp:
        ds.save_to_disk(str(tmp))
    report = {
        "sequences": len(ds),
        "prompts": len(items),
        "skipped_long_prompts": skipped,
        "response_tokens": int(sum(sum(m) for m in ds["loss_mask"])),
        "seconds": round(elapsed, 1),
        "tokens_per_second": round(new_tokens / elapsed, 1) if elapsed > 0 and new_tokens else None,
    }
    (path / "report.json").write_text(json.dumps(report, indent=2))
    cache.mark_complete(path, {"target": target.fingerprint(), "regen": asdict(cfg)})


def _regenerate_shard(target, cfg: RegenConfig, shard, shard_index: int, bar, new_tokens: int):
    """Answer every turn of every prompt in one shard; turn k waits for the answers of turn k-1."""
    answers: dict[str, list[str]] = {uid: [] for uid, _, _ in shard}
    rows = []
    max_turns = max(len(turns) for _, _, turns in shard)
    for turn in range(max_turns):
        active = [(uid, dom, turns) for uid, dom, turns in shard if len(turns) > turn]
        for b in range(0, len(active), cfg.batch_size):
            batch = active[b : b + cfg.batch_size]
            prompts = [_prompt_ids(target, turns[: turn + 1], answers[uid]) for uid, _, turns in batch]
            seed = cfg.seed * 1_000_003 + shard_index * 1009 + turn * 101 + b
            outs = generate_batch(target, prompts, cfg.max_new_tokens, cfg.temperature, seed)
            for (uid, dom, _), prompt, out in zip(batch, prompts, outs):
                new_tokens += len(out)
                answers[uid].append(target.tokenizer.decode(out, skip_special_tokens=True))
                rows.append(
                    {
                        "uid": f"{uid}/turn{turn}",
                        "domain": dom,
                        "input_ids": prompt + out,
                        "loss_mask": [0] * len(prompt) + [1] * len(out),
                        "prompt_len": len(prompt),
                    }
                )
            if turn == 0:
                bar.update(len(batch))
    return rows, new_tokens


def regen_report(target, cfg: RegenConfig, root: Path | None = None) -> dict:
    return json.loads((regen_dir(target, cfg, root) / "report.json").read_text())
