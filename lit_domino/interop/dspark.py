"""The ``dspark`` format: vLLM's ``speculators`` DSpark layout (``DSparkDraftModel``, ``speculators_model_type:
dspark``), for the ``dspark`` drafter.

``config.json``: ``transformer_layer_config`` (a Qwen3 config of the draft layers), ``draft_vocab_size`` = the
target's vocabulary (the target's LM head, no d2t/t2d), ``block_size``, ``aux_hidden_state_layer_ids`` (the
fused layers in speculators' numbering, an index into ``hidden_states``: our decoder-layer id + 1),
``mask_token_id``, ``sample_from_anchor`` (ours: false, a block of B slots whose slot k >= 1 predicts ``x_{a+k}``
from ``x_{a+k-1}``; true, DeepSpec's convention, a block of B-1 slots whose slot j predicts ``x_{a+j+1}`` from
``x_{a+j}``, written with speculators' ``block_size`` = ours - 1: the same B-1 drafted tokens), ``markov_rank``, ``markov_head_type``,
``enable_confidence_head``, ``confidence_head_with_markov``, ``speculators_config`` (algorithm dspark, a greedy
proposal of ``block_size - 1`` tokens, the verifier). ``model.safetensors``: the backbone under our names
(``fc``, ``hidden_norm``, ``layers.*``, ``norm``: speculators' DFlash names), ``markov_head.markov_w1/_w2``,
``gate_proj`` / ``joint_proj``, ``confidence_head.proj``; the target's embedding and LM head are not stored
(speculators reloads them from the verifier).

The distribution layer: our DSpark feature list ends with the target's last layer; the layout has no key for
it, so import takes the target's layer count from ``lit_domino_export.json`` or the verifier's own config
(``speculators_config.verifier.name_or_path``, a local model directory). Refused by name: ``markov_rank`` <= 0
(no Markov head), a reduced draft vocabulary, another target width, sliding-window layers (``qwen3_fields``).
"""

from __future__ import annotations

import json
from pathlib import Path

from lit_domino.interop import FORMAT_KINDS
from lit_domino.interop.common import (ExportError, foreign_fingerprint, load_into, load_weights, qwen3_config,
                                       qwen3_fields, read_sidecar, refuse, save_weights, target_record,
                                       write_sidecar)
from lit_domino.models.base import CONFIG_NAME
from lit_domino.models.dspark import HEAD_TYPES, DSparkConfig
from lit_domino.models.io import build_drafter

NAME = "dspark"
KINDS = FORMAT_KINDS[NAME]
AUX_OFFSET = 1
"""speculators' aux layer id = our decoder-layer id + 1 (theirs index ``hidden_states``, 0 = the embedding)."""
RENAME = {"head.w1.weight": "markov_head.markov_w1.weight", "head.w2.weight": "markov_head.markov_w2.weight",
          "head.gate.weight": "markov_head.gate_proj.weight", "head.gate.bias": "markov_head.gate_proj.bias",
          "head.joint.weight": "markov_head.joint_proj.weight", "head.joint.bias": "markov_head.joint_proj.bias",
          "confidence.weight": "confidence_head.proj.weight", "confidence.bias": "confidence_head.proj.bias"}
"""Our head tensors → speculators' names; the backbone's names are the same in both."""
IGNORED = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight", "d2t", "t2d")
"""Tensors of the layout that are the target's (never ours: the drafter here reads the bound target's)."""


def detect(cfg: dict) -> bool:
    return cfg.get("speculators_model_type") == NAME


def export(drafter, directory: Path, target=None) -> Path:
    if drafter.kind not in KINDS:
        raise ExportError(f"format {NAME!r} holds a DSpark drafter, not a {drafter.kind!r} one")
    rec = target_record(drafter, target)
    c, h = drafter.config, drafter.config.head
    layer = qwen3_config(c, c.num_layers)
    layer.architectures = ["Qwen3ForCausalLM"]
    arch = ["Qwen3ForCausalLM"]
    if target is not None or drafter.is_bound:
        model = (target if target is not None else drafter.target).model
        arch = list(getattr(model.config, "architectures", None) or [type(model).__name__])
    cfg = {"architectures": ["DSparkSpeculator"], "speculators_model_type": NAME, "draft_vocab_size": c.vocab_size,
           "block_size": int(c.block_size) - int(c.sample_from_anchor), "target_hidden_size": None,
           "aux_hidden_state_layer_ids": [int(j) + AUX_OFFSET for j in c.feature_layers[:-1]],
           "mask_token_id": int(c.mask_token_id), "sliding_window_non_causal": False,
           "sample_from_anchor": bool(c.sample_from_anchor),
           "markov_rank": int(h.rank), "markov_head_type": h.head_type, "enable_confidence_head": bool(h.confidence),
           "confidence_head_with_markov": bool(h.confidence and h.confidence_with_markov),
           "dtype": str(drafter.dtype).removeprefix("torch."), "transformer_layer_config": layer.to_dict(),
           "speculators_config": {
               "algorithm": NAME, "default_proposal_method": "greedy",
               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(c.block_size) - 1,
                                     "accept_tolerance": 0.0, "verifier_accept_k": 1}],
               "verifier": {"name_or_path": rec["name"], "architectures": arch}}}
    (directory / CONFIG_NAME).write_text(json.dumps(cfg, indent=2, sort_keys=True))
    save_weights({RENAME.get(k, k): v for k, v in drafter.state_dict().items()}, directory, NAME)
    write_sidecar(directory, NAME, drafter, rec)
    return directory


