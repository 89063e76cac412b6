"""An unmodified Hugging Face Trainer run on a tiny, randomly initialised BERT (no download):
`hf.py STEPS [after]`; with `after`, save_model() and evaluate() follow training."""

import os
import sys
import tempfile

import torch
import transformers

import own_timing

torch.manual_seed(0)
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
steps = int(sys.argv[1])
config = transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64, num_labels=2)
model = transformers.BertForSequenceClassification(config)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 128, (16,), generator=g), "labels": i % 2}


class OwnTiming(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        own_timing.mark()


out = tempfile.mkdtemp()
args = transformers.TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=8,
                                      report_to=[], save_strategy="no", logging_strategy="no",
                                      use_cpu=True, disable_tqdm=True)
trainer = transformers.Trainer(model=model, args=args, train_dataset=Data(), eval_dataset=Data(),
                               callbacks=[OwnTiming()])
trainer.train()
if sys.argv[2:] == ["after"]:
    trainer.save_model(os.path.join(out, "final"))
    trainer.evaluate()
