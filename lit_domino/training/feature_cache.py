"""The target's features of the regenerated sequences, computed once and cached as an fp16 memmap (an artifact
keyed by the target, its layers and the sequence length): what :class:`~lit_domino.training.datamodule.
DrafterDataModule` reads when ``features="cached"``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lit_domino.runtime import cache


def feature_cache_dir(target, layer_ids: list[int], max_length: int, root: Path | None = None,
                      key_extra: dict | None = None) -> tuple[Path, dict]:
    """Where the features of ``layer_ids`` are cached, and their key."""
    key = {"target": target.fingerprint(), "target_name": target.name, "layers": layer_ids, "max_length": max_length,
           **(key_extra or {})}
    return cache.artifact_dir("features", key, root=root), key


def build_feature_cache(target, ds, layer_ids: list[int], max_length: int, root: Path | None = None,
                        key_extra: dict | None = None, batch_tokens: int = 8192):
    """Compute (or reuse) the fp16 features of every sequence; returns (memmap, offsets).

    Built once per cache (others wait on its lock and reuse it), in a temporary directory
    renamed into place when finished (a failure leaves nothing behind); a corrupt cached
    file (truncated, wrong shape) is rebuilt with a warning naming the folder.
    """
    path, key = feature_cache_dir(target, layer_ids, max_length, root, key_extra)
    lengths = [min(len(ids), max_length) for ids in ds["input_ids"]]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    F = len(layer_ids) * target.hidden_size
    shape = (int(offsets[-1]), F)

    def load(p: Path):
        feats = np.load(p / "features.npy", mmap_mode="r")
        if feats.shape != shape:
            raise ValueError(f"features.npy has shape {feats.shape}, expected {shape}")
        return feats

    def build(p: Path):
        with cache.staging(p) as tmp:
            compute_features(target, ds, layer_ids, lengths, offsets, tmp / "features.npy", shape, batch_tokens)
            cache.mark_complete(tmp, key)

    return cache.reuse_or_build(path, load, build), offsets


@torch.no_grad()
def compute_features(target, ds, layer_ids, lengths, offsets, file: Path, shape, batch_tokens: int) -> None:
    mm = np.lib.format.open_memmap(file, mode="w+", dtype=np.float16, shape=shape)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])  # similar lengths batch together
    i = 0
    while i < len(order):
        rows = [order[i]]
        while i + len(rows) < len(order) and (len(rows) + 1) * lengths[order[i + len(rows)]] <= batch_tokens:
            rows.append(order[i + len(rows)])
        width = max(lengths[r] for r in rows)
        x = torch.full((len(rows), width), 0, dtype=torch.long)
        attn = torch.zeros_like(x)
        for j, r in enumerate(rows):
            x[j, : lengths[r]] = torch.tensor(ds[r]["input_ids"][: lengths[r]])
            attn[j, : lengths[r]] = 1
        feats = target.forward_features(x.to(target.device), layer_ids, attn.to(target.device)).float().cpu()
        for j, r in enumerate(rows):
            mm[offsets[r] : offsets[r] + lengths[r]] = feats[j, : lengths[r]].numpy().astype(np.float16)
        i += len(rows)
    mm.flush()
    del mm
