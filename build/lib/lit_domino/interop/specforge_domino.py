"""The ``specforge-domino`` format: SpecForge's Domino (``specforge.modeling.draft.domino.DominoDraftModel``).

The DFlash layout (:mod:`lit_domino.interop.dflash`) with ``dflash_config`` keys ``projector_type: domino``,
``emb_dim`` (rank r), ``gru_hidden_dim`` (d_s), ``shift_label: false``, ``pure_draft_prefix_len: 0`` and
the head's tensors renamed: ``head.gru.*`` → ``prefix_gru.*``, W_down ``head.down`` → ``embed_proj.0``,
W_up ``head.up`` → ``embed_proj.2``.

Why the logits are equal: with ``shift_label`` false and no pure-draft prefix, SpecForge's
``apply_logits_head`` runs the GRU over the embeddings of block tokens 0..B-2 (x_a, then each
position's token), pairs state ``S_{i-1}`` with the hidden state of block position ``i`` for
i = 1..B-1, adds ``embed_proj([H_i; S_{i-1}])`` to the base logits there and keeps position 0's base
logits: our ``DominoDrafter.add_head`` (teacher forcing) and ``DominoHead.rollout`` exactly.
Other conventions (``shift_label: true``: position k predicts x_{start+k+1}; a pure-draft prefix)
are another drafter and are refused.
"""

from __future__ import annotations

from pathlib import Path

from lit_domino.interop import FORMAT_KINDS
from lit_domino.interop.common import (ExportError, build_config, config_value, refuse, save_weights, target_record,
                                       write_sidecar)
from lit_domino.models.domino import DominoConfig, DominoHeadConfig

NAME = "specforge-domino"
KINDS = FORMAT_KINDS[NAME]
PROJECTOR = "domino"
RENAMES = {"head.gru.weight_ih_l0": "prefix_gru.weight_ih_l0", "head.gru.weight_hh_l0": "prefix_gru.weight_hh_l0",
           "head.down.weight": "embed_proj.0.weight", "head.up.weight": "embed_proj.2.weight"}
LEGACY_PREFIX = "logit_head."
"""Early SpecForge checkpoints nested the head under ``logit_head.`` (SpecForge still reads them)."""


def export(drafter, directory: Path, target=None) -> Path:
    from lit_domino.interop.dflash import layout_config

    if drafter.kind not in KINDS:
        raise ExportError(f"format {NAME!r} holds a Domino drafter, not a {drafter.kind!r} one"
                          + ("; export a backbone as 'dflash'" if drafter.kind == "backbone" else ""))
    rec = target_record(drafter, target)
    h = drafter.config.head
    extra = {"projector_type": PROJECTOR, "emb_dim": int(h.rank), "gru_hidden_dim": int(h.gru_hidden),
             "shift_label": False, "pure_draft_prefix_len": 0}
    layout_config(drafter, rec, extra, architecture="DominoDraftModel").save_pretrained(directory)
    save_weights({RENAMES.get(k, k): v for k, v in drafter.state_dict().items()}, directory, NAME)
    write_sidecar(directory, NAME, drafter, rec)
    return directory


def import_head(dc: dict, fields: dict, tensors: dict):
    """(DominoConfig, tensors renamed to ours) of a Domino ``dflash_config``, refusing other conventions."""
    if bool(dc.get("shift_label", False)):
        refuse("dflash_config.shift_label", dc["shift_label"], "this suite's label convention is DFlash's: block "
               "position k >= 1 predicts x_{start+k} (shift_label false)")
    if config_value(dc, "pure_draft_prefix_len", int, "dflash_config.", 0) != 0:
        refuse("dflash_config.pure_draft_prefix_len", dc["pure_draft_prefix_len"], "the Domino head here corrects "
               "every drafted position (0)")
    rank, gru = (config_value(dc, key, int, "dflash_config.", why="a Domino projector needs its rank and GRU width")
                 for key in ("emb_dim", "gru_hidden_dim"))
    config = build_config(DominoConfig, {**fields, "head": DominoHeadConfig(rank=rank, gru_hidden=gru)})
    back = {v: k for k, v in RENAMES.items()}
    out = {}
    for key, value in tensors.items():
        key = key[len(LEGACY_PREFIX):] if key.startswith(LEGACY_PREFIX) else key
        out[back.get(key, key)] = value
    return config, out
