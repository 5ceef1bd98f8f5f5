"""The embedded default target: a tiny Qwen3 trained from scratch on the embedded corpora.

Without a GPU or a model hub the suite still needs a real target: a model that
has learnt its data, so that drafters learn something and acceptance means
something. This module builds one, end to end and offline:

1. a byte-level BPE tokenizer on the embedded corpora (cached by its config),
2. a ``Qwen3ForCausalLM`` with a tiny config, trained by a LightningModule on
   the chat-rendered corpora packed into fixed windows,
3. an evaluation (held-out perplexity per domain, greedy math exact match),
4. ``save_pretrained`` into the artifact cache under a hash of its config.

``load_target("embedded:default")`` calls :func:`build_tiny_target` and reuses the
cached model when present; an interrupted build resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from torch.utils.data import TensorDataset
from transformers import AutoTokenizer, Qwen3ForCausalLM

from lit_domino.runtime import cache
from lit_domino.runtime.quiet import quiet_lightning
from lit_domino.target import embedded as embedded_target
from lit_domino.data.corpora import build_corpus
from lit_domino.target.qwen3 import qwen3_config as build_qwen3_config
from lit_domino.data.regenerate import encode_conversation
from lit_domino.data.resumable import ResumableLoader, TrackLoaderPosition
from lit_domino.target.embedded import TinyTargetConfig, preset_config
from lit_domino.target.tokenizer import train_tokenizer


# --------------------------------------------------------------------------- corpora → text


def corpus_examples(cfg: TinyTargetConfig, split: str = "train", n_override: int | None = None):
    out = []
    for domain, n in cfg.examples_per_domain:
        out.extend(build_corpus(domain, split, n if n_override is None else n_override, seed=cfg.corpus_seed))
    return out


def render(example) -> str:
    """A corpus example as chat-template text (what the target is trained on).

    Written out rather than rendered with the tokenizer, which does not exist yet when
    the tokenizer itself is trained; ``tests/target/test_tokenizer.py`` checks both agree."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in example.messages)


def build_tokenizer(cfg: TinyTargetConfig, root: Path | None = None):
    """Train (or reuse from the cache) the embedded BPE tokenizer (one process trains it, others wait)."""
    path = cache.artifact_dir("tokenizer", cfg.tokenizer_config(), name=f"bpe{cfg.vocab_size}", root=root)

    def build(p: Path):
        with cache.staging(p) as tmp:  # whole or absent: a killed build leaves no stub
            texts = [render(e) for e in corpus_examples(cfg)]
            train_tokenizer(texts, vocab_size=cfg.vocab_size).save_pretrained(tmp)
            cache.mark_complete(tmp, cfg.tokenizer_config())

    return cache.reuse_or_build(path, AutoTokenizer.from_pretrained, build)


def pack_windows(token_lists: list[list[int]], seq_len: int, separator: int) -> torch.Tensor:
    """Concatenate documents (each preceded by ``separator``) and cut ``[n, seq_len + 1]`` windows."""
    stream = []
    for ids in token_lists:
        stream.append(separator)
        stream.extend(ids)
    n = (len(stream) - 1) // seq_len
    if n == 0:
        raise ValueError(f"corpus too small: {len(stream)} tokens for windows of {seq_len}")
    flat = torch.tensor(stream[: n * seq_len + 1], dtype=torch.long)
    # windows overlap by one token so each has its own next-token label for the last position
    return torch.stack([flat[i * seq_len : (i + 1) * seq_len + 1] for i in range(n)])


# --------------------------------------------------------------------------- model + training


def qwen3_config(cfg: TinyTargetConfig, tokenizer):
    """The embedded target's ``Qwen3Config`` (:func:`lit_domino.target.qwen3.qwen3_config`)."""
    return build_qwen3_config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_positions=cfg.max_positions,
        rope_theta=cfg.rope_theta,
        tie_embeddings=True,  # as Qwen3's small models: the LM head is the embedding table
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


