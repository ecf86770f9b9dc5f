"""A second real tokenizer, as a Hugging Face folder: no hub is reachable, so we train one.

A byte-level BPE trained by the `tokenizers` library on a few sentences: its
own vocabulary (a few hundred ids, not SmolLM2's 49,152), its own special
tokens, a Llama-2-style chat template where SmolLM2 has ChatML, and a short
context. Everything a deployment's tokenizer can differ in, differs.
"""

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

MAX_MODEL_LEN = 64
VOCAB_SIZE = 400
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}"
    "{% else %}<<SYS>>{{ m['content'] }}<</SYS>>{% endif %}{% endfor %}"
)
_CORPUS = [
    "Hello there, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Tokenizers split text into pieces a model was trained on.",
    "What is the capital of France? Paris is the capital of France.",
] * 20


def write_toy_model(folder: Path) -> Path:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": TEMPLATE,
        "model_max_length": MAX_MODEL_LEN,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
