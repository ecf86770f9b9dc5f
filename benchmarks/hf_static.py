"""transformers' static batching: the baseline the engine issue measures against.

A static batch starts together and runs until its longest request is done
(what `generate` does), so a short request's slot idles while the long ones
finish; the figure that counts is the tokens the requests asked for per
second, not the padded ones computed.
"""

import time
from pathlib import Path

import torch


def load_hf_model(path: Path, dtype: torch.dtype, device: torch.device):
    """The bundled GGUF through transformers, as a user of transformers would load it."""
    import transformers

    return (
        transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype
        )
        .to(device)
        .eval()
    )


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, attention mask) of a batch, padded on the left as decoder-only
    batched generation needs."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def static_tokens_per_s(
    hf_model, prompts: list[list[int]], lengths: list[int], batch: int, device: torch.device
) -> float:
    """Requested output tokens per second, generating `batch` prompts at a time greedily."""
    started = time.perf_counter()
    for first in range(0, len(prompts), batch):
        group = range(first, min(first + batch, len(prompts)))
        ids, mask = left_padded([prompts[i] for i in group])
        longest = max(lengths[i] for i in group)
        with torch.inference_mode():
            hf_model.generate(
                ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=longest,
                min_new_tokens=longest,
                do_sample=False,
                pad_token_id=0,
            )
    return sum(lengths) / (time.perf_counter() - started)
