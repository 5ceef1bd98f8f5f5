"""Regeneration as its own step: the library side of ``experiments/regenerate.py``.

The command composes the same config as training (``--variant/--preset/--seed/--set``), so the
regenerated sets land under the very cache keys ``DrafterDataModule.prepare_data`` looks up, and
then answers them with Hugging Face ``generate`` or an OpenAI-compatible server, whole or as one of
N workers (``--shard i/N``), followed by ``--merge``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from lit_domino import configs
from lit_domino.data.datamodule import DrafterDataModule
from lit_domino.data.regenerate import ServerBackend, parse_shard, regen_dir, regen_report, regenerate, regenerate_part
from lit_domino.serving import ServerClient
from lit_domino.target import EMBEDDED_PREFIX, Target, load_target, resolve_mask_token

SPLITS = ("train", "eval")


def target_without_weights(spec: str) -> Target:
    """The target's tokenizer, config and generation config with its weights on the meta device.

    Enough for everything the server backend needs here (chat template, EOS ids, the fingerprint
    that keys the cache: the same as :func:`lit_domino.target.load_target` gives), without reading
    16 GB of Qwen3-8B weights that the server already holds. Embedded targets are tiny: loaded whole.
    """
    spec = str(spec)
    if spec.startswith(EMBEDDED_PREFIX):
        return load_target(spec)
    tokenizer = AutoTokenizer.from_pretrained(spec)
    config = AutoConfig.from_pretrained(spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    try:
        model.generation_config = GenerationConfig.from_pretrained(spec)
    except OSError:  # no generation_config.json: the model config's EOS stands
        pass
    mask_id = resolve_mask_token(tokenizer, model.get_input_embeddings().weight.shape[0])
    return Target(model=model.eval().requires_grad_(False), tokenizer=tokenizer, mask_token_id=mask_id, name=spec)


def datamodule(variant: str, preset: str, seed: int = 0, overrides: Mapping[str, Any] | None = None) -> DrafterDataModule:
    """The training run's DataModule (its regeneration settings), from the same composed config."""
    cfg = configs.load_config(variant, preset, seed=seed, overrides=dict(overrides or {}))
    data = dict(cfg.get("data") or {})
    data["seed"] = int(cfg.get("seed_everything") or 0)  # linked from seed_everything in training
    return DrafterDataModule(**data)


def run_regenerate(options: Mapping | Any) -> dict:
    """The command: regenerate ``splits`` of the composed config; returns ``{split: report or part summary}``.

    ``options``: ``experiments/regenerate.py``'s options (variant, preset, seed, set, splits, server,
    server_model, concurrency, retries, timeout, server_extra, shard, merge, no_progress).
    """
    args = dict(options if isinstance(options, Mapping) else vars(options))
    shard = parse_shard(args.get("shard"))
    if shard is not None and args.get("merge"):
        raise ValueError("--shard and --merge do not go together: run the N --shard i/N workers, then one --merge")
    splits = [s.strip() for s in (args.get("splits") or ",".join(SPLITS)).split(",") if s.strip()]
    bad = [s for s in splits if s not in SPLITS]
    if bad or not splits:
        raise ValueError(f"--splits takes {','.join(SPLITS)} (comma-separated), got {args.get('splits')!r}")
    dm = datamodule(args["variant"], args["preset"], args.get("seed", 0), dict(args.get("set") or []))
    backend = None
    if args.get("server"):
        extra = json.loads(args["server_extra"]) if args.get("server_extra") else {}
        if not isinstance(extra, dict):
            raise ValueError(f"--server-extra must be a JSON object, got {args['server_extra']!r}")
        client = ServerClient(args["server"], model=args.get("server_model"), retries=args.get("retries", 5),
                              timeout_s=args.get("timeout", 600.0), extra_body=extra)
        client.served_model()  # unreachable: a clear error before anything is written
        backend = ServerBackend(client, concurrency=args.get("concurrency", 16))
        target = target_without_weights(dm.target_spec)
    else:
        target = dm.load_target()
    progress = not args.get("no_progress")
    out = {}
    for split in splits:
        cfg = dm.regen_config(split)
        if shard is not None:
            out[split] = regenerate_part(target, cfg, shard, progress=progress, backend=backend)
        else:
            regenerate(target, cfg, progress=progress, backend=backend, merge_only=bool(args.get("merge")))
            out[split] = {"path": str(regen_dir(target, cfg)), **regen_report(target, cfg)}
    return out
