"""Run by tests/lit/test_ddp.py in a subprocess (Lightning's ``ddp`` launcher re-runs this script once per extra
rank): ``train_variant`` of the backbone smoke variant on a tiny target, recording each rank's batches and anchor
draws.

    python ddp_train.py TARGET_DIR OUT_DIR DEVICES BATCH_SIZE
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning as L
import torch

from lit_domino.training import configs, experiment

torch.set_num_threads(1)
target_dir, out_dir, devices, batch_size = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])


class Probe(L.Callback):
    """Per step: the dataset indices of this rank's batch, its loss, and a probe draw of the anchor generator."""

    def __init__(self):
        self.steps = []

    def on_train_start(self, trainer, pl_module):
        if trainer.is_global_zero:
            torch.save({k: v.detach().clone() for k, v in pl_module.drafter.state_dict().items()}, out_dir / "init.pt")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        probe = torch.ones(2, 64, dtype=torch.long)
        from lit_domino.training.datamodule import sample_anchors

        step = trainer.global_step - 1  # the step this batch was drawn for
        g = trainer.datamodule.anchor_generator(step, trainer.global_rank)
        self.steps.append({"step": step, "indices": batch["index"].tolist(), "loss": float(outputs["loss"]),
                           "labels": int((batch["loss_mask"][:, 1:] * batch["loss_mask"][:, :-1]).sum()),
                           "probe_anchors": sample_anchors(probe, 4, g)[0].tolist(),
                           "anchors": batch["anchors"][batch["anchor_mask"]].tolist()})

    def on_train_end(self, trainer, pl_module):
        name = f"rank{trainer.global_rank}.json"
        (out_dir / name).write_text(json.dumps({"world_size": trainer.world_size, "steps": self.steps}))


cfg = configs.load_config("backbone", "smoke", overrides={
    "data.target": target_dir, "data.train_examples": {"math": 16}, "data.val_examples": {"math": 2},
    "data.max_new_tokens": 16, "data.batch_size": batch_size,
    # more anchor slots than labelled positions: every valid anchor is drawn, so both runs train the same blocks
    "data.num_anchors": 16, "data.max_length": 160, "data.block_size": 4,
    "model.init_args.num_layers": 1, "model.init_args.lr": 3e-3, "model.init_args.warmup_ratio": 0.0,
    "trainer.max_epochs": 2, "trainer.devices": devices, "trainer.strategy": "ddp" if devices > 1 else "auto",
    "trainer.log_every_n_steps": 1})
done = experiment.train_variant(cfg, experiment="ddp-test", progress=False, callbacks=[Probe()])
rank = os.environ.get("LOCAL_RANK", "0")
(out_dir / f"result{rank}.json").write_text(json.dumps({"drafter_dir": str(done.drafter_dir), "report": done.report,
                                                       "run_id": done.run_id, "is_rank_zero": experiment.is_rank_zero()}))
