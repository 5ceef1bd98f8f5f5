"""Target-regenerated training data: the target answers the training prompts itself.

Like DFlash and EAGLE-3, drafters learn the target's own outputs, not the corpus
answers: acceptance depends on matching *the target*. Each user turn of a corpus
example becomes one training sequence ``template(prompt so far) + target answer``,
with ``loss_mask = 1`` exactly on the generated answer tokens (EOS included).

The result is a ``datasets.Dataset`` on disk in the artifact cache, keyed by the
target's fingerprint and this config. Prompts are answered in chunks of
``shard_size`` prompts (``shard_{k:05d}/`` on disk, each written atomically with its
own ``.complete`` marker), so an interrupted regeneration resumes at the first missing
chunk and what was finished before a failure is kept.

Regeneration as its own step (``experiments/regenerate.py``, :func:`regenerate_part`):
``shard=(i, N)`` answers the chunks ``k % N == i`` only (N processes or GPUs on one
shared cache; each chunk under its own lock, so overlapping workers never answer a chunk
twice), and a final :func:`regenerate` (``--merge``) concatenates the chunks into the
dataset that ``prepare_data`` reads. Backends: Hugging Face ``generate`` on the target
(default; static left-padded batches) or any OpenAI-compatible server
(:class:`ServerBackend`: ``/v1/completions`` with the chat template rendered here, so
the server sees the very prompt tokens ``generate`` sees; concurrent requests and
retries, :mod:`lit_domino.runtime.serving`). The backend is not part of the cache key: at
temperature 0 both give the target's greedy answers (checked by the tests against a
real ``transformers serve``); which backend answered each chunk is in its marker and in
``report.json``.
"""

from __future__ import annotations

import json
import logging
import time
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import datasets
from tqdm.auto import tqdm

from lit_domino.runtime import cache
from lit_domino.data import shipped
from lit_domino.data.corpora import build_corpus
from lit_domino.runtime.command import UsageError
from lit_domino.runtime.inputs import parse_shard  # noqa: F401 (the API: "i/N" -> (i, N), checked)
from lit_domino.runtime.serving import Completion, ServerClient, ServerError

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


def _messages(turns: list[str], answers: list[str]) -> list[dict]:
    """The conversation so far: every user turn, each followed by its answer when there is one."""
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return messages


def _prompt_ids(target, turns: list[str], answers: list[str]) -> list[int]:
    """Chat-template ids of the conversation so far, ending with the assistant generation prompt."""
    return target.chat_ids(_messages(turns, answers), add_generation_prompt=True)


def _prompt_text(target, turns: list[str], answers: list[str]) -> str:
    """The same prompt as text (what a server's ``/v1/completions`` tokenizes into :func:`_prompt_ids`)."""
    return target.tokenizer.apply_chat_template(_messages(turns, answers), tokenize=False, add_generation_prompt=True,
                                                **target.chat_template_kwargs)


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


@dataclass
class ServerBackend:
    """Regeneration through an OpenAI-compatible server (``vllm serve``, SGLang, ``transformers serve``).

    Each prompt goes to ``/v1/completions`` as the chat-template text rendered here (the server's
    own tokenizer turns it into the ids ``generate`` would see: checked against ``usage.prompt_tokens``);
    the answer comes back as token ids when the server returns them (vLLM with
    ``extra_body={"return_token_ids": True}``), else as text re-tokenized here (see :func:`answer_ids`).
    """

    client: ServerClient
    """The server (URL, model name, retries, extra request fields)."""
    concurrency: int = 16
    """Conversations in flight at once (the turns of one conversation go in order)."""

    def __post_init__(self):
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    def name(self) -> str:
        return f"server {self.client.url} ({self.client.served_model()})"


HF_BACKEND = "hf-generate"
"""The name of the default backend in chunk markers and reports."""


def answer_ids(tokenizer, completion: Completion, eos_ids: list[int], max_tokens: int) -> tuple[list[int], bool]:
    """The answer's token ids from a server's completion, and whether they agree with the server's token count.

    With the server's token ids: those, cut after the first EOS (always consistent). With text only:
    the text re-tokenized, plus the EOS that servers leave out of the text when the answer ended on
    it (the server counted one token more than the text has, and stopped: ``finish_reason == "stop"``,
    or it used the whole budget). Re-tokenizing gives the target's own tokens whenever its greedy
    answer is the canonical tokenization of its text (the usual case for a trained model); when the
    counts disagree it was not, and the answer is kept re-tokenized and reported inconsistent.
    """
    eos = set(eos_ids)
    if completion.token_ids is not None:
        ids = list(completion.token_ids)
        cut = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
        return ids[:cut], True
    ids = [int(t) for t in tokenizer(completion.text, add_special_tokens=False)["input_ids"]]
    eos_token = tokenizer.eos_token_id if tokenizer.eos_token_id in eos else (eos_ids[0] if eos_ids else None)
    n, stopped = completion.completion_tokens, completion.finish_reason == "stop"
    ended = eos_token is not None and n is not None and n == len(ids) + 1 and (stopped or n >= max_tokens)
    if ended:
        return ids + [eos_token], True
    if stopped and eos_token is not None:  # ended on EOS, but the count does not confirm the text's tokens
        return ids + [eos_token], n == len(ids)  # (a server that does not count the EOS)
    return ids, n == len(ids)


