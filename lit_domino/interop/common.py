"""What the field's formats share: the sidecar that records the target and label convention, the
Qwen3-style config both DFlash and EAGLE-3 layouts use, the fields this suite cannot express, weights I/O.

Every exporter writes ``lit_domino_export.json`` next to the foreign ``config.json``: the target the
drafter was trained for (name/path and its fingerprint: hidden size, vocabulary, layers, tokenizer hash,
MASK id), the label convention and the suite-only fields a foreign config has no key for. Importing a
directory that has it restores the full fingerprint, so binding it to another target fails exactly as a
native drafter directory does.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Qwen3Config

from lit_domino.target.qwen3 import qwen3_config as build_qwen3_config

from lit_domino.models.base import CONFIG_NAME, DrafterLoadError, WEIGHTS_NAME
from lit_domino.runtime.command import UsageError

SIDECAR_NAME = "lit_domino_export.json"
LABEL_CONVENTION = ("dflash: a block [x_last, MASK x (B-1)] at positions start..start+B-1; block position k >= 1 "
                    "predicts x_{start+k} (shift_label false, pure_draft_prefix_len 0)")


class ExportError(UsageError):
    """A drafter that the requested format cannot express exactly."""


class ForeignConfigError(DrafterLoadError):
    """A foreign checkpoint whose config this suite cannot express exactly; the message names the field."""


def refuse(field: str, value, why: str) -> None:
    raise ForeignConfigError(f"cannot import: {field}={value!r} is not expressible here ({why})")


_REQUIRED = object()


def config_value(cfg: dict, key: str, kind: type, where: str = "", default=_REQUIRED, why: str = ""):
    """``cfg[key]`` as ``kind`` (int, float or list of ints), naming the field when it is missing or mistyped.

    A partial or hand-edited config otherwise fails deep inside ``int(None)`` with a TypeError naming no field.
    ``default``: the value when the key is absent (or null); without one the key is required. ``where`` prefixes
    nested keys (``dflash_config.``); ``why`` says what the field is for."""
    value = cfg.get(key) if isinstance(cfg, dict) else None
    if value is None:
        if default is _REQUIRED:
            raise ForeignConfigError(f"cannot import: {where}{key} is missing from the config" + (f" ({why})" if why
                                                                                                else ""))
        return default
    if kind is list:
        if (not isinstance(value, (list, tuple)) or not value
                or any(isinstance(j, bool) or not isinstance(j, int) for j in value)):
            raise ForeignConfigError(f"cannot import: {where}{key}={value!r} must be a non-empty list of integers")
        return [int(j) for j in value]
    # JSON integers only (a bool is an int in Python; 16.0 is accepted, 16.5 is not an integer)
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (kind is float or float(value).is_integer())
    if not ok:
        raise ForeignConfigError(f"cannot import: {where}{key}={value!r} must be "
                                 f"{'an integer' if kind is int else 'a number'}")
    return kind(value)


def config_section(cfg: dict, key: str, where: str = "") -> dict:
    """The nested object ``cfg[key]`` ({} when absent or null), naming the field when it is not an object."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ForeignConfigError(f"cannot import: {where}{key}={value!r} must be a JSON object")
    return dict(value)


# --------------------------------------------------------------------------- the sidecar


def target_record(drafter, target=None) -> dict:
    """The target the drafter was trained for: its name (path or hub id, when known) and its fingerprint."""
    if target is None and drafter.is_bound:
        target = drafter.target
    fingerprint = dict(drafter.config.target_fingerprint or (target.fingerprint() if target is not None else {}))
    if not fingerprint.get("num_layers"):
        raise ExportError("the drafter records no target (its config has an empty target_fingerprint): bind it "
                          "to its target first (drafter.bind_target(target)) or pass target= to export_drafter")
    return {"name": getattr(target, "name", None), "fingerprint": fingerprint}


