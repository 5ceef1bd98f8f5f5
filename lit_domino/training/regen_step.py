"""Regeneration as its own step: the library side of ``experiments/regenerate.py``.

The command composes the same config as training (``--variant/--preset/--seed/--set``), so the
regenerated sets land under the very cache keys ``DrafterDataModule.prepare_data`` looks up, and
then answers them with Hugging Face ``generate`` or an OpenAI-compatible server, whole or as one of
N workers (``--shard i/N``), followed by ``--merge``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from lit_domino.training import configs
from lit_domino.runtime.command import CommandParser, UsageError, run_command
from lit_domino.runtime.inputs import check_positive, check_server, parse_json_object, parse_shard

# torch, transformers, the DataModule and the regeneration itself are imported where they are used, so that
# bad options are answered before any of them loads
SPLITS = ("train", "eval")
EMBEDDED_PREFIX = "embedded:"  # lit_domino.target.load.EMBEDDED_PREFIX (that module imports torch)


def target_without_weights(spec: str):
    """The target's tokenizer, config and generation config with its weights on the meta device.

    Enough for everything the server backend and a merge need here (chat template, EOS ids, the fingerprint
    that keys the cache: the same as :func:`lit_domino.target.load.load_target` gives), without reading
    16 GB of Qwen3-8B weights that the server already holds. Embedded targets are tiny: loaded whole.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from lit_domino.target.load import Target, load_target, resolve_mask_token, target_identity

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
    return Target(model=model.eval().requires_grad_(False), tokenizer=tokenizer, mask_token_id=mask_id,
                  name=target_identity(spec))  # load_target's name (a local directory's absolute path)


def datamodule(variant: str, preset: str, seed: int = 0, overrides: Mapping[str, Any] | None = None):
    """The training run's DataModule (its regeneration settings), from the same composed config."""
    from lit_domino.training.datamodule import DrafterDataModule

    cfg = configs.load_config(variant, preset, seed=seed, overrides=dict(overrides or {}))
    data = dict(cfg.get("data") or {})
    data["seed"] = int(cfg.get("seed_everything") or 0)  # linked from seed_everything in training
    return DrafterDataModule(**data)


def check_options(args: Mapping) -> tuple[tuple[int, int] | None, list[str], dict]:
    """The cheap checks, before any config is composed or model loaded -> (shard, splits, server extra)."""
    shard = parse_shard(args.get("shard"), "--shard")
    if shard is not None and args.get("merge"):
        raise UsageError("--shard and --merge do not go together: run the N --shard i/N workers, then one --merge")
    splits = [s.strip() for s in (args.get("splits") or ",".join(SPLITS)).split(",") if s.strip()]
    bad = [s for s in splits if s not in SPLITS]
    if bad or not splits:
        raise UsageError(f"--splits takes {','.join(SPLITS)} (comma-separated), got {args.get('splits')!r}")
    variants = configs.available_variants()
    if args.get("variant") not in variants:
        raise UsageError(f"--variant: unknown variant {args.get('variant')!r}; choose one of {', '.join(variants)}")
    check_positive(args.get("concurrency"), "--concurrency")
    check_positive(args.get("retries"), "--retries", 0)
    if args.get("timeout") is not None and not args["timeout"] > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args['timeout']}")
    extra = parse_json_object(args.get("server_extra"), "--server-extra") or {}
    if args.get("server_extra") and not args.get("server"):
        raise UsageError("--server-extra needs --server (it is sent with every request to that server)")
    if args.get("server"):
        check_server(args["server"], "--server")  # unreachable: one line, before anything is composed or written
    if args.get("merge"):
        check_any_chunks(splits)
    if args.get("ship") and (shard is not None or args.get("merge") or args.get("server")):
        raise UsageError("--ship regenerates whole sets here with HF generate: drop --shard, --merge and --server")
    return shard, splits, extra