def check_block_layout(cfg: dict, fields: dict) -> list:
    """Refuse what speculators' block drafters (DSpark, DFlash 2) can state and this suite does not run: a
    reduced draft vocabulary, a draft width other than the target's, fused layers not given as decoder-layer
    outputs. ``fields``: the Qwen3 fields of the config's ``transformer_layer_config``. Returns the fused layers'
    ids (``aux_hidden_state_layer_ids``)."""
    if int(cfg.get("draft_vocab_size", fields["vocab_size"])) != fields["vocab_size"]:
        refuse("draft_vocab_size", cfg["draft_vocab_size"], "drafts here use the target's full vocabulary and LM "
               "head (no d2t/t2d mapping)")
    if cfg.get("target_hidden_size") not in (None, fields["hidden_size"]):
        refuse("target_hidden_size", cfg["target_hidden_size"], "the draft width equals the target's here")
    aux = cfg.get("aux_hidden_state_layer_ids")
    if not aux or min(int(j) for j in aux) < AUX_OFFSET:
        refuse("aux_hidden_state_layer_ids", aux, "the fused layers must be stated as decoder-layer outputs "
               "(speculators' id j = our layer j - 1; 0 is the embedding output)")
    return aux


def _target_layers(directory: Path, cfg: dict) -> int:
    """The target's decoder-layer count: the sidecar's fingerprint, else the verifier's local config."""
    side = read_sidecar(directory)
    if side is not None and side["target"]["fingerprint"].get("num_layers"):
        return int(side["target"]["fingerprint"]["num_layers"])
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    path = Path(str(verifier)).expanduser() / CONFIG_NAME if verifier else None
    if path is None or not path.is_file():
        refuse("speculators_config.verifier.name_or_path", verifier, "DSpark distils the target's last layer, so the "
               "target's layer count must be known: export with lit_domino (lit_domino_export.json) or point it at "
               "the local verifier directory")
    return int(json.loads(path.read_text())["num_hidden_layers"])


def import_dspark(directory: Path, cfg: dict, map_location="cpu"):
    fields = qwen3_fields(cfg.get("transformer_layer_config") or {}, "transformer_layer_config.")
    from_anchor = cfg.get("sample_from_anchor", True)  # speculators' default for dspark
    if not isinstance(from_anchor, bool):
        refuse("sample_from_anchor", from_anchor, "it is true or false")
    rank = int(cfg.get("markov_rank", 256))
    if rank <= 0:
        refuse("markov_rank", rank, "a DSpark drafter here has its Markov head (rank > 0); a pure DFlash draft is "
               "the 'backbone' kind")
    head_type = cfg.get("markov_head_type", "vanilla")
    if head_type not in HEAD_TYPES:
        refuse("markov_head_type", head_type, f"the Markov heads here are {', '.join(HEAD_TYPES)}")
    aux = check_block_layout(cfg, fields)
    confidence = bool(cfg.get("enable_confidence_head", True))
    with_markov = bool(cfg.get("confidence_head_with_markov", True))
    num_layers = _target_layers(directory, cfg)
    mask = cfg.get("mask_token_id")
    fields.update(block_size=int(cfg.get("block_size", 8)) + int(from_anchor),  # ours counts the verify width
                  sample_from_anchor=from_anchor,
                  feature_layers=[int(j) - AUX_OFFSET for j in aux] + [num_layers - 1],
                  mask_token_id=int(mask) if mask is not None else fields["vocab_size"] - 1,
                  head={"rank": rank, "head_type": head_type, "confidence": confidence,
                        "confidence_with_markov": confidence and with_markov})
    fields["target_fingerprint"] = foreign_fingerprint(directory, fields["hidden_size"], fields["vocab_size"],
                                                       mask, num_layers)
    head = fields.pop("head")
    config = DSparkConfig(**fields).replace(head=head)
    back = {v: k for k, v in RENAME.items()}
    tensors = {back.get(k, k): v for k, v in load_weights(directory).items() if k not in IGNORED}
    drafter = build_drafter(config)
    load_into(drafter, tensors, directory, map_location)
    return drafter


__all__ = ["NAME", "KINDS", "detect", "export", "import_dspark"]
