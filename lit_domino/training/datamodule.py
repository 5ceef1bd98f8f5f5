"""The one DataModule every drafter variant trains on.

It prepares (through the artifact cache) the target, the target-regenerated train
and validation sequences and, by default, a cache of the target's features for
them; it batches sequences with their loss masks and features and draws the
training anchors of docs/METHOD.md afresh at every optimizer step.

Features cached or online? Every variant and seed of an ablation reads the same
target features, and on CPU a target forward costs about as much as a drafter's
training step, so computing them once and reading them back (fp16 memmap) is
the default; ``features="online"`` recomputes them per batch on the device
(the right choice for an 8B target, whose features would not fit on disk).
"""

from __future__ import annotations

from dataclasses import asdict

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lit_domino.runtime import cache
from lit_domino.runtime.command import UsageError
from lit_domino.data.corpora import DOMAINS
from lit_domino.data.hub_prompts import SEPARATOR, SOURCES, is_hub_source
from lit_domino.data.regenerate import RegenConfig, regen_dir, regenerate
from lit_domino.data.resumable import ResumableLoader
from lit_domino.target.load import check_layer_ids, load_target
# The feature cache lives apart; its names stay importable from here.
from lit_domino.training.feature_cache import compute_features, build_feature_cache, feature_cache_dir  # noqa: F401


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator):
    """Draw up to ``num_anchors`` distinct anchors per row where ``a`` and ``a+1`` are response tokens.

    Returns ``anchors [b, A]`` (sorted, 0 where unused) and ``anchor_mask [b, A]``.
    """
    b, T = loss_mask.shape
    valid = torch.zeros(b, T, dtype=torch.bool, device=loss_mask.device)
    valid[:, :-1] = (loss_mask[:, :-1] > 0) & (loss_mask[:, 1:] > 0)
    scores = torch.rand(b, T, generator=generator).to(loss_mask.device)
    scores = scores.masked_fill(~valid, -1.0)  # invalid positions lose every draw
    k = min(num_anchors, T)
    top = scores.topk(k, dim=1)
    mask = top.values >= 0
    anchors = torch.where(mask, top.indices, torch.zeros_like(top.indices))
    # sort real anchors by position (unused slots last) so blocks read left to right
    order = torch.argsort(torch.where(mask, anchors, torch.full_like(anchors, T + 1)), dim=1)
    anchors, mask = anchors.gather(1, order), mask.gather(1, order)
    if k < num_anchors:  # pad to a fixed count so batch shapes never change
        pad = num_anchors - k
        anchors = torch.cat([anchors, anchors.new_zeros(b, pad)], 1)
        mask = torch.cat([mask, mask.new_zeros(b, pad)], 1)
    return anchors, mask


class RaggedColumn:
    """A list-valued column of an Arrow-backed dataset read as NumPy views of its Arrow buffers: a row costs a
    slice, where a ``datasets`` row read converts the row to a Python list, a measurable share of a small
    drafter's training step (docs/results.md, 2026-12-07 (evening)). Nothing is copied from a memory-mapped
    dataset without an indices mapping (one with, e.g. after ``select``, is taken once into memory)."""

    def __init__(self, hf_dataset, name: str):
        chunks = hf_dataset.with_format("arrow")[:][name].chunks
        # a sliced ListArray keeps its child whole: .offsets are the slice's, into the unsliced .values
        self._values = [c.values.to_numpy(zero_copy_only=False) for c in chunks]
        self._offsets = [c.offsets.to_numpy(zero_copy_only=False) for c in chunks]
        self._starts = np.cumsum([0] + [len(c) for c in chunks])  # the first row of each chunk

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of a column of {len(self)} rows")
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        j = i - int(self._starts[k])
        off = self._offsets[k]
        return self._values[k][off[j]:off[j + 1]]


