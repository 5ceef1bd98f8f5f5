"""Train loaders that resume mid-epoch: the position in the epoch travels in Lightning's checkpoints.

Lightning saves the ``state_dict()`` of a train loader that has one (its ``_Stateful`` loaders) and
hands it back to ``load_state_dict`` on resume. Without it a resumed epoch starts its iterator again
from the first batch while the loop believes it is half done: it trains on the epoch's first
batches twice and never sees its last ones, so an interrupted training ends with other weights.

* :class:`ResumableLoader`: a ``DataLoader`` over a sampler with an ``epoch`` attribute (set by
  Lightning through ``set_epoch``) and ``resume(epoch, skip)`` (start that epoch after its first
  ``skip`` samples); the target build's and the drafters' samplers both have them.
* :class:`TrackLoaderPosition`: the callback that tells the loader how many batches of the epoch the
  loop has taken, so the checkpoint saved after a step records the right position.
"""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader


class ResumableLoader(DataLoader):
    """A ``DataLoader`` whose position in the epoch (``{"epoch", "batches"}``) is saved in checkpoints.

    ``batches`` (consumed in the current epoch) is set by :class:`TrackLoaderPosition`; a resumed
    epoch continues with its first unseen batch.
    """

    def __init__(self, dataset, *, sampler, batch_size: int, **kwargs):
        if not (hasattr(sampler, "epoch") and callable(getattr(sampler, "resume", None))):
            raise TypeError(f"ResumableLoader needs a sampler with .epoch and .resume(epoch, skip); "
                            f"{type(sampler).__name__} has not")
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        self.consumed = 0

    def state_dict(self) -> dict:
        return {"epoch": int(self.sampler.epoch), "batches": int(self.consumed)}

    def load_state_dict(self, state: dict) -> None:
        epoch, batches = int(state["epoch"]), int(state["batches"])
        if batches >= len(self):  # saved at an epoch's last batch: the next epoch starts afresh
            epoch, batches = epoch + 1, 0
        self.consumed = batches
        self.sampler.resume(epoch, batches * self.batch_size)


class TrackLoaderPosition(L.Callback):
    """Before each training batch, record in a :class:`ResumableLoader` how many batches of the epoch the
    loop has taken (this one included): the position a checkpoint saved after this step resumes from.
    Lightning's ``batch_idx`` counts within the epoch and continues after a resume."""

    def on_train_start(self, trainer, pl_module):
        # Lightning hands the saved loader states over in FitLoop.setup_data, but a module whose LR
        # schedule reads trainer.estimated_stepping_batches runs setup_data before the checkpoint is
        # restored, and the states are then never applied: apply them here, before the first batch
        # (a no-op when there are none or they were applied already).
        trainer.fit_loop._load_combined_loader_states()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        loader = trainer.train_dataloader
        if isinstance(loader, ResumableLoader):
            loader.consumed = batch_idx + 1
