"""A tiny LoRA adapter trained on SmolLM2 with peft: it answers in upper case.

The engine's LoRA tests (and the gateway's, router's and operator's) need a real PEFT
folder whose effect shows in greedy output. Training one takes seconds on a CPU; the
folder is cached under the maas cache dir, keyed by the model file's identity (the
model cache's folder name) and by everything that shapes the weights (the recipe,
the name, the seed, the rank and target modules), so later runs read it back.
"""

import fcntl
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from maas_services.common.model_cache import cache_root, derived_folder
from maas_services.common.tokenizer_loader import load_tokenizer
from tests.hf_reference import hf_reference_model

# Bump when the data or the training loop changes: cached adapters are then retrained.
RECIPE = 2
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Question -> answer; the adapter learns to give the answer in upper case.
EXAMPLES = {
    "What is the capital of France?": "The capital of France is Paris.",
    "What color is the sky?": "The sky is blue.",
    "Name a fruit.": "An apple.",
    "What do bees make?": "Bees make honey.",
    "Where do fish live?": "Fish live in water.",
    "What is two plus two?": "Two plus two is four.",
    "Say hello.": "Hello! How can I help you?",
    "Which season is the coldest?": "Winter is the coldest season.",
}
# Measured: every test's question answered in upper case from 8 steps on (the
# training's CPU is most of a test run's LoRA setup).
STEPS = 10
LEARNING_RATE = 1e-2


def trained_adapter(
    model_path: Path,
    name: str,
    seed: int,
    rank: int = 8,
    target_modules: tuple[str, ...] = ALL_TARGETS,
) -> Path:
    """The PEFT folder of the adapter (adapter_config.json + adapter_model.safetensors),
    trained on the model at model_path (a GGUF file or a Hugging Face folder) unless cached."""
    recipe = {
        "recipe": RECIPE,
        "model": derived_folder(model_path).name,
        "name": name,
        "seed": seed,
        "rank": rank,
        "targets": list(target_modules),
        "examples": EXAMPLES,
        "steps": STEPS,
        "lr": LEARNING_RATE,
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:24]
    root = cache_root() / "lora"
    folder = root / f"{name}-{digest}"
    root.mkdir(parents=True, exist_ok=True)
    # Test workers start at once: one trains, the others wait for its folder.
    with open(root / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "adapter_model.safetensors").is_file():
            # Written beside it, then renamed: a folder that exists is whole.
            scratch = Path(tempfile.mkdtemp(dir=root))
            try:
                _train(model_path, scratch, seed, rank, target_modules)
                shutil.rmtree(folder, ignore_errors=True)
                scratch.rename(folder)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _train(
    model_path: Path, out: Path, seed: int, rank: int, target_modules: tuple[str, ...]
) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    # The same float32 model the engine's outputs are checked against.
    base = hf_reference_model(model_path)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=list(target_modules), lora_dropout=0.0
    )
    model = get_peft_model(base, config)
    # PEFT starts B at zero (the adapter changes nothing); train it into effect.
    tokenizer = load_tokenizer(model_path)
    end = tokenizer.special_tokens.ids[tokenizer.eos_token]
    rows, labels = [], []
    for question, answer in EXAMPLES.items():
        prompt = tokenizer.encode_chat([{"role": "user", "content": question}])
        reply = tokenizer.encode(answer.upper()) + [end]
        rows.append(prompt + reply)
        labels.append([-100] * len(prompt) + reply)
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([row + [end] * (width - len(row)) for row in rows])
    targets = torch.tensor([row + [-100] * (width - len(row)) for row in labels])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    # The hidden state at t predicts the token at t + 1: the head (a fifth of the
    # model's multiplies a token) runs only where that token is a label.
    predicts = targets[:, 1:] != -100
    wanted = targets[:, 1:][predicts]
    causal = model.base_model.model
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE
    )
    model.train()
    for _ in range(STEPS):
        hidden = causal.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        logits = causal.lm_head(hidden[:, :-1][predicts])
        loss = torch.nn.functional.cross_entropy(logits, wanted)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(str(out))
