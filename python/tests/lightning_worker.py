"""One rank of a sharded Lightning run (FSDP2 through TsnapModelParallelStrategy, Gloo on CPU),
launched by test_lightning.py with the torchrun variables set.

``lightning_worker.py train|resume CKPT_DIR OUT [CKPT]``: train: trains to step 6 with a
checkpoint every 2 steps, then (in the same processes, saving the launch) resumes a new model from
the checkpoint of step 4 and trains to step 6 again; resume: resumes from CKPT and trains to step
6. Each rank appends ``step loss.hex()`` lines to OUT/<mode>-losses-<rank>; rank 0 saves the whole
model and optimizer state (gathered from the shards) after step 4 (train) or once restored
(resume) to OUT/<mode>.pt.
"""

import os
import sys
import warnings

import torch

warnings.simplefilter("ignore")
torch.set_num_threads(1)

import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard  # noqa: E402

from tsnap.lightning import TsnapModelParallelStrategy  # noqa: E402

STEPS = 6


class Net(pl.LightningModule):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        # 16 rows split over 2 ranks; the last layer's one row leaves rank 1 an empty piece.
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 1))

    def configure_model(self):
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": {
            "scheduler": torch.optim.lr_scheduler.StepLR(opt, 3), "interval": "step"}}


def whole_state(trainer, module):
    """The model's and the optimizer's state, gathered whole (a collective: every rank)."""
    full = StateDictOptions(full_state_dict=True)
    optimizer = trainer.optimizers[0]
    return {"model": get_model_state_dict(module, options=full),
            "optimizer": get_optimizer_state_dict(module, optimizer, options=full)}


class Record(pl.Callback):
    def __init__(self, mode, out):
        self.mode, self.out = mode, out

    def on_train_start(self, trainer, module):
        if self.mode == "resume":
            self.dump(trainer, module)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        with open(os.path.join(self.out, f"{self.mode}-losses-{trainer.global_rank}"), "a") as f:
            f.write(f"{trainer.global_step} {outputs['loss'].item().hex()}\n")
        if self.mode == "train" and trainer.global_step == 4:
            self.dump(trainer, module)

    def dump(self, trainer, module):
        state = whole_state(trainer, module)
        if trainer.global_rank == 0:
            torch.save(state, os.path.join(self.out, f"{self.mode}.pt"))


def fit(mode, ckpt_dir, out, world, ckpt=None):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)), batch_size=4)
    callbacks = [Record(mode, out)]
    if mode == "train":
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=2, save_top_k=-1))
    trainer = pl.Trainer(
        max_steps=STEPS, accelerator="cpu", devices=world, logger=False,
        strategy=TsnapModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1),
        enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=mode == "train", callbacks=callbacks)
    trainer.fit(Net(0 if mode == "train" else 1), data, ckpt_path=ckpt)


def main():
    mode, ckpt_dir, out = sys.argv[1:4]
    world = int(os.environ["WORLD_SIZE"])  # Lightning's teardown unsets it
    if mode == "train":
        fit("train", ckpt_dir, out, world)
        fit("resume", ckpt_dir, out, world, os.path.join(ckpt_dir, "epoch=0-step=4.ckpt"))
    else:
        fit("resume", ckpt_dir, out, world, sys.argv[4])


if __name__ == "__main__":
    main()