class RegenSequences(Dataset):
    """Regenerated sequences (truncated to ``max_length``) with optional cached features."""

    def __init__(self, hf_dataset, max_length: int, features: np.ndarray | None = None, offsets=None):
        self.input_ids = RaggedColumn(hf_dataset, "input_ids")
        self.loss_mask = RaggedColumn(hf_dataset, "loss_mask")
        self.max_length = max_length
        self.features, self.offsets = features, offsets

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        ids = self.input_ids[i][: self.max_length]
        n = len(ids)
        item = {  # int64, as torch.tensor made of the Python lists a datasets row read gave
            "input_ids": torch.from_numpy(ids.astype(np.int64)),
            "loss_mask": torch.from_numpy(self.loss_mask[i][:n].astype(np.int64)),
            "index": i,
        }
        if self.features is not None:
            start = int(self.offsets[i])
            item["features"] = torch.from_numpy(np.asarray(self.features[start : start + n], dtype=np.float32))
        return item


def collate(items: list[dict], pad_id: int) -> dict:
    """Right-pad a list of sequences into the training batch of docs/ARCHITECTURE.md (no anchors yet)."""
    T = max(len(it["input_ids"]) for it in items)
    b = len(items)
    batch = {
        "input_ids": torch.full((b, T), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros(b, T, dtype=torch.long),
        "loss_mask": torch.zeros(b, T, dtype=torch.long),
        "index": torch.tensor([it["index"] for it in items]),
    }
    has_features = "features" in items[0]
    if has_features:
        batch["features"] = torch.zeros(b, T, items[0]["features"].shape[-1])
    for r, it in enumerate(items):
        n = len(it["input_ids"])
        batch["input_ids"][r, :n] = it["input_ids"]
        batch["attention_mask"][r, :n] = 1
        batch["loss_mask"][r, :n] = it["loss_mask"]
        if has_features:
            batch["features"][r, :n] = it["features"]
    return batch


class EpochShuffleSampler(DistributedSampler):
    """A shuffle seeded by (seed, epoch): the same order after a resume, a new one each epoch.

    With ``lengths`` it groups by length (Hugging Face's ``group_by_length``): the shuffled
    order is cut into pools of ``pool_batches`` batches, each pool is sorted by length and cut
    into batches, and the whole batches are shuffled. Random batches of regenerated sequences
    (prompt + a ~50-token answer, a long tail up to ``max_length``) are mostly padding; grouped
    ones hardly any, which cuts a drafter's training time at the same samples and steps (but see
    ``DrafterDataModule``'s ``group_by_length``: it can cost accuracy).

    Distributed (``num_replicas`` R > 1, this process's ``rank``): every rank builds the same
    order of *global* batches of ``R·batch_size`` (pools, sorting and the batch shuffle all work
    on global batches), and rank r takes the r-th slice of ``batch_size`` of each. So one
    optimizer step over R ranks sees exactly the global batch a single process with
    ``batch_size·R`` sees, length-grouped alike. It subclasses ``DistributedSampler`` so that
    Lightning keeps it as it is (its ``DistributedSamplerWrapper`` would reshuffle the grouped
    order). A short last global batch is padded to a multiple of R with the epoch's first
    items (as ``DistributedSampler`` pads): every rank runs the same number of steps.
    """

    def __init__(self, n: int, seed: int, lengths: list[int] | None = None, batch_size: int = 1,
                 pool_batches: int = 50, num_replicas: int = 1, rank: int = 0):
        if lengths is not None and len(lengths) != n:
            raise ValueError(f"EpochShuffleSampler: {len(lengths)} lengths for {n} items")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"EpochShuffleSampler: rank {rank} is not in [0, num_replicas={num_replicas})")
        super().__init__(range(n), num_replicas=num_replicas, rank=rank, shuffle=False, seed=seed)
        self.n, self.seed, self.epoch = n, seed, 0
        self._resume: tuple[int, int] | None = None
        self.lengths, self.batch_size = lengths, batch_size
        self.global_batch = batch_size * num_replicas
        self.pool = self.global_batch * pool_batches

    def set_epoch(self, epoch: int):  # Lightning calls this at every epoch start
        self.epoch = epoch

    def resume(self, epoch: int, skip: int) -> None:
        """Start in ``epoch`` after this rank's first ``skip`` samples (once; later epochs start at 0):
        a resumed training continues with its first unseen batch (:class:`ResumableLoader`)."""
        self.epoch, self._resume = epoch, (epoch, skip)

    def __len__(self):
        full, rest = divmod(self.n, self.global_batch)
        return full * self.batch_size + -(-rest // self.num_replicas)

    def global_batches(self) -> list[list[int]]:
        """This epoch's global batches (every rank computes the same list); only the last may be short."""
        g = torch.Generator().manual_seed(self.seed * 10_007 + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        gb = self.global_batch
        if self.lengths is None:
            return [order[k : k + gb] for k in range(0, self.n, gb)]
        batches = []
        for start in range(0, self.n, self.pool):
            pool = sorted(order[start : start + self.pool], key=lambda i: self.lengths[i])
            batches += [pool[k : k + gb] for k in range(0, len(pool), gb)]
        # pools are whole batches except the last: its short batch goes last, so the DataLoader's
        # consecutive batch_size cuts are exactly these batches
        full = [b for b in batches if len(b) == gb]
        short = [i for b in batches if len(b) < gb for i in b]
        return [full[k] for k in torch.randperm(len(full), generator=g).tolist()] + ([short] if short else [])

    def __iter__(self):
        skip, self._resume = (self._resume[1] if self._resume and self._resume[0] == self.epoch else 0), None
        return iter(self._indices()[skip:])

    def _indices(self) -> list[int]:
        batches = self.global_batches()
        R, r, bs = self.num_replicas, self.rank, self.batch_size
        if R == 1:
            return [i for b in batches for i in b]
        mine = []
        for b in batches:
            if len(b) < self.global_batch:  # the short last one: padded to a multiple of R, split evenly
                first = [i for bb in batches for i in bb]
                b = b + first[: -len(b) % R]
                per = len(b) // R
                mine += b[r * per : (r + 1) * per]
            else:
                mine += b[r * bs : (r + 1) * bs]
        return mine


class RegeneratedSetMissing(UsageError, FileNotFoundError):
    """``data.regen_missing: error`` and the regenerated set is not in the cache: one line on the command line (a
    ``UsageError``) that names the ``experiments/regenerate.py`` command to run first."""


def regen_options(variant: str | None, preset: str | None, seed=None) -> str:
    """The ``experiments/regenerate.py`` options of a training run (``--variant V --preset P --seed S``): the ones
    its regenerated set is keyed by (its ``--set`` options go with them)."""
    parts = [f"--variant {variant}" if variant else "", f"--preset {preset}" if preset else "",
             f"--seed {int(seed)}" if isinstance(seed, int) and not isinstance(seed, bool) and seed else ""]
    return " ".join(p for p in parts if p)


def _check_sources(train: dict, val: dict, locations: dict | None) -> dict[str, str]:
    """Every prompt source named is an embedded domain or a hub prompt set; ``prompt_sources`` only relocates
    hub sets (an early error, not one at regeneration)."""
    for name in [*train, *val]:
        if name not in DOMAINS and not is_hub_source(name):
            raise ValueError(f"unknown prompt source {name!r} in train_examples/val_examples: the embedded corpora "
                             f"are {', '.join(DOMAINS)}, the hub prompt sets {', '.join(SOURCES)}")
    locations = {str(k): str(v) for k, v in (locations or {}).items()}
    for name in locations:
        if name not in SOURCES:
            raise ValueError(f"prompt_sources names {name!r}, not a hub prompt set ({', '.join(SOURCES)})")
    return locations


class DrafterDataModule(L.LightningDataModule):
    """Regenerated sequences + target features + anchors, for every drafter variant.

    Args:
        target: a model directory, a hub id (``Qwen/Qwen3-8B``) or ``embedded:<preset>``.
        train_examples: prompts per source answered by the target for training (null = all of them): the
            embedded corpus domains ``math``/``code``/``chat``, or the papers' hub prompt sets ``sharegpt``,
            ``ultrachat`` (EAGLE-3), ``nemotron``, ``codealpaca`` (DFlash); see ``lit_domino.data.hub_prompts``.
        val_examples: held-out (eval-split) prompts per source for validation. In both, 0 = none of that
            source (how a preset drops one of base.yaml's domains).
        prompt_sources: where a hub prompt set is read from, ``{name: hub id or local path}`` (a local copy in
            its hub schema for offline machines); unset = its default hub id. Part of the data's cache key.
        max_prompt_tokens: longer prompts are skipped during regeneration.
        max_new_tokens: the target's answer budget per turn during regeneration.
        regen_temperature: 0 = greedy regeneration (the papers'); > 0 samples.
        regen_batch_size: prompts answered together during regeneration.
        regen_shard_size: prompts per regenerated chunk: the unit of resume, and of ``--shard i/N`` (chunk k goes to
            worker k % N, so a set of fewer than N chunks leaves workers idle).
        regen_missing: what ``prepare_data`` does when the regenerated set is not in the cache:
            ``build`` regenerates it there with HF ``generate`` (the embedded presets: minutes, and a
            newcomer needs no extra command) or ``error`` stops with the ``experiments/regenerate.py``
            command to run first (the paper preset: GPU-hours, sharded or through a vLLM/SGLang
            server, never inside ``fit`` where the other ranks would time out at Lightning's barrier).
        feature_layers: target decoder layers (0-based) whose hidden states drafters read;
            None = pick by ``feature_rule``.
        feature_rule: set from the drafter method by the training CLI (its config's ``feature_rule``: one source):
            ``dflash`` (with ``num_feature_layers``), ``eagle3`` or ``dspark`` (DFlash's layers, then
            the target's last one: the distribution DSpark distils).
        num_feature_layers: n of the DFlash rule.
        features: ``cached`` (computed once, fp16 on disk) or ``online`` (per batch).
        max_length: sequences are truncated to this many tokens.
        batch_size: sequences per batch.
        num_anchors: anchors per sequence (docs/METHOD.md: 256-512 at 8B scale, fewer for short sequences).
        block_size: drafting block size B (anchors need no room after them: labels past the end are masked).
        group_by_length: training batches hold sequences of similar length (shuffled in pools of
            50 batches, then the batches shuffled): far less padding, but on the default preset it
            cost the parallel drafters τ at the same seed and steps (measured: docs/results.md), so only
            the AR drafters' configs (EAGLE-3, small LM) set it.
        seed: shuffling and anchor draws.
        num_workers: DataLoader workers (0 is fastest for in-memory data on 2 cores).
        target_dtype: the frozen target's dtype: float32 on CPU (bf16 is far slower there),
            bfloat16 for an 8B target on a GPU.
        target_device: where the target runs regeneration and feature extraction;
            ``auto`` = the GPU when there is one.
    """

    def __init__(
        self,
        target: str = "embedded:default",
        train_examples: dict[str, int | None] | None = None,
        val_examples: dict[str, int] | None = None,
        prompt_sources: dict[str, str] | None = None,
        max_prompt_tokens: int = 384,
        max_new_tokens: int = 256,
        regen_temperature: float = 0.0,
        regen_batch_size: int = 32,
        regen_shard_size: int = 256,
        regen_missing: str = "build",
        feature_layers: list[int] | None = None,
        feature_rule: str | None = None,
        num_feature_layers: int = 3,
        features: str = "cached",
        max_length: int = 512,
        batch_size: int = 16,
        num_anchors: int = 16,
        block_size: int = 16,
        group_by_length: bool = False,
        seed: int = 0,
        num_workers: int = 0,
        target_dtype: str = "float32",
        target_device: str = "auto",
    ):
        super().__init__()
        if features not in ("cached", "online"):
            raise ValueError(f"features must be 'cached' or 'online', got {features!r}")
        if regen_missing not in ("build", "error"):
            raise ValueError(f"regen_missing must be 'build' or 'error', got {regen_missing!r}")
        feature_rule = feature_rule or "dflash"  # None: the training CLI had no method to take it from
        if feature_rule not in ("dflash", "eagle3", "dspark"):
            raise ValueError(f"feature_rule must be 'dflash', 'eagle3' or 'dspark', got {feature_rule!r}")
        if block_size < 2:
            raise ValueError(f"block_size must be >= 2 (one known token + at least one draft), got {block_size}")
        if min(batch_size, num_anchors, max_length) < 1:
            raise ValueError("batch_size, num_anchors and max_length must be >= 1")
        self.save_hyperparameters()
        self.target_spec = target
        # 0 = none of that source: a preset drops a domain of base.yaml's (config deltas merge dicts)
        self.train_examples = {k: v for k, v in (train_examples or {"math": 800, "code": 200, "chat": 200}).items()
                               if v != 0}
        self.val_examples = {k: v for k, v in (val_examples or {"math": 64, "code": 32, "chat": 32}).items() if v != 0}
        if not self.train_examples or not self.val_examples:
            raise ValueError("train_examples and val_examples must each name at least one prompt source with a "
                             "non-zero count")
        self.prompt_sources = _check_sources(self.train_examples, self.val_examples, prompt_sources)
        self._feature_layers = feature_layers
        self.target = None
        self.regen_options: str | None = None
        """This run's ``experiments/regenerate.py`` options (:func:`regen_options`), set by the training CLI and the
        ablation; the missing-set error names them (None: an example with ``--preset paper``)."""
        self.train_set = self.val_set = None

    # -- configuration -------------------------------------------------------------

    def regen_config(self, split: str) -> RegenConfig:
        examples = self.train_examples if split == "train" else self.val_examples
        h = self.hparams
        # a relocated hub set is passed on as "name@location": the location is in the cache key
        domains = {(f"{d}{SEPARATOR}{self.prompt_sources[d]}" if d in self.prompt_sources else d): n
                   for d, n in examples.items()}
        return RegenConfig(
            domains=tuple(sorted(domains.items())),
            split=split,
            max_prompt_tokens=h.max_prompt_tokens,
            max_new_tokens=h.max_new_tokens,
            temperature=h.regen_temperature,
            batch_size=h.regen_batch_size,
            shard_size=h.regen_shard_size,
            seed=h.seed if h.regen_temperature > 0 else 0,  # greedy answers do not depend on the seed
        )

    @property
    def feature_layers(self) -> list[int]:
        target = self.load_target()
        if self._feature_layers is not None:
            return check_layer_ids(self._feature_layers, target.num_layers)
        return target.layer_ids(self.hparams.feature_rule, self.hparams.num_feature_layers)

    def load_target(self):
        if self.target is None:
            self.target = load_target(self.target_spec, dtype=self.hparams.target_dtype,
                                      device=self.hparams.target_device)
        return self.target

    # -- Lightning hooks -------------------------------------------------------------

    def prepare_data(self):
        self._build("train")
        self._build("eval")

    def cached(self) -> dict[str, bool]:
        """What :meth:`prepare_data` would find in the cache: ``{"regen": .., "features": ..}`` (both splits)."""
        target = self.load_target()
        regen = all(cache.is_complete(regen_dir(target, self.regen_config(s)), warn=False) for s in ("train", "eval"))
        features = self.hparams.features != "cached" or all(
            cache.is_complete(feature_cache_dir(target, self.feature_layers, self.hparams.max_length,
                                                key_extra={"regen": asdict(self.regen_config(s))})[0], warn=False)
            for s in ("train", "eval"))
        return {"regen": regen, "features": features}

    def regenerate(self, progress: bool = True) -> None:
        """Regenerate (or find cached) both splits' answers, without their features."""
        for split in ("train", "eval"):
            self._regenerated(split, progress)

    def _build(self, split: str):
        target, ds = self.load_target(), self._regenerated(split)
        feats = offsets = None
        if self.hparams.features == "cached":
            feats, offsets = build_feature_cache(
                target, ds, self.feature_layers, self.hparams.max_length,
                key_extra={"regen": asdict(self.regen_config(split))},
            )
        return RegenSequences(ds, self.hparams.max_length, feats, offsets)

    def _regenerated(self, split: str, progress: bool | None = None):
        target = self.load_target()
        cfg = self.regen_config(split)
        if self.hparams.regen_missing == "error" and not cache.is_complete(regen_dir(target, cfg), warn=False):
            options = self.regen_options or "--preset paper"  # an example when the run's options are not known
            which = ("this run's options (and the --set options it was given)" if self.regen_options else
                     "the same --variant/--preset/--set options as this run, e.g.")
            raise RegeneratedSetMissing(
                f"the regenerated {split} set of target {target.name!r} is not in the cache "
                f"({regen_dir(target, cfg)}), and data.regen_missing is 'error': regenerate it first, as its own "
                f"step, with {which}\n"
                f"  python experiments/regenerate.py {options}                      # HF generate here\n"
                f"  python experiments/regenerate.py {options} --server http://localhost:8000  # a vLLM/SGLang server\n"
                "  (or N workers with --shard i/N, then --merge); data.regen_missing=build regenerates inside "
                "prepare_data instead"
            )
        # regeneration bars follow the trainer's (`--no-progress`, enable_progress_bar: false)
        if progress is None:
            progress = self.trainer is None or self.trainer.progress_bar_callback is not None
        ds = regenerate(target, cfg, progress=progress)
        if len(ds) == 0:
            raise ValueError(f"the regenerated {split} set is empty; raise train_examples/val_examples")
        return ds

    def setup(self, stage: str | None = None):
        if self.train_set is None:
            self.train_set = self._build("train")
            self.val_set = self._build("eval")

    def _loader(self, ds, sampler=None, loader_class=DataLoader):
        pad = self.load_target().tokenizer.pad_token_id if self.load_target().tokenizer is not None else 0
        return loader_class(
            ds,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            shuffle=False,
            collate_fn=lambda items: collate(items, pad),
            num_workers=self.hparams.num_workers,
        )

    def _world(self) -> tuple[int, int]:
        """(world size, global rank) of the attached trainer; (1, 0) without one."""
        trainer = self.trainer
        return (int(trainer.world_size), int(trainer.global_rank)) if trainer is not None else (1, 0)

    def train_dataloader(self):
        ds, h = self.train_set, self.hparams
        lengths = [min(len(ids), ds.max_length) for ids in ds.input_ids] if h.group_by_length else None
        world, rank = self._world()
        # a DistributedSampler subclass: Lightning keeps it (the validation loader gets Lightning's own);
        # a ResumableLoader: a resume from a mid-epoch checkpoint continues with the next unseen batch
        return self._loader(ds, EpochShuffleSampler(len(ds), h.seed, lengths, h.batch_size,
                                                    num_replicas=world, rank=rank), loader_class=ResumableLoader)

    def val_dataloader(self):
        return self._loader(self.val_set)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        target = self.load_target()
        if "features" not in batch:  # online features, on the batch's device
            batch["features"] = target.forward_features(
                batch["input_ids"], self.feature_layers, batch["attention_mask"]
            ).float()
        training = self.trainer is not None and self.trainer.training
        step = self.trainer.global_step if training else -1 - int(batch["index"][0])
        g = self.anchor_generator(step, self._world()[1] if training else 0)
        batch["anchors"], batch["anchor_mask"] = sample_anchors(batch["loss_mask"], self.hparams.num_anchors, g)
        return batch

    def anchor_generator(self, step: int, rank: int = 0) -> torch.Generator:
        """The generator of the anchors drawn at optimizer ``step`` on global ``rank``: redrawn every step,
        different on every rank (ranks hold different sequences, but equal draws would correlate them), the
        same after a resume. Validation batches use ``step = -1 - <first dataset index>`` and rank 0, so
        their anchors do not depend on how the validation set was sharded."""
        seed = self.hparams.seed * 1_000_003 + step + 1_000_000_007 + int(rank) * 7_919_000_009
        return torch.Generator().manual_seed(seed % (2**63))

    def describe(self) -> dict:
        """Sizes of the prepared data (for logs and closing notes)."""
        out = {}
        for name, ds in (("train", self.train_set), ("val", self.val_set)):
            if ds is not None:
                out[f"{name}_sequences"] = len(ds)
                out[f"{name}_tokens"] = int(sum(min(len(x), self.hparams.max_length) for x in ds.input_ids))
        return out