def _seed(cfg: RegenConfig, shard_index: int, turn: int, b: int) -> int:
    return cfg.seed * 1_000_003 + shard_index * 1009 + turn * 101 + b


def regen_key(target, cfg: RegenConfig) -> dict:
    """What keys a regenerated set: the target (its name carries a shipped target's weights hash) and ``cfg``."""
    return {"target": target.fingerprint(), "target_name": target.name, "regen": asdict(cfg)}


def regen_dir(target, cfg: RegenConfig, root: Path | None = None) -> Path:
    return cache.artifact_dir("regen", regen_key(target, cfg), name=f"{cfg.split}", root=root)


def _chunks(target, cfg: RegenConfig):
    """The work items cut into chunks of ``shard_size`` prompts (the unit of resume), and the skip count."""
    if target.tokenizer is None:
        raise ValueError("regeneration needs a target with a tokenizer (chat template)")
    items, skipped = _work_items(target, cfg)
    if not items:
        raise ValueError(
            f"no prompts to regenerate: domains {cfg.domains} of split {cfg.split!r} gave "
            f"{skipped} prompts, all longer than max_prompt_tokens={cfg.max_prompt_tokens}"
        )
    return [items[i : i + cfg.shard_size] for i in range(0, len(items), cfg.shard_size)], items, skipped


def _chunk_path(path: Path, k: int) -> Path:
    return path / f"shard_{k:05d}"


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


def regenerate(target, cfg: RegenConfig, root: Path | None = None, progress: bool = True,
               backend: ServerBackend | None = None, merge_only: bool = False, use_shipped: bool = True):
    """Build (or reuse, or resume) the regenerated dataset; returns a ``datasets.Dataset``.

    ``backend``: None = Hugging Face ``generate`` on the target, or a :class:`ServerBackend`.
    ``merge_only``: answer nothing, only concatenate the finished chunks (after :func:`regenerate_part`
    workers); missing chunks are an error naming them.
    ``use_shipped``: install the set shipped with the package for exactly this key, where one ships
    (:mod:`lit_domino.data.shipped`), instead of answering the prompts; False always answers them.
    One process builds it while others wait and reuse it (:func:`lit_domino.runtime.cache.building`);
    a corrupt cached dataset is rebuilt (finished chunks that are intact are kept); the
    caller's random state is left as it was (same batches from a cold or a warm cache).
    """
    path = regen_dir(target, cfg, root)

    def build(p: Path) -> None:
        found = shipped.find(regen_key(target, cfg), p.name) if use_shipped else None
        if found is None:
            _build(target, cfg, p, progress, backend, merge_only)
        else:  # the same greedy answers, shipped with the package: installed in seconds
            shipped.install(*found, p, {"target": target.fingerprint(), "regen": asdict(cfg)})

    return cache.reuse_or_build(path, _load_dataset, build)


def regenerate_part(target, cfg: RegenConfig, shard: tuple[int, int] | str, root: Path | None = None,
                    progress: bool = True, backend: ServerBackend | None = None) -> dict:
    """Answer this worker's chunks (``k % N == i`` for ``shard=(i, N)``) and write each one; returns a summary.

    Workers share one cache directory; each chunk is answered under its own lock, so overlapping
    workers (or a merge running at the same time) never answer a chunk twice. A failure keeps the
    finished chunks: rerun the same command to continue. :func:`regenerate` (``merge_only=True``)
    then concatenates all chunks.
    """
    i, n = parse_shard(shard)
    path = regen_dir(target, cfg, root)
    if cache.is_complete(path, warn=False):
        return {"path": str(path), "shard": f"{i}/{n}", "chunks": 0, "answered": 0, "merged": True}
    shards, _, _ = _chunks(target, cfg)
    mine = [k for k in range(len(shards)) if k % n == i]
    answered = _answer_chunks(target, cfg, path, shards, mine, progress, backend, f"regenerate {cfg.split} {i}/{n}")[1]
    return {"path": str(path), "shard": f"{i}/{n}", "chunks": len(mine), "answered": answered,
            "total_chunks": len(shards), "merged": False}


