"""An unmodified Lightning Trainer.fit on a tiny module: `lit.py STEPS`."""

import sys

import lightning
import torch

import own_timing

torch.manual_seed(0)
torch.set_num_threads(1)


class Tiny(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())


class OwnTiming(lightning.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        own_timing.mark()


data = torch.utils.data.TensorDataset(torch.randn(2048, 32), torch.randn(2048, 1))
loader = torch.utils.data.DataLoader(data, batch_size=16)
trainer = lightning.Trainer(max_steps=int(sys.argv[1]), accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[OwnTiming()])
trainer.fit(Tiny(), loader)
