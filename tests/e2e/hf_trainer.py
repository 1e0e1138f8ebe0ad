"""A Hugging Face Trainer run for the end-to-end tests: a tiny GPT-2 built from a config (nothing
downloaded), synthetic token data, CPU. Its output is transformers' own: the dict lines of
ProgressCallback above a tqdm bar, or with HF_TQDM=0 (`disable_tqdm=True`) the dicts
PrinterCallback prints. HF_NAN_AFTER=N: from step N on, the loss is nan (the logits become nan);
HF_NAN_FILTER=0 logs it as nan (`logging_nan_inf_filter=False`; the default drops nan steps from
the logged mean, which then reads `'loss': 0.0`).
"""

from __future__ import annotations

import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

VOCAB, LENGTH = 64, 16


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


class NanAfter(TrainerCallback):  # type: ignore[misc]
    def __init__(self, model: torch.nn.Module, step: int) -> None:
        self.model, self.step = model, step

    def on_step_begin(self, args: object, state: object, control: object, **kw: object) -> None:
        if getattr(state, "global_step", 0) >= self.step:
            with torch.no_grad():
                self.model.lm_head.weight.fill_(float("nan"))


def main() -> None:
    torch.set_num_threads(1)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=LENGTH)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir="out",
        max_steps=1_000_000,
        logging_steps=20,
        per_device_train_batch_size=8,
        save_strategy="no",
        report_to=[],
        no_cuda=True,
        disable_tqdm=os.environ.get("HF_TQDM") == "0",
        logging_nan_inf_filter=os.environ.get("HF_NAN_FILTER") != "0",
    )
    nan_after = int(os.environ.get("HF_NAN_AFTER", "0"))
    callbacks = [NanAfter(model, nan_after)] if nan_after else []
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks).train()


if __name__ == "__main__":
    main()