def missing_chunks(target, cfg: RegenConfig, root: Path | None = None) -> list[int]:
    """Indices of the chunks not finished yet (all of them before any worker ran)."""
    path = regen_dir(target, cfg, root)
    shards, _, _ = _chunks(target, cfg)
    return [k for k in range(len(shards)) if not cache.is_complete(_chunk_path(path, k), warn=False)]


def _answer_chunks(target, cfg, path: Path, shards, indices, progress: bool, backend, desc: str):
    """Load or answer the chunks ``indices``; returns (their datasets, how many were answered now, new tokens, seconds)."""
    start_done = {k for k in indices if cache.is_complete(_chunk_path(path, k), warn=False)}
    total = sum(len(shards[k]) for k in indices)
    bar = tqdm(total=total, desc=desc, disable=not progress, initial=sum(len(shards[k]) for k in start_done))
    parts, answered, new_tokens, seconds = [], 0, 0, 0.0
    try:
        for k in indices:
            chunk = _chunk_path(path, k)
            part = _load_shard(chunk)
            if part is None:
                with cache.building(chunk):  # one writer per chunk, whichever worker gets there first
                    part = _load_shard(chunk)
                    if part is None:
                        t0 = time.time()
                        try:
                            rows, tokens, inconsistent = _regenerate_shard(target, cfg, shards[k], k, bar, backend)
                        except ServerError as err:
                            done = sum(cache.is_complete(_chunk_path(path, j), warn=False) for j in range(len(shards)))
                            raise ServerError(err.url, f"{err}\n{done} of {len(shards)} chunks of {path} are finished "
                                                       "and kept; rerun the same command to continue") from err
                        elapsed = time.time() - t0
                        with cache.staging(chunk) as tmp:  # a chunk is whole or absent
                            datasets.Dataset.from_list(rows).save_to_disk(str(tmp))
                            cache.mark_complete(tmp, {"shard": k, "backend": HF_BACKEND if backend is None else
                                                      backend.name(), "new_tokens": tokens,
                                                      "seconds": round(elapsed, 2), "inconsistent": inconsistent})
                        part = datasets.load_from_disk(str(chunk))
                        answered, new_tokens, seconds = answered + 1, new_tokens + tokens, seconds + elapsed
                    elif k not in start_done:  # another worker finished it while this one waited
                        bar.update(len(shards[k]))
            elif k not in start_done:
                bar.update(len(shards[k]))
            parts.append(part)
    finally:
        bar.close()
    return parts, answered, new_tokens, seconds


def _chunk_meta(path: Path, k: int) -> dict:
    try:
        meta = json.loads((_chunk_path(path, k) / cache.ARTIFACT_CONFIG).read_text())
    except (OSError, ValueError):
        meta = {}
    return meta if isinstance(meta, dict) else {}


def _build(target, cfg: RegenConfig, path: Path, progress: bool, backend=None, merge_only: bool = False) -> None:
    shards, items, skipped = _chunks(target, cfg)
    if merge_only:
        missing = [k for k in range(len(shards)) if not cache.is_complete(_chunk_path(path, k), warn=False)]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise UsageError(f"cannot merge {path}: {len(missing)} of {len(shards)} chunks are not regenerated yet "
                             f"(chunks {shown}); run the --shard i/N workers first (chunk k belongs to shard k % N), "
                             "or drop --merge to answer them here")
    parts, _, new_tokens, seconds = _answer_chunks(target, cfg, path, shards, range(len(shards)), progress, backend,
                                                   f"regenerate {cfg.split}")
    ds = datasets.concatenate_datasets(parts)
    with cache.staging(path / "dataset") as tmp:
        ds.save_to_disk(str(tmp))
    metas = [_chunk_meta(path, k) for k in range(len(shards))]
    report = {
        "sequences": len(ds),
        "prompts": len(items),
        "chunks": len(shards),
        "skipped_long_prompts": skipped,
        "response_tokens": int(sum(sum(m) for m in ds["loss_mask"])),
        "backends": sorted({m.get("backend", HF_BACKEND) for m in metas}),
        "inconsistent_answers": int(sum(m.get("inconsistent", 0) for m in metas)),
        "seconds": round(seconds, 1),
        "tokens_per_second": round(new_tokens / seconds, 1) if seconds > 0 and new_tokens else None,
    }
    (path / "report.json").write_text(json.dumps(report, indent=2))
    locks = tuple(p.name for p in path.glob(".*.lock"))  # the chunks' lock files are not part of the artifact
    cache.mark_complete(path, {"target": target.fingerprint(), "regen": asdict(cfg)}, exclude=cache.TRANSIENT + locks)