def write_sidecar(directory: Path, fmt: str, drafter, target_rec: dict, extra: dict | None = None) -> None:
    (directory / SIDECAR_NAME).write_text(json.dumps({
        "format": fmt, "kind": drafter.kind, "label_convention": LABEL_CONVENTION, "target": target_rec,
        "lit_domino_fields": extra or {}}, indent=2, sort_keys=True))


def read_sidecar(directory: Path) -> dict | None:
    path = directory / SIDECAR_NAME
    if not path.is_file():
        return None
    try:
        side = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DrafterLoadError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(side, dict):
        raise DrafterLoadError(f"{path} does not hold a JSON object")
    return side


def read_config_json(directory: Path) -> dict:
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {directory} is not a drafter directory")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DrafterLoadError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise DrafterLoadError(f"{path} does not hold a JSON object")
    return data


# --------------------------------------------------------------------------- Qwen3-style configs


def qwen3_config(config, num_layers: int, **extra) -> Qwen3Config:
    """A Qwen3 config carrying a drafter config's widths, heads, norm eps, RoPE and positions
    (:func:`lit_domino.target.qwen3.qwen3_config`; untied: a drafter's layers have no LM head of their own)."""
    cfg = build_qwen3_config(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                             intermediate_size=config.intermediate_size, num_layers=num_layers,
                             num_heads=config.num_heads, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                             max_positions=config.max_position_embeddings, rope_theta=config.rope_theta,
                             rms_norm_eps=config.rms_norm_eps, tie_embeddings=False)
    for key, value in extra.items():
        setattr(cfg, key, value)
    return cfg


