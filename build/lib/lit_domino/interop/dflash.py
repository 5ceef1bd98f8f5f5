"""The ``dflash`` format: z-lab's DFlash draft layout (``dflash.model.DFlashDraftModel``).

``config.json`` is a Qwen3 config of the draft layers with ``architectures: [DFlashDraftModel]``,
``num_target_layers`` and ``dflash_config`` {``target_layer_ids``, ``block_size``, ``mask_token_id``}
(``block_size`` also at the top level, where SpecForge's copy of the model reads it);
``model.safetensors`` holds ``fc``, ``hidden_norm``, ``layers.*``, ``norm``: the backbone's own names.
The embedding and LM head are the target's and are not stored (DFlash takes them from the target).

The same layout with ``dflash_config.projector_type: domino`` is SpecForge's Domino
(:mod:`lit_domino.interop.specforge_domino`); :func:`import_dflash_layout` reads both.
"""

from __future__ import annotations

from pathlib import Path

from lit_domino.interop import FORMAT_KINDS, specforge_domino
from lit_domino.interop.common import (ExportError, apply_sidecar_fields, build_config, config_section, config_value,
                                       foreign_fingerprint, load_into, load_weights, qwen3_config, qwen3_fields,
                                       refuse, save_weights, target_record, write_sidecar)
from lit_domino.models.backbone import BackboneConfig
from lit_domino.models.io import build_drafter

NAME = "dflash"
KINDS = FORMAT_KINDS[NAME]

DFLASH_KEYS = {"target_layer_ids", "block_size", "mask_token_id", "projector_type", "emb_dim", "gru_hidden_dim",
               "shift_label", "pure_draft_prefix_len", "input_embedding_scale", "output_multiplier",
               "final_logit_softcapping"}
"""``dflash_config`` keys this suite understands; any other key changes behaviour we cannot vouch for."""


def detect(cfg: dict) -> bool:
    return isinstance(cfg.get("dflash_config"), dict) or "DFlashDraftModel" in (cfg.get("architectures") or [])


def layout_config(drafter, target_rec: dict, dflash_extra: dict | None = None, architecture: str = "DFlashDraftModel"):
    """The Qwen3 config of the DFlash layout for a parallel drafter (``dflash_extra``: the projector's keys)."""
    c = drafter.config
    dflash_config = {"target_layer_ids": [int(j) for j in c.feature_layers], "block_size": int(c.block_size),
                     "mask_token_id": int(c.mask_token_id), **(dflash_extra or {})}
    cfg = qwen3_config(c, c.num_layers, architectures=[architecture],
                       num_target_layers=int(target_rec["fingerprint"]["num_layers"]), block_size=int(c.block_size),
                       dflash_config=dflash_config)
    cfg.dtype = str(drafter.dtype).removeprefix("torch.")
    return cfg


def export(drafter, directory: Path, target=None) -> Path:
    if drafter.kind not in KINDS:
        raise ExportError(f"format {NAME!r} holds a DFlash backbone (kind 'backbone'), not a {drafter.kind!r} "
                          f"drafter: its head would be dropped; export a domino drafter as 'specforge-domino'")
    rec = target_record(drafter, target)
    layout_config(drafter, rec).save_pretrained(directory)
    save_weights(drafter.state_dict(), directory, NAME)
    write_sidecar(directory, NAME, drafter, rec)
    return directory


def import_dflash_layout(directory: Path, cfg: dict, map_location="cpu"):
    """A DFlash-layout checkpoint (plain DFlash or SpecForge Domino) as our backbone / Domino drafter."""
    if "DFlash2DraftModel" in (cfg.get("architectures") or []):
        refuse("architectures", cfg["architectures"], "DFlash 2 (dynamic convolutions, candidate selector) is "
               "another drafter")
    dc = config_section(cfg, "dflash_config")
    unknown = sorted(set(dc) - DFLASH_KEYS)
    if unknown:
        refuse(f"dflash_config.{unknown[0]}", dc[unknown[0]], "a dflash_config key this suite does not implement")
    for key, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0)):
        if config_value(dc, key, float, "dflash_config.", neutral) != neutral:
            refuse(f"dflash_config.{key}", dc[key], f"only {neutral:g} is implemented here")
    if dc.get("final_logit_softcapping") not in (None, 0, 0.0):
        refuse("dflash_config.final_logit_softcapping", dc["final_logit_softcapping"], "no logit soft-capping here")
    fields = qwen3_fields(cfg)
    mask = config_value(dc, "mask_token_id", int, "dflash_config.", why="a DFlash block needs its MASK token id")
    num_target_layers = config_value(cfg, "num_target_layers", int, default=None)
    layers = config_value(dc, "target_layer_ids", list, "dflash_config.", why="the feature layers must be stated "
                          "(DFlash's default rule depends on the draft depth, ours on the target's)")
    block_size = config_value(dc, "block_size", int, "dflash_config.", config_value(cfg, "block_size", int, "", 16))
    fields.update(block_size=block_size, feature_layers=layers, mask_token_id=mask)
    fields["target_fingerprint"] = foreign_fingerprint(directory, fields["hidden_size"], fields["vocab_size"],
                                                       fields["mask_token_id"], num_target_layers)
    projector = dc.get("projector_type")
    tensors = load_weights(directory)
    if projector is None:
        for key in ("emb_dim", "gru_hidden_dim"):
            if key in dc:
                refuse(f"dflash_config.{key}", dc[key], "a head key without a projector_type")
        config = build_config(BackboneConfig, fields)
    elif projector == specforge_domino.PROJECTOR:
        config, tensors = specforge_domino.import_head(dc, fields, tensors)
    else:
        refuse("dflash_config.projector_type", projector, "only DFlash (none) and 'domino' projectors are "
               "implemented here")
    config = apply_sidecar_fields(config, directory)
    drafter = build_drafter(config)
    load_into(drafter, tensors, directory, map_location)
    return drafter