def _regenerate_shard(target, cfg: RegenConfig, shard, shard_index: int, bar, backend=None):
    """Answer every turn of every prompt in one chunk; returns (rows, new tokens, inconsistent answers).

    Rows are ordered by (turn, prompt) whichever the backend; turn k of a prompt waits for its answer to turn k-1.
    """
    if backend is not None:
        return _server_shard(target, cfg, shard, shard_index, bar, backend)
    answers: dict[str, list[str]] = {uid: [] for uid, _, _ in shard}
    rows, new_tokens = [], 0
    max_turns = max(len(turns) for _, _, turns in shard)
    for turn in range(max_turns):
        active = [(uid, dom, turns) for uid, dom, turns in shard if len(turns) > turn]
        for b in range(0, len(active), cfg.batch_size):
            batch = active[b : b + cfg.batch_size]
            prompts = [_prompt_ids(target, turns[: turn + 1], answers[uid]) for uid, _, turns in batch]
            outs = generate_batch(target, prompts, cfg.max_new_tokens, cfg.temperature, _seed(cfg, shard_index, turn, b))
            for (uid, dom, _), prompt, out in zip(batch, prompts, outs):
                new_tokens += len(out)
                answers[uid].append(target.tokenizer.decode(out, skip_special_tokens=True))
                rows.append(_row(uid, dom, turn, prompt, out))
            if turn == 0:
                bar.update(len(batch))
    return rows, new_tokens, 0


def _row(uid: str, domain: str, turn: int, prompt: list[int], out: list[int]) -> dict:
    return {
        "uid": f"{uid}/turn{turn}",
        "domain": domain,
        "input_ids": prompt + out,
        "loss_mask": [0] * len(prompt) + [1] * len(out),
        "prompt_len": len(prompt),
    }


def serves_target(served: str, target_name: str) -> bool:
    """Whether a server's model name plausibly names the target: the same string, or the same folder name (a
    server started on a local directory lists its path; an embedded target's name is ``embedded:<folder name>``)."""
    name = str(target_name).removeprefix("embedded:")
    return served == target_name or Path(served).name == Path(name).name


def _server_shard(target, cfg: RegenConfig, shard, shard_index: int, bar, backend: ServerBackend):
    """One chunk through a server: ``backend.concurrency`` conversations at once, each turn after the previous."""
    client, tok, eos_ids = backend.client, target.tokenizer, target.eos_token_ids
    lock = threading.Lock()  # fast tokenizers are not safe to call from several threads at once
    served = client.served_model()
    if not serves_target(served, target.name):
        log.warning("the server at %s serves %r, the target is %r: make sure it is the same model (the answers "
                    "are cached under the target's fingerprint)", client.url, served, target.name)

    def conversation(job):
        j, (uid, _, turns) = job
        answers, outs = [], []
        for turn in range(len(turns)):
            with lock:
                prompt = _prompt_ids(target, turns[: turn + 1], answers)
                text = _prompt_text(target, turns[: turn + 1], answers)
            seed = _seed(cfg, shard_index, turn, j) if cfg.temperature > 0 else None
            c = client.complete(text, max_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=seed)
            if c.prompt_tokens is not None and c.prompt_tokens != len(prompt):
                raise ServerError(client.url, f"the server at {client.url} read the prompt of {uid} (turn {turn}) as "
                                              f"{c.prompt_tokens} tokens, the target's tokenizer gives {len(prompt)}: it "
                                              "serves another tokenizer or adds special tokens (a BOS); serve the "
                                              f"target {target.name!r} itself")
            with lock:
                ids, consistent = answer_ids(tok, c, eos_ids, cfg.max_new_tokens)
                answers.append(tok.decode(ids, skip_special_tokens=True))
            outs.append((prompt, ids, consistent))
            if turn == 0:
                with lock:
                    bar.update(1)
        return outs

    results = client.map(conversation, list(enumerate(shard)), backend.concurrency)
    rows, new_tokens, inconsistent = [], 0, 0
    for turn in range(max(len(turns) for _, _, turns in shard)):
        for (uid, dom, _), outs in zip(shard, results):
            if turn < len(outs):
                prompt, ids, consistent = outs[turn]
                rows.append(_row(uid, dom, turn, prompt, ids))
                new_tokens += len(ids)
                inconsistent += not consistent
    if inconsistent:
        log.warning("chunk %d: %d answer(s) from %s re-tokenized to a different token count than the server generated "
                    "(kept re-tokenized; pass extra_body {\"return_token_ids\": true} to a vLLM server for exact ids)",
                    shard_index, inconsistent, client.url)
    return rows, new_tokens, inconsistent


def regen_report(target, cfg: RegenConfig, root: Path | None = None) -> dict:
    return json.loads((regen_dir(target, cfg, root) / "report.json").read_text())
