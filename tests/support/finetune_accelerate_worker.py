"""A plain Accelerate training loop over the tiny Llama, for `accelerate launch` (any number
of processes) or one process (the reference). Rows all have ROW tokens, so the mean of the
ranks' mean losses is the global batch's mean loss, and DDP's averaged gradient is the global
batch's gradient. Rank 0 writes {"losses": [...], "device": ..., "distributed_type": ...}.

    accelerate launch --num_processes 2 finetune_accelerate_worker.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
from support.finetune_fixtures import arithmetic_texts, make_tokenizer, tiny_model  # noqa: E402

GLOBAL_BATCH = 4
ROW = 32
STEPS = 4


def fixed_length_rows(tok: Any) -> torch.Tensor:
    """Arithmetic texts tokenized into one stream, cut into rows of ROW tokens."""
    stream: list[int] = []
    for text in arithmetic_texts(96):
        stream += tok(text)["input_ids"] + [tok.eos_token_id]
    n = len(stream) // ROW
    return torch.tensor(stream[: n * ROW]).view(n, ROW)


def accelerate_losses(mixed_precision: str = "bf16") -> dict:
    from accelerate import Accelerator

    acc = Accelerator(mixed_precision=mixed_precision)
    tok = make_tokenizer()
    model = tiny_model(tok)
    rows = fixed_length_rows(tok)
    assert len(rows) >= GLOBAL_BATCH * STEPS
    loader = torch.utils.data.DataLoader(rows, batch_size=GLOBAL_BATCH // acc.num_processes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    losses = []
    for step, ids in enumerate(loader):
        if step == STEPS:
            break
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(acc.gather(loss.detach()).float().mean().item())
    return {
        "losses": losses,
        "device": str(acc.device),
        "num_processes": acc.num_processes,
        "distributed_type": str(acc.distributed_type),
        "backend": str(acc.state.backend),
    }


if __name__ == "__main__":
    report = accelerate_losses(sys.argv[2] if len(sys.argv) > 2 else "bf16")
    from accelerate import PartialState

    if PartialState().is_main_process:
        Path(sys.argv[1]).write_text(json.dumps(report))
    PartialState().wait_for_everyone()