def qwen3_fields(cfg: dict, where: str = "") -> dict:
    """The shared ``DrafterConfig`` fields of a Qwen3-style config dict, refusing what our layers cannot run.

    Our decoder layer is Qwen3's (q/k RMSNorm, SwiGLU, default RoPE, full attention, no biases); anything
    else changes the function and is refused by name (``where`` prefixes nested configs)."""
    def get(key, default=None):
        return cfg.get(key, default)

    if get("model_type", "qwen3") != "qwen3":
        refuse(f"{where}model_type", get("model_type"), "the draft layers here are Qwen3's (q/k norm, SwiGLU)")
    if get("attention_bias"):
        refuse(f"{where}attention_bias", get("attention_bias"), "the draft projections here have no bias")
    if get("hidden_act", "silu") != "silu":
        refuse(f"{where}hidden_act", get("hidden_act"), "the MLP here is SwiGLU with SiLU")
    if get("use_sliding_window"):
        refuse(f"{where}use_sliding_window", get("use_sliding_window"), "draft attention here is full attention")
    layer_types = get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        refuse(f"{where}layer_types", layer_types, "draft attention here is full attention (no sliding window)")
    if get("is_causal"):
        refuse(f"{where}is_causal", get("is_causal"), "the parallel block attends bidirectionally here")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if get(key) not in (None, 0, 0.0):
            refuse(f"{where}{key}", get(key), "no logit soft-capping here")
    rope = get("rope_parameters") or get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
    if rope_type not in (None, "default"):
        refuse(f"{where}rope_parameters.rope_type", rope_type, "only default RoPE (no scaling) is implemented here")
    theta = config_value(rope, "rope_theta", float, f"{where}rope_parameters.", None) if isinstance(rope, dict) else None
    theta = theta if theta is not None else config_value(cfg, "rope_theta", float, where, 10000.0)

    def need(key, kind=int, default=_REQUIRED):
        return config_value(cfg, key, kind, where, default, "a required Qwen3 config field")

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    return dict(hidden_size=hidden, vocab_size=need("vocab_size"), num_layers=need("num_hidden_layers"),
                num_heads=heads, num_kv_heads=need("num_key_value_heads", default=heads),
                head_dim=need("head_dim", default=hidden // heads if heads > 0 else 0),
                intermediate_size=need("intermediate_size"), rms_norm_eps=need("rms_norm_eps", float, 1e-6),
                rope_theta=theta, max_position_embeddings=need("max_position_embeddings"))


def build_config(cls, fields: dict):
    """``cls(**fields).validate()``, its ValueError (naming the field) raised as a :class:`ForeignConfigError`."""
    try:
        return cls(**fields).validate()
    except ForeignConfigError:
        raise
    except ValueError as err:
        raise ForeignConfigError(f"cannot import: {err}") from err


def apply_sidecar_fields(config, directory: Path):
    """``config`` with the sidecar's suite-only fields (EAGLE-3's ``ttt_steps``), an unknown or invalid one refused
    naming the sidecar and the field."""
    side = read_sidecar(directory)
    extra = side.get("lit_domino_fields") if side is not None else None
    if not extra:
        return config
    if not isinstance(extra, dict):
        raise ForeignConfigError(f"cannot import: {directory / SIDECAR_NAME}: lit_domino_fields={extra!r} must be a "
                                 "JSON object")
    try:
        return config.replace(**extra)
    except (TypeError, ValueError) as err:
        raise ForeignConfigError(f"cannot import: {directory / SIDECAR_NAME}: lit_domino_fields: {err}") from err


def foreign_fingerprint(directory: Path, hidden_size: int, vocab_size: int, mask_token_id: int | None,
                        num_target_layers: int | None) -> dict:
    """The fingerprint to bind with: the sidecar's when the directory was exported here, else the facts the
    foreign config states (no tokenizer hash: foreign formats record none)."""
    side = read_sidecar(directory)
    if side is not None:
        record = side.get("target")
        fingerprint = record.get("fingerprint") if isinstance(record, dict) else None
        if not isinstance(fingerprint, dict):
            raise ForeignConfigError(f"cannot import: {directory / SIDECAR_NAME} has no target.fingerprint object "
                                     "(the target the drafter was exported for); restore it or delete the sidecar")
        return dict(fingerprint)
    fp = {"hidden_size": hidden_size, "vocab_size": vocab_size}
    if mask_token_id is not None:
        fp["mask_token_id"] = int(mask_token_id)
    if num_target_layers is not None:
        fp["num_layers"] = int(num_target_layers)
    return fp


# --------------------------------------------------------------------------- weights


def save_weights(tensors: dict[str, torch.Tensor], directory: Path, fmt: str) -> None:
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}, str(directory / WEIGHTS_NAME),
              metadata={"format": "pt", "exported_by": "lit_domino", "layout": fmt})


def load_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors`` (or of the shards a ``model.safetensors.index.json`` lists)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / WEIGHTS_NAME).is_file():
        files = [WEIGHTS_NAME]
    else:
        raise FileNotFoundError(f"{directory / WEIGHTS_NAME} is missing (nor is there a sharded index)")
    tensors = {}
    for name in files:
        try:
            with safe_open(str(directory / name), "pt") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
        except Exception as err:  # safetensors raises its own error types for corrupt files
            raise DrafterLoadError(f"{directory / name} is corrupt or unreadable: {type(err).__name__}: {err}") from err
    return tensors


def load_into(drafter, tensors: dict[str, torch.Tensor], directory: Path, map_location) -> None:
    """Load renamed foreign tensors strictly: every parameter present, nothing left over, shapes equal."""
    own = drafter.state_dict()
    missing, unexpected = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    bad = [f"{k}: {tuple(tensors[k].shape)} vs {tuple(own[k].shape)}" for k in set(own) & set(tensors)
           if tensors[k].shape != own[k].shape]
    if missing or unexpected or bad:
        raise DrafterLoadError(f"{directory} does not match a {drafter.kind!r} drafter: missing {missing}, "
                               f"unexpected {unexpected}, shape mismatches {sorted(bad)}")
    dtype = next(iter(tensors.values())).dtype
    drafter.to(dtype)
    drafter.load_state_dict(tensors, strict=True)
    drafter.to(map_location).eval()