def check_any_chunks(splits: list[str]) -> None:
    """A merge with no chunk of a split anywhere in the cache (``regen/<split>-<key>/shard_*``, whatever the key)
    is refused at once; which chunks of this config's key are missing is :func:`check_mergeable`'s to say."""
    from lit_domino.runtime import cache

    root = cache.cache_root() / "regen"
    for split in splits:
        if not any(root.glob(f"{split}-*/shard_*")):
            raise UsageError(f"nothing to merge: no regenerated chunk of the {split} split is in the cache {root}; "
                             "run the --shard i/N workers first (same --variant/--preset/--seed/--set), or drop "
                             "--merge to regenerate here")


def embedded_target_built(spec: str) -> bool:
    """Whether ``embedded:<preset>``'s target is in the cache (a merge never trains it: no chunks can exist
    for a target that was never built, since their cache key is its fingerprint)."""
    from lit_domino.runtime import cache
    from lit_domino.target.embedded import preset_config
    from lit_domino.target.recipe import target_dir

    return cache.is_complete(target_dir(preset_config(spec[len(EMBEDDED_PREFIX):])), warn=False)


def check_mergeable(dm, splits: list[str]):
    """For ``--merge``: the target without its weights, once every chunk of every split is there; otherwise
    :class:`UsageError` naming the missing chunks (nothing is trained, loaded in full or merged first)."""
    from lit_domino.runtime import cache
    from lit_domino.data.regenerate import missing_chunks, regen_dir

    spec = str(dm.target_spec)
    if spec.startswith(EMBEDDED_PREFIX) and not embedded_target_built(spec):
        raise UsageError(f"nothing to merge: the target {spec} is not built yet, so no chunk was regenerated for it; "
                         "run the --shard i/N workers first, or drop --merge to regenerate here")
    target = target_without_weights(spec)
    for split in splits:
        cfg = dm.regen_config(split)
        if cache.is_complete(regen_dir(target, cfg), warn=False):
            continue
        missing = missing_chunks(target, cfg)
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise UsageError(f"cannot merge the {split} split: {len(missing)} chunk(s) are not regenerated yet "
                             f"(chunks {shown}) in {regen_dir(target, cfg)}; run the --shard i/N workers first "
                             "(chunk k belongs to shard k % N), or drop --merge to answer them here")
    return target


def run_regenerate(options: Mapping | Any) -> dict:
    """The command: regenerate ``splits`` of the composed config; returns ``{split: report or part summary}``.

    ``options``: ``experiments/regenerate.py``'s options (variant, preset, seed, set, splits, server,
    server_model, concurrency, retries, timeout, server_extra, shard, merge, no_progress).
    """
    args = dict(options if isinstance(options, Mapping) else vars(options))
    shard, splits, extra = check_options(args)
    from lit_domino.data.regenerate import ServerBackend, regen_dir, regen_report, regenerate, regenerate_part
    from lit_domino.runtime.serving import ServerClient

    dm = datamodule(args["variant"], args["preset"], args.get("seed", 0), dict(args.get("set") or []))
    backend = None
    if args.get("merge"):
        target = check_mergeable(dm, splits)  # a merge needs no weights, and refuses before it merges anything
    elif args.get("server"):
        client = ServerClient(args["server"], model=args.get("server_model"), retries=args.get("retries", 5),
                              timeout_s=args.get("timeout", 600.0), extra_body=extra)
        client.served_model()  # e.g. a server that lists no models: a clear error before anything is written
        backend = ServerBackend(client, concurrency=args.get("concurrency", 16))
        target = target_without_weights(dm.target_spec)
    else:
        target = dm.load_target()
    progress = not args.get("no_progress")
    if args.get("ship"):
        return ship_sets(dm, target, splits, args["preset"], progress)
    out = {}
    for split in splits:
        cfg = dm.regen_config(split)
        if shard is not None:
            out[split] = regenerate_part(target, cfg, shard, progress=progress, backend=backend)
        else:
            regenerate(target, cfg, progress=progress, backend=backend, merge_only=bool(args.get("merge")))
            out[split] = {"path": str(regen_dir(target, cfg)), **regen_report(target, cfg)}
    return out


