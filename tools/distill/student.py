"""The draft's shape and its starting weights.

The draft shares the target's vocabulary, so its embedding table is most of
its size and its LM head most of its cost; a narrow hidden size keeps both
small. The table starts as the target's own embeddings projected onto their
top principal directions: token similarities the target learned carry over,
and training starts far from random.
"""

import dataclasses

import torch

from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.model_config import ModelConfig


@dataclasses.dataclass
class StudentShape:
    layers: int = 4
    hidden_size: int = 256
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 1024


def student_config(target: ModelConfig, shape: StudentShape) -> ModelConfig:
    return dataclasses.replace(
        target,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_layers=shape.layers,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        head_dim=shape.hidden_size // shape.heads,
        tie_word_embeddings=True,
        attention_bias=False,
    )


def init_student(target: LlamaForCausalLM, config: ModelConfig, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    student = LlamaForCausalLM(config)
    std = 0.02
    for name, param in student.named_parameters():
        if name.endswith("norm.weight"):
            torch.nn.init.ones_(param)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            # Residual branches start small, so the stack starts near the identity.
            torch.nn.init.normal_(param, std=std / (2 * config.num_layers) ** 0.5)
        else:
            torch.nn.init.normal_(param, std=std)
    embeddings = target.model.embed_tokens.weight.detach().float()
    # Principal directions of the target's table: eigenvectors of its Gram matrix.
    _, vectors = torch.linalg.eigh(embeddings.T @ embeddings)
    projected = embeddings @ vectors[:, -config.hidden_size :]
    # Rescaled so the tied head's first logits have unit spread: the top
    # directions carry most of the variance, and raw they start overconfident.
    scale = projected.std() * config.hidden_size**0.5
    student.model.embed_tokens.weight.data.copy_(projected / scale)
    return student