class EpochSampler(torch.utils.data.Sampler):
    """The order of ``DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed))``,
    epoch by epoch, recomputed from ``(seed, epoch)`` so that a resumed build sees it too.

    That loader's generator draws the iterator's base seed, then a permutation, once per
    epoch; epoch ``e`` is the ``e + 1``-th permutation of that stream (so builds made before
    this sampler existed train on the same batches). :meth:`resume` skips the samples a
    checkpointed epoch had already consumed.
    """

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this at every epoch start
        self.epoch = epoch

    def resume(self, epoch: int, skip: int) -> None:
        """Start in ``epoch`` after its first ``skip`` samples (once; later epochs start at 0)."""
        self.epoch, self._resume = epoch, (epoch, skip)

    def order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(epoch + 1):
            torch.empty((), dtype=torch.int64).random_(generator=g)  # the DataLoader iterator's base seed
            perm = torch.randperm(self.n, generator=g)
        return perm.tolist()

    def __len__(self):
        return self.n

    def __iter__(self):
        skip = 0
        if self._resume is not None:
            if self._resume[0] == self.epoch:
                skip = self._resume[1]
            self._resume = None
        return iter(self.order(self.epoch)[skip:])


def _lm_module(cfg: TinyTargetConfig, model):
    class TinyTargetLM(L.LightningModule):
        """Next-token training of the tiny target on packed windows (all tokens are labels).

        Training time is carried in the checkpoints, so ``train_seconds`` sums the segments
        of a build that was interrupted and resumed."""

        def __init__(self):
            super().__init__()
            self.model = model
            self.seconds_before, self.segments_before, self._t0 = 0.0, 0, None

        def training_step(self, batch, batch_idx):
            x = batch[0]
            logits = self.model(input_ids=x[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
            self.log("train/loss", loss, prog_bar=True)
            return loss

        def on_train_start(self):
            self._t0 = time.perf_counter()

        def train_seconds(self) -> float:
            return self.seconds_before + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)

        def on_save_checkpoint(self, checkpoint):
            checkpoint["lit_domino"] = {"train_seconds": self.train_seconds(), "segments": self.segments_before + 1}

        def on_load_checkpoint(self, checkpoint):
            state = checkpoint.get("lit_domino", {})
            self.seconds_before = float(state.get("train_seconds", 0.0))
            self.segments_before = int(state.get("segments", 0))

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
            warm = max(1, int(cfg.warmup_ratio * cfg.max_steps))

            def factor(step):  # linear warmup, cosine decay to 10 %
                if step < warm:
                    return (step + 1) / warm
                t = min(1.0, (step - warm) / max(1, cfg.max_steps - warm))
                return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

            return [opt], [{"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, factor), "interval": "step"}]

    return TinyTargetLM()


class StepProgressBar(TQDMProgressBar):
    """One bar over the optimizer steps: the target trains by ``max_steps`` only (``max_epochs=-1``), where
    Lightning's own bar reads "Epoch 0/-2" and restarts on every pass over the windows."""

    def on_train_epoch_start(self, trainer, *_):
        bar = self.train_progress_bar
        if bar.total != trainer.max_steps:  # once (the base class resets it on every epoch)
            bar.reset(total=trainer.max_steps)
            bar.set_description("tiny target steps")
            self._show(bar, trainer.global_step)  # a resumed build starts where it stopped

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        bar = self.train_progress_bar
        if bar is not None and self._should_update(trainer.global_step, bar.total):
            self._show(bar, trainer.global_step)
            bar.set_postfix(self.get_metrics(trainer, pl_module))

    @staticmethod
    def _show(bar, n: int) -> None:
        if not bar.disable:
            bar.n = n
            bar.refresh()


def train_model(cfg: TinyTargetConfig, tokenizer, workdir: Path, progress: bool = True, *,
                checkpoint_every: int = 100, callbacks=()):
    """Train the tiny Qwen3 on the packed corpora; resumes exactly from ``workdir/ckpt/last.ckpt``.

    A checkpoint every ``checkpoint_every`` optimizer steps holds the weights, optimizer,
    schedule and the loader's position, so an interrupted build, resumed, ends with the
    weights of an uninterrupted one. Seeded inside :func:`lit_domino.runtime.cache.isolated_rng`:
    the caller's random state is left as it was. ``callbacks``: extra Lightning callbacks.
    """

    with cache.isolated_rng(cfg.seed), quiet_lightning(workdir / "train.log"):  # banners, tips: in the log
        L.seed_everything(cfg.seed, verbose=False)
        docs = [tokenizer(render(e), add_special_tokens=False)["input_ids"] for e in corpus_examples(cfg)]
        windows = pack_windows(docs, cfg.seq_len, tokenizer.bos_token_id)
        model = Qwen3ForCausalLM(qwen3_config(cfg, tokenizer))
        # whole windows in EpochSampler order, no draw from the global generator; resumable mid-epoch
        loader = ResumableLoader(TensorDataset(windows), sampler=EpochSampler(len(windows), cfg.seed),
                                 batch_size=cfg.batch_size, drop_last=True,
                                 generator=torch.Generator().manual_seed(cfg.seed))
        module = _lm_module(cfg, model)
        ckpt_dir = workdir / "ckpt"
        trainer = L.Trainer(
            max_steps=cfg.max_steps,
            accelerator="cpu",
            precision="32-true",  # bf16 is far slower on CPUs without AMX
            logger=False,
            gradient_clip_val=1.0,
            callbacks=[ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=checkpoint_every,
                                       save_top_k=0,
                                       # always last.ckpt: a resumed run from a moved or copied
                                       # checkpoint would otherwise write last-v1.ckpt, and the
                                       # next resume would read the stale last.ckpt
                                       enable_version_counter=False),
                       TrackLoaderPosition(), *callbacks, *([StepProgressBar()] if progress else [])],
            enable_progress_bar=progress,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        last = ckpt_dir / "last.ckpt"
        trainer.fit(module, loader, ckpt_path=str(last) if last.exists() else None)
    if trainer.interrupted:
        raise KeyboardInterrupt("the embedded target's training was interrupted; rerun to resume it")
    stats = {
        "train_seconds": round(module.train_seconds(), 1),
        "train_segments": module.segments_before + 1,
        "train_tokens": cfg.max_steps * cfg.batch_size * cfg.seq_len,
        "corpus_tokens": int(sum(len(d) + 1 for d in docs)),
        "final_train_loss": float(trainer.callback_metrics.get("train/loss", float("nan"))),
    }
    return model.eval().requires_grad_(False), stats


# --------------------------------------------------------------------------- evaluation

_ANSWER = re.compile(r"####\s*(-?[\d,\.]+)")


def extract_answer(text: str) -> str | None:
    """The final ``#### N`` answer of a GSM8K-style solution (commas removed)."""
    m = _ANSWER.search(text)
    return m.group(1).replace(",", "").rstrip(".") if m else None


@torch.no_grad()
def response_perplexity(model, tokenizer, examples, batch_size: int = 16) -> float:
    """exp(mean NLL) over assistant tokens of ``examples`` (teacher-forced)."""
    nll, count = 0.0, 0
    for i in range(0, len(examples), batch_size):
        encs = [encode_conversation(tokenizer, e.messages) for e in examples[i : i + batch_size]]
        T = max(len(ids) for ids, _ in encs)
        x = torch.full((len(encs), T), tokenizer.pad_token_id)
        m = torch.zeros(len(encs), T)
        for r, (ids, mask) in enumerate(encs):
            x[r, : len(ids)] = torch.tensor(ids)
            m[r, : len(ids)] = torch.tensor(mask, dtype=torch.float)
        logits = model(input_ids=x, attention_mask=(x != tokenizer.pad_token_id).long()).logits[:, :-1]
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        nll += float((ce * m[:, 1:]).sum())
        count += int(m[:, 1:].sum())
    return math.exp(nll / max(count, 1))


@torch.no_grad()
def math_accuracy(model, tokenizer, examples, max_new_tokens: int = 192, batch_size: int = 25) -> float:
    """Greedy exact-match accuracy of the final ``#### N`` answer on held-out math problems."""
    correct = 0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        prompts = [
            tokenizer.apply_chat_template([e.messages[0]], tokenize=False, add_generation_prompt=True) for e in chunk
        ]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        correct += sum(extract_answer(t) == e.answer for t, e in zip(texts, chunk))
    return correct / max(len(examples), 1)


def evaluate(cfg: TinyTargetConfig, model, tokenizer) -> dict:
    """Held-out perplexity per domain (response tokens) and math exact-match accuracy."""
    report = {}
    for domain, _ in cfg.examples_per_domain:
        held_out = build_corpus(domain, "eval", cfg.eval_examples, seed=cfg.corpus_seed)
        report[f"ppl_{domain}"] = round(response_perplexity(model, tokenizer, held_out), 3)
    report["math_accuracy"] = math_accuracy(model, tokenizer, build_corpus("math", "eval", cfg.eval_examples))
    return report


# --------------------------------------------------------------------------- the cached build


def target_dir(cfg: TinyTargetConfig, root: Path | None = None) -> Path:
    return cache.artifact_dir("target", cfg, name=cfg.name, root=root)


def build_tiny_target(cfg: TinyTargetConfig | str = "default", root: Path | None = None, progress: bool = True,
                      callbacks=()) -> Path:
    """Build (or reuse) the embedded target; returns its ``save_pretrained`` directory.

    One process builds it (others wait on its lock, then reuse it); an interrupted build
    resumes exactly from its last checkpoint; a failure before the first checkpoint
    leaves no folder behind; the caller's random state is left as it was. ``callbacks``: extra Lightning
    callbacks of its training (the ablation's :class:`~lit_domino.runtime.jobclock.StageProgress`).
    """
    if isinstance(cfg, str):
        cfg = preset_config(cfg)
    path = target_dir(cfg, root)
    if cache.is_complete(path):
        return path
    with cache.building(path):
        if cache.is_complete(path, warn=False):  # built by another process meanwhile
            return path
        cache.invalidate(path)  # a corrupt one is rebuilt (its resume state, if any, is kept)
        path.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        tokenizer = build_tokenizer(cfg, root)
        model, stats = train_model(cfg, tokenizer, path, progress=progress, callbacks=callbacks)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        report = {
            "parameters": sum(p.numel() for p in model.parameters()),
            **stats,
            **evaluate(cfg, model, tokenizer),
            "build_seconds": round(time.time() - t0, 1),
        }
        (path / "report.json").write_text(json.dumps(report, indent=2))
        cache.mark_complete(path, asdict(cfg))  # ckpt/ is not recorded: it goes next
        shutil.rmtree(path / "ckpt", ignore_errors=True)  # resume state, useless once finished
    return path


def target_report(cfg: TinyTargetConfig | str = "default", root: Path | None = None) -> dict:
    """The build report (parameters, training time, perplexities, math accuracy) of a built target."""
    cfg = preset_config(cfg) if isinstance(cfg, str) else cfg
    return json.loads((target_dir(cfg, root) / "report.json").read_text())


def with_overrides(cfg: TinyTargetConfig, **overrides) -> TinyTargetConfig:
    return replace(cfg, **overrides)




# --------------------------------------------------------------------------- the shipped copy

GREEDY_REFERENCE = "greedy_reference.json"
"""The fp32 build's greedy answers to held-out prompts, shipped beside the weights: the shipped copy,
loaded in fp32, must reproduce them token for token (``tests/target/test_shipped.py``)."""


def held_out_prompts(cfg: TinyTargetConfig, tokenizer, per_domain: int) -> list[list[int]]:
    """The first ``per_domain`` held-out problems of each domain, as chat-template prompt ids."""
    prompts = []
    for domain, _ in cfg.examples_per_domain:
        for e in build_corpus(domain, "eval", per_domain, seed=cfg.corpus_seed):
            prompts.append(tokenizer.apply_chat_template([e.messages[0]], tokenize=True, add_generation_prompt=True,
                                                         return_dict=False))
    return [list(map(int, p)) for p in prompts]


@torch.no_grad()
def greedy_answers(model, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations, one prompt at a time (no padding: what the decoding engine sees)."""
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                           do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        out.append(y[0, len(ids):].tolist())
    return out


def ship_target(cfg: TinyTargetConfig, source: Path, dest_root: Path | None = None, *, per_domain: int = 30,
                max_new_tokens: int = 128) -> Path:
    """Write the shipped copy of the build ``source`` (a :func:`build_tiny_target` folder) for ``cfg``.

    The weights are stored in float16 when the rounded model's greedy answers to ``per_domain`` held-out
    prompts per domain are identical to the fp32 build's, else in float32 (the card says which). Beside
    them: the tokenizer, the build report, the fp32 answers (:data:`GREEDY_REFERENCE`), ``target_card.json``
    (the recipe, the report, a SHA-256 per file) and ``TARGET_CARD.md``. Written to a staging folder and
    swapped in whole.
    """
    dest = (dest_root or embedded_target.SHIPPED_ROOT) / cfg.name
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = Qwen3ForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    prompts = held_out_prompts(cfg, tokenizer, per_domain)
    reference = greedy_answers(model, tokenizer, prompts, max_new_tokens)
    stored, checks = torch.float32, {}
    for dtype in (torch.float16, torch.bfloat16):
        rounded = Qwen3ForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
        rounded.load_state_dict({k: v.to(dtype).float() for k, v in model.state_dict().items()})
        same = sum(a == b for a, b in zip(greedy_answers(rounded, tokenizer, prompts, max_new_tokens), reference))
        checks[str(dtype).removeprefix("torch.")] = f"{same}/{len(prompts)}"
        if same == len(prompts):
            stored = dtype
            break
    tmp = dest.with_name(dest.name + ".staging")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.to(stored).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    report = json.loads((source / "report.json").read_text())
    (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (tmp / GREEDY_REFERENCE).write_text(json.dumps({"max_new_tokens": max_new_tokens, "per_domain": per_domain,
                                                    "prompts": prompts, "answers": reference}) + "\n")
    files = {p.name: embedded_target._sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    card = {"recipe": cache.to_jsonable(cfg), "report": report, "stored_dtype": str(stored).removeprefix("torch."),
            "greedy_identical_to_fp32": checks, "files": files}
    (tmp / embedded_target.CARD_NAME).write_text(json.dumps(card, indent=2) + "\n")
    (tmp / "TARGET_CARD.md").write_text(target_card_markdown(cfg, card, tmp))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def target_card_markdown(cfg: TinyTargetConfig, card: dict, folder: Path) -> str:
    """The human-readable card: what the target is, how it was trained, how good it is, how to rebuild it."""
    r = card["report"]
    size = sum((folder / f).stat().st_size for f in card["files"])
    recipe = "\n".join(f"| `{k}` | `{v}` |" for k, v in card["recipe"].items())
    ppl = ", ".join(f"{k.removeprefix('ppl_')} {v}" for k, v in r.items() if k.startswith("ppl_"))
    return f"""# Embedded target `{cfg.name}`

A {r['parameters'] / 1e6:.1f}M-parameter `Qwen3ForCausalLM` trained from scratch by the suite's own recipe
(`lit_domino.target.embedded.TARGET_PRESETS[{cfg.name!r}]`) on the embedded corpora (GSM8K-style math,
the standard library's Python, chat). `load_target("embedded:{cfg.name}")` loads this copy (fp32 in memory).

| | |
|---|---|
| optimizer steps | {cfg.max_steps} ({r['train_tokens']:,} tokens, batch {cfg.batch_size} x {cfg.seq_len}) |
| training time | {r['train_seconds'] / 60:.1f} min of wall time on CPU ({r['train_segments']} segment(s)) |
| greedy math accuracy | {r['math_accuracy']:.1%} ({cfg.eval_examples} held-out problems) |
| held-out perplexity (answers) | {ppl} |
| final training loss | {r['final_train_loss']:.3f} |
| weights on disk | {card['stored_dtype']} (greedy answers identical to the fp32 build: {card['greedy_identical_to_fp32']}) |
| files | {size / 2**20:.1f} MiB, SHA-256 of each in `target_card.json` |
{"".join(f"{chr(10)}{note}{chr(10)}" for note in card.get("notes", []))}
Rebuild from the recipe (cached under `artifacts/target/`), then ship it here:

    python experiments/build_target.py --preset {cfg.name} --ship

Use the recipe's own build instead of this copy: `--set data.target=embedded:{cfg.name}@recipe`.

## Recipe

| field | value |
|---|---|
{recipe}
"""
