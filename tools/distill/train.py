"""Train the draft on the target's text: next-token cross-entropy over packed windows.

The sequences (prompt and the target's answer) are joined end to end and cut
into equal windows, so no step wastes compute on padding. Learning the
target's own answers — its greedy choices, mostly — is sequence-level
distillation: what the draft must guess is exactly what the target says.
"""

import contextlib
import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from maas_services.common.machine_profile import machine_profile
from maas_services.engine.dense_forward import dense_hidden
from maas_services.engine.model import LlamaForCausalLM


@dataclass
class TrainConfig:
    steps: int = 150
    batch_size: int = 8
    window: int = 256
    learning_rate: float = 2e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    seed: int = 0


def pack(sequences: list[list[int]], window: int) -> torch.Tensor:
    """The sequences end to end, cut into [windows, window + 1] (inputs and the next token)."""
    stream = [t for seq in sequences for t in seq]
    count = (len(stream) - 1) // window
    if count == 0:
        raise ValueError(f"{len(stream)} tokens do not fill one window of {window}")
    rows = [stream[i * window : i * window + window + 1] for i in range(count)]
    return torch.tensor(rows, dtype=torch.long)


def loss_of(model: LlamaForCausalLM, batch: torch.Tensor) -> torch.Tensor:
    logits = model.compute_logits(dense_hidden(model, batch[:, :-1]))
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


def _autocast():
    # bfloat16 matmuls are several times faster where the CPU has them (AMX/AVX512-BF16).
    if machine_profile().native_bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(model: LlamaForCausalLM, windows: torch.Tensor, config: TrainConfig) -> list[float]:
    """Train in place; returns the loss of every step."""
    model.train().requires_grad_(True)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )

    def schedule(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    order = random.Random(config.seed)
    indices: list[int] = []
    losses = []
    bar = tqdm(range(config.steps), desc="Training the draft", unit="step")
    for _ in bar:
        if len(indices) < config.batch_size:
            refill = list(range(len(windows)))
            order.shuffle(refill)
            indices += refill
        batch = windows[[indices.pop() for _ in range(config.batch_size)]]
        with _autocast():
            loss = loss_of(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval().requires_grad_(False)
    return losses


@torch.inference_mode()
def agreement(draft: LlamaForCausalLM, sequences: list[list[int]], starts: list[int]) -> float:
    """Share of answer tokens the draft predicts right given the text before them.

    Teacher-forced top-1 agreement with the target's own answers: what greedy
    speculation accepts, before the draft's errors compound.
    """
    right = total = 0
    for seq, start in zip(sequences, starts, strict=True):
        ids = torch.tensor([seq])
        with _autocast():
            predicted = draft.compute_logits(dense_hidden(draft, ids[:, :-1])).argmax(-1)
        right += int((predicted[0, start - 1 :] == ids[0, start:]).sum())
        total += len(seq) - start
    return right / total if total else 0.0