def ship_sets(dm, target, splits: list[str], preset: str, progress: bool = True) -> dict:
    """``--ship``: regenerate each split from the target in the cache's ``shipping/`` folder (where no shipped copy
    is ever installed, so what ships is always answered by the target) and write it as a shipped set."""
    from lit_domino.data import shipped
    from lit_domino.data.regenerate import regen_dir, regen_key, regen_report, regenerate
    from lit_domino.runtime import cache

    root = cache.cache_root() / "shipping"
    out = {}
    for split in splits:
        cfg = dm.regen_config(split)
        ds = regenerate(target, cfg, root=root, progress=progress, use_shipped=False)
        folder = regen_dir(target, cfg)  # the folder name the user's cache will hold it under
        path = shipped.ship(ds, regen_key(target, cfg), folder.name, regen_report(target, cfg, root), preset)
        out[split] = {"shipped": str(path), "bytes": path.stat().st_size, "rows": len(ds)}
    return out


# --------------------------------------------------------------------------- the command

COMMAND_DOC = """Regenerate a preset's training data as its own step (before `train.py fit`), resumable and shardable.

    python experiments/regenerate.py --preset smoke                         # HF generate, here
    python experiments/regenerate.py --preset paper --server http://localhost:8000 --concurrency 64
    # N workers (processes, GPUs or machines on one shared cache), then one merge:
    CUDA_VISIBLE_DEVICES=0 python experiments/regenerate.py --preset paper --shard 0/8 &
    ...
    CUDA_VISIBLE_DEVICES=7 python experiments/regenerate.py --preset paper --shard 7/8 &
    wait; python experiments/regenerate.py --preset paper --merge
    python experiments/regenerate.py --preset default --ship               # rebuild the sets the package ships

The sets land in the artifact cache ($LIT_DOMINO_CACHE, default ./artifacts) under the keys that
training's prepare_data looks up (use the same --variant/--preset/--seed/--set as the training run).
Prompts are answered in chunks of `shard_size` prompts, each written atomically: a killed or failed
run keeps its finished chunks and a rerun continues from them. `--server` sends the prompts to any
OpenAI-compatible server (`vllm serve`, SGLang `launch_server`, `transformers serve`) serving the
target; `--server-extra '{"return_token_ids": true}'` makes vLLM return exact token ids.
"""
"""The command's description and epilog, and ``experiments/regenerate.py``'s docstring (tests/test_entry_points.py)."""
PROG = "regenerate.py"


def parse_args(argv=None) -> argparse.Namespace:
    from lit_domino.training.configs import PRESETS, parse_override  # light: yaml only

    p = CommandParser.from_doc(PROG, COMMAND_DOC)
    p.add_argument("--variant", default="domino", help="the training variant whose data config to use (default domino)")
    p.add_argument("--preset", default="default", choices=PRESETS)
    p.add_argument("--seed", type=int, default=0, help="seed_everything of the training run (matters at T > 0)")
    p.add_argument("--set", action="append", type=parse_override, default=[], metavar="KEY=VALUE",
                   help="config override as in train.py (e.g. data.max_new_tokens=512); repeatable")
    p.add_argument("--splits", default="train,eval", help="train,eval (default both)")
    p.add_argument("--server", default=None, help="OpenAI-compatible server URL (default: HF generate here)")
    p.add_argument("--server-model", default=None, help="served model name (default: the server's first model)")
    p.add_argument("--server-extra", default=None, help="JSON object of extra request fields for every request")
    p.add_argument("--concurrency", type=int, default=16, help="conversations in flight on the server (default 16)")
    p.add_argument("--retries", type=int, default=5, help="retries per request, with backoff (default 5)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument("--shard", default=None, metavar="i/N", help="answer only chunk k with k %% N == i")
    p.add_argument("--merge", action="store_true", help="only concatenate the finished chunks (after --shard workers)")
    p.add_argument("--ship", action="store_true",
                   help="regenerate the sets from the target (never from a shipped copy, in the cache's shipping/ "
                        "folder) and write them into lit_domino/assets/regen/ (lit_domino/data/shipped.py)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    """Parse, check the options (shards, splits, the server answering, chunks present for a merge), then
    regenerate; bad input is one line ``regenerate.py: error: ...``."""
    return run_command(PROG, _run, argv)


def _run(argv: list[str]) -> dict:
    out = run_regenerate(parse_args(argv))
    print(json.dumps(out, indent=2))
    return out
