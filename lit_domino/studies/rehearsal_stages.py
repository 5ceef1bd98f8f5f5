"""The rehearsal's stages (``lit_domino.studies.rehearsal``): each returns what it did, as JSON for the report."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from lit_domino.runtime.tracking import flatten_config
from lit_domino.studies.ablation_plan import AblationPlan


def target_stage(configs: list[dict], device: str) -> dict:
    """Build (or reuse) the target and load it as the DataModule will: its shape, its MASK row (a target without
    one is refused here, before anything trains: ``load_target``'s ``TargetError``) and each method's layers."""
    from lit_domino.target.load import EMBEDDED_PREFIX, embedded_target_dir, load_target

    data = configs[0]["data"]
    spec = str(data["target"])
    directory = embedded_target_dir(spec[len(EMBEDDED_PREFIX):]) if spec.startswith(EMBEDDED_PREFIX) else Path(spec)
    target = load_target(spec, dtype=data.get("target_dtype", "float32"), device=device)
    c = target.config
    n = int(data["num_feature_layers"])
    return {"spec": spec, "dir": str(directory), "dtype": str(target.dtype).replace("torch.", ""),
            "fingerprint": target.fingerprint(), "tokenizer_size": len(target.tokenizer),
            "config": {k: getattr(c, k, None) for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                         "num_attention_heads", "num_key_value_heads", "head_dim",
                                                         "max_position_embeddings", "rms_norm_eps",
                                                         "tie_word_embeddings", "attention_bias")},
            "rope": dict(getattr(c, "rope_parameters", None) or {"rope_theta": getattr(c, "rope_theta", None),
                                                                 "rope_scaling": getattr(c, "rope_scaling", None)}),
            "mask_token_id": target.mask_token_id, "eos_token_ids": target.eos_token_ids,
            "feature_layers": {rule: target.layer_ids(rule, n) for rule in ("dflash", "dspark", "eagle3")},
            "chat_prompt": target.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                                add_generation_prompt=True,
                                                                **target.chat_template_kwargs)}


def regenerate_stage(preset: str, overrides: dict, cfg: dict, target_dir: str, device: str, shards: int,
                     out_dir: Path) -> dict:
    """``transformers serve`` on the target, ``shards`` ``--shard i/N`` workers at once, then ``--merge``; a set
    already in the cache is reused (no server)."""
    from lit_domino.runtime.serving import start_transformers_serve
    from lit_domino.studies.rehearsal import run_shards
    from lit_domino.training import regen_step

    variant = cfg["tracking"]["variant"]
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    dm = regen_step.datamodule(variant, preset, 0, overrides)
    if dm.cached()["regen"]:
        return {"cached": True, "sets": {s: _regen_report(dm, s) for s in ("train", "eval")}}
    dtype = cfg["data"].get("target_dtype", "float32")
    log_dir = Path(out_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with start_transformers_serve(target_dir, device=device, dtype=dtype, threads=1,
                                  log_path=log_dir / "transformers-serve.log") as server:
        started = round(time.time() - t0, 1)
        workers = run_shards(preset, overrides, server.url, shards, log_dir)
    merged = regen_step.main(["--preset", preset, *sets, "--merge", "--no-progress"])
    return {"cached": False, "server": {"url": server.url, "command": "transformers serve", "device": device,
                                        "dtype": dtype, "seconds_to_answer": started},
            "workers": workers, "merge": {"command": f"python experiments/regenerate.py --preset {preset} --merge",
                                          "sets": merged},
            "sets": {s: _regen_report(dm, s) for s in ("train", "eval")}}


def _regen_report(dm, split: str) -> dict:
    from lit_domino.data.regenerate import regen_dir, regen_report, regenerate

    target = dm.load_target()
    cfg = dm.regen_config(split)
    report = regen_report(target, cfg)
    ds = regenerate(target, cfg, progress=False)  # the merged set, from the cache
    lengths = [len(x) for x in ds["input_ids"]]
    labels = [sum(m) for m in ds["loss_mask"]]
    cap = int(dm.hparams.max_length)
    return {**report, "path": str(regen_dir(target, cfg)), "longest": max(lengths), "max_length": cap,
            "over_max_length": sum(n > cap for n in lengths),
            "labels_cut_by_max_length": int(sum(sum(m[cap:]) for m in ds["loss_mask"])),
            "sequences_without_labels_after_cut": sum(sum(m[:cap]) == 0 for m in ds["loss_mask"]),
            "answer_tokens": sum(labels)}


def eval_prompts(target, per_domain: int) -> dict[str, list[list[int]]]:
    """The eval callback's prompts: the first ``per_domain`` of each embedded eval set, rendered by the target."""
    from lit_domino.data.benchmarks import load_benchmark

    if per_domain < 1:
        return {}
    return {d: [target.chat_ids([{"role": "user", "content": p.turns[0]}])
                for p in load_benchmark(f"embedded-{d}", per_domain)] for d in ("math", "code", "chat")}


def train_stage(configs: list[dict], preset: str, per_domain: int) -> dict:
    """Every variant x seed under the configs' strategy (one launch; DDP when they name it), with the eval callback;
    each training's steps, losses (MLflow ``train/loss``, per step) and eval-callback metrics read back."""
    from lit_domino.runtime.tracking import open_client
    from lit_domino.target.load import load_target
    from lit_domino.training.distributed import is_distributed, train_distributed
    from lit_domino.training.experiment import train_variant

    data = configs[0]["data"]
    prompts = eval_prompts(load_target(data["target"]), per_domain)
    experiment = f"ablation-{preset}"
    if all(is_distributed(c) for c in configs):
        trained = train_distributed(configs, experiment, eval_prompts=prompts or None, eval_max_new_tokens=8)
    else:  # one process (a single GPU): the same trainings, the eval callback in this process
        from lit_domino.training.distributed import eval_callbacks

        spec = {"eval": {"prompts": prompts, "max_new_tokens": 8}}
        trained = [train_variant(c, experiment=experiment, progress=False, callbacks=eval_callbacks(spec))
                   for c in configs]
    client = open_client()
    runs = []
    for t in trained:
        losses = [m.value for m in sorted(client.get_metric_history(t.run_id, "train/loss"), key=lambda m: m.step)]
        metrics = client.get_run(t.run_id).data.metrics
        runs.append({"variant": t.variant, "seed": t.seed, "run_id": t.run_id, "drafter_dir": str(t.drafter_dir),
                     "from_cache": t.from_cache, "world_size": t.report.get("world_size"),
                     "optimizer_steps": t.report.get("optimizer_steps"), "train_seconds": t.report.get("train_seconds"),
                     "losses": losses, "val_loss": t.report.get("val/loss"),
                     "eval_callback": {k: v for k, v in metrics.items() if k == "tau" or k.endswith("/tau")}})
    return {"experiment": experiment, "strategy": configs[0]["trainer"].get("strategy"),
            "devices": configs[0]["trainer"].get("devices"), "eval_prompts": {d: len(p) for d, p in prompts.items()},
            "trainings": runs, "trained": trained}


def _greedy_check(target, drafter, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """Decode ``prompts`` with ``drafter`` and plainly (the same engine, no drafter): token identity, and τ."""
    import torch

    from lit_domino.decoding import generate

    same, taus = [], []
    for ids in prompts:
        x = torch.tensor([ids], device=target.device)
        plain = generate(target, None, x, max_new_tokens=max_new_tokens)
        spec = generate(target, drafter, x, max_new_tokens=max_new_tokens)
        same.append(spec.tokens == plain.tokens)
        taus.append(spec.tau)
    return {"lossless": all(same), "prompts": len(prompts), "tau": sum(taus) / len(taus)}


def _hf_assisted_check(target, directory: Path, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """The small LM reloaded by transformers as HF assisted generation's assistant: its tokens against greedy."""
    import torch
    from transformers import AutoModelForCausalLM

    assistant = AutoModelForCausalLM.from_pretrained(directory, dtype=target.dtype).to(target.device).eval()
    same = []
    for ids in prompts:
        x = torch.tensor([ids], device=target.device)
        kw = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=target.tokenizer.pad_token_id)
        same.append(torch.equal(target.model.generate(x, **kw), target.model.generate(x, assistant_model=assistant,
                                                                                       **kw)))
    return {"lossless": all(same), "prompts": len(prompts)}


def export_stage(trained: list, target_spec: str, out_dir: Path, device: str, plan: AblationPlan,
                 max_new_tokens: int = 8) -> dict:
    """Each drafter written in its field format by ``experiments/export.py``'s command, loaded back with
    ``load_drafter`` (the small LM: by transformers) and decoded against plain greedy decoding (fp32 target)."""
    from lit_domino.interop import load_drafter
    from lit_domino.interop.export import main as export_main
    from lit_domino.studies.ablation import load_prompts
    from lit_domino.studies.rehearsal import FIELD_FORMATS
    from lit_domino.target.load import load_target

    target = load_target(target_spec, device=device)
    benchmarks = load_prompts(dataclasses.replace(plan, prompts={b: 1 for b in list(plan.prompts)[:1]}))
    prompts = [target.chat_ids([{"role": "user", "content": p.turns[0]}]) for ps in benchmarks.values() for p in ps]
    out = []
    for t in trained:
        kind = json.loads((Path(t.drafter_dir) / "config.json").read_text())["kind"]
        fmt = FIELD_FORMATS[kind]
        path = Path(out_dir) / f"{t.variant}-s{t.seed}-{fmt}"
        if fmt == "hf":
            load_drafter(t.drafter_dir, target=target).hf_model().save_pretrained(path)
            check = _hf_assisted_check(target, path, prompts, max_new_tokens)
        else:
            export_main([str(t.drafter_dir), str(path), "--format", fmt, "--target", target_spec])
            drafter = load_drafter(path, target=target, map_location=device).eval()
            check = _greedy_check(target, drafter, prompts, max_new_tokens)
        files = sorted(p.name for p in path.iterdir())
        out.append({"variant": t.variant, "kind": kind, "format": fmt, "dir": str(path), "files": files, **check})
    return {"drafters": out, "lossless": all(d["lossless"] for d in out), "max_new_tokens": max_new_tokens}


def _paper_keys(variant_cfg_paper: dict) -> list[str]:
    """The flattened keys (MLflow's param names) that ``presets/paper.yaml`` sets for this variant."""
    from lit_domino.training.configs import method_kind, preset_delta

    delta = preset_delta("paper")
    methods = delta.pop("methods", {}) or {}
    mine = dict(methods.get(method_kind(variant_cfg_paper)) or {})
    data = mine.pop("data", None) or {}
    delta = {**delta, "model": {**(delta.get("model") or {}), "init_args": {
        **((delta.get("model") or {}).get("init_args") or {}), **mine}}}
    delta["data"] = {**(delta.get("data") or {}), **data}
    return sorted(flatten_config(delta))


def check_settings(configs: list[dict], trained: list) -> dict:
    """For every training, every key paper.yaml sets: paper's value, the value this run was trained with as its MLflow
    params and its resolved ``config.yaml`` record it, and whether it is paper's (``same``) or the rehearsal's
    (``scaled``: a key of the rehearsal preset's own file)."""
    import yaml

    from lit_domino.runtime.tracking import open_client
    from lit_domino.training.configs import CONFIG_DIR, _read_yaml, load_config

    client = open_client()
    preset = configs[0]["tracking"]["preset"]
    own = _read_yaml(CONFIG_DIR / "presets" / f"{preset}.yaml")  # the preset's own file, not what it extends
    listed = set(flatten_config({k: v for k, v in own.items() if k not in ("methods", "extends")}))
    out = {}
    for cfg, t in zip(configs, trained):
        variant = cfg["tracking"]["variant"]
        paper = flatten_config(load_config(variant, "paper", cfg["seed_everything"]))
        params = client.get_run(t.run_id).data.params
        resolved = flatten_config(yaml.safe_load((Path(t.drafter_dir).parent / "config.yaml").read_text()))
        method_keys = _method_keys(cfg, preset)
        rows = {}
        for key in _paper_keys(load_config(variant, "paper")):
            mlflow_value = params.get(key, _prefix_value(params, key))
            config_value = resolved.get(key, _prefix_value(resolved, key))
            status = "same" if mlflow_value == paper.get(key, _prefix_value(paper, key)) else "scaled"
            rows[key] = {"paper": paper.get(key, _prefix_value(paper, key)), "mlflow": mlflow_value,
                         "config_yaml": config_value, "status": status,
                         "listed": key in listed or key in method_keys or any(k.startswith(key + ".") for k in listed)}
        out[f"{variant}-s{cfg['seed_everything']}"] = rows
    return out


def _method_keys(cfg: dict, preset: str) -> set[str]:
    """The flattened model keys the preset's own ``methods:`` section sets for this variant's method."""
    from lit_domino.training.configs import _read_yaml, CONFIG_DIR, method_kind

    section = (_read_yaml(CONFIG_DIR / "presets" / f"{preset}.yaml").get("methods") or {}).get(method_kind(cfg)) or {}
    return set(flatten_config({"model": {"init_args": section}}))


def _prefix_value(flat: dict, key: str) -> str | None:
    """A nested value's flattened entries under ``key`` as one JSON text (``data.prompt_sources``), else None."""
    below = {k[len(key) + 1:]: v for k, v in flat.items() if k.startswith(key + ".")}
    return json.dumps(below, sort_keys=True) if below else None
