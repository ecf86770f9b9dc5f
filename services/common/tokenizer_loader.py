"""Build a `TextTokenizer` from a GGUF file or a Hugging Face model folder.

A GGUF file carries no tokenizer.json, only llama.cpp's description of one:
the vocabulary, the merges, a type per token and the name of a pre-tokenizer.
We rebuild the Hugging Face tokenizer from those pieces. Only byte-level BPE
vocabularies ("gpt2" in GGUF terms) and the pre-tokenizers below are known;
anything else is refused rather than tokenized subtly wrong, since a model fed
token ids it was not trained on still answers, just worse.
"""

import json
from pathlib import Path
from typing import Any

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from maas_services.common.model_cache import derived_folder, publish
from maas_services.common.text_tokenizer import TextTokenizer


class TokenizerLoadError(ValueError):
    pass


def load_tokenizer(path: str | Path) -> TextTokenizer:
    """A folder is read as a Hugging Face checkout, a file as GGUF."""
    path = Path(path)
    if path.is_dir():
        return _load_hf_folder(path)
    if path.is_file():
        return _load_gguf_cached(path)
    raise TokenizerLoadError(f"no tokenizer at {path}: not a file or a folder")


def _load_gguf_cached(path: Path) -> TextTokenizer:
    # The Hugging Face files this writes read back as the same tokenizer (tested)
    # in a tenth of the time the GGUF's metadata takes to parse.
    folder = derived_folder(path)
    if (folder / _TOKENIZER_CONFIG).is_file():
        return _load_hf_folder(folder)
    tokenizer = _load_gguf(path)
    _save_hf_files(tokenizer, folder)
    return tokenizer


_TOKENIZER_CONFIG = "tokenizer_config.json"


def _save_hf_files(tokenizer: TextTokenizer, folder: Path) -> None:
    config = {
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "chat_template": tokenizer.chat_template,
        "model_max_length": tokenizer.max_model_len,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    # tokenizer_config.json goes last: its presence says the folder's tokenizer is whole.
    if publish(folder, "tokenizer.json", lambda p: tokenizer.tokenizer.save(str(p))):
        publish(folder, _TOKENIZER_CONFIG, lambda p: p.write_text(json.dumps(config, indent=2)))


def _byte_level() -> pre_tokenizers.ByteLevel:
    # ByteLevel's own regex is GPT-2's split, the last stage in both schemes below.
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


# Keyed by tokenizer.ggml.pre, each mirroring the split llama.cpp applies for that
# name. "smollm" isolates every digit before the GPT-2 split, exactly what
# SmolLM2's own tokenizer.json declares. transformers' GGUF loader skips the
# digit stage, which changes the ids for whitespace runs before a digit
# ("  1" must be "ĠĠ", "1", not "Ġ", "Ġ", "1").
_PRE_TOKENIZERS = {
    "gpt-2": _byte_level,
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), _byte_level()]
    ),
}


def _load_gguf(path: Path) -> TextTokenizer:
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise TokenizerLoadError(f"{path} is not a readable GGUF file: {exc}") from exc

    def field(key: str, default: Any = None) -> Any:
        found = reader.fields.get(key)
        return default if found is None else found.contents()

    model_type = field(gguf.Keys.Tokenizer.MODEL)
    if model_type != "gpt2":
        raise TokenizerLoadError(
            f"{path}: tokenizer model {model_type!r} is not supported, only byte-level BPE ('gpt2')"
        )
    pre = field(gguf.Keys.Tokenizer.PRE)
    if pre not in _PRE_TOKENIZERS:
        raise TokenizerLoadError(
            f"{path}: pre-tokenizer {pre!r} is not supported (known: {sorted(_PRE_TOKENIZERS)})"
        )

    tokens: list[str] = field(gguf.Keys.Tokenizer.LIST)
    # Byte-level tokens spell a space "Ġ", so a merge's one literal space separates its halves.
    merges = [tuple(merge.split(" ", 1)) for merge in field(gguf.Keys.Tokenizer.MERGES)]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()

    # Control tokens (<|im_start|>, <|endoftext|>...) must be matched whole in text and
    # dropped by decode(skip_special_tokens=True); user-defined ones are matched whole but kept.
    token_types = field(gguf.Keys.Tokenizer.TOKEN_TYPE, [])
    added = [
        AddedToken(token, special=kind == gguf.TokenType.CONTROL, normalized=False)
        for token, kind in zip(tokens, token_types, strict=False)
        if kind in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED)
    ]
    tokenizer.add_special_tokens([t for t in added if t.special])
    tokenizer.add_tokens([t for t in added if not t.special])

    bos_id = field(gguf.Keys.Tokenizer.BOS_ID)
    eos_id = field(gguf.Keys.Tokenizer.EOS_ID)
    bos = tokens[bos_id] if bos_id is not None else None
    eos = tokens[eos_id] if eos_id is not None else None
    # llama.cpp adds BOS/EOS on encode when these flags say so;
    # encode(add_special_tokens=True) does the same.
    prefix = [(bos, bos_id)] if bos is not None and field(gguf.Keys.Tokenizer.ADD_BOS) else []
    suffix = [(eos, eos_id)] if eos is not None and field(gguf.Keys.Tokenizer.ADD_EOS) else []
    if prefix or suffix:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=" ".join([t for t, _ in prefix] + ["$A"] + [t for t, _ in suffix]),
            special_tokens=prefix + suffix,
        )

    architecture = field(gguf.Keys.General.ARCHITECTURE)
    return TextTokenizer(
        tokenizer=tokenizer,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        bos_token=bos,
        eos_token=eos,
        chat_template=field(gguf.Keys.Tokenizer.CHAT_TEMPLATE),
        max_model_len=field(f"{architecture}.context_length"),
    )


# transformers writes int(1e30) as model_max_length when a model did not set one.
_UNSET_MAX_LENGTH = 10**18


def _load_hf_folder(folder: Path) -> TextTokenizer:
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise TokenizerLoadError(f"{folder} has no tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    config = _read_json(folder / "tokenizer_config.json")
    model_config = _read_json(folder / "config.json")

    bos = _token_content(config.get("bos_token"))
    eos = _token_content(config.get("eos_token"))

    max_len = model_config.get("max_position_embeddings")
    if max_len is None:
        configured = config.get("model_max_length")
        if isinstance(configured, int) and configured < _UNSET_MAX_LENGTH:
            max_len = configured

    return TextTokenizer(
        tokenizer=tokenizer,
        bos_token_id=tokenizer.token_to_id(bos) if bos is not None else None,
        eos_token_id=tokenizer.token_to_id(eos) if eos is not None else None,
        bos_token=bos,
        eos_token=eos,
        chat_template=_hf_chat_template(folder, config),
        max_model_len=max_len,
    )


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TokenizerLoadError(f"{path} is not valid JSON: {exc}") from exc


def _token_content(token: str | dict | None) -> str | None:
    # Older configs store special tokens as serialized AddedToken objects.
    if isinstance(token, dict):
        return token.get("content")
    return token


def _hf_chat_template(folder: Path, config: dict) -> str | None:
    # Recent transformers saves the template beside the config, and prefers that file when loading.
    template_file = folder / "chat_template.jinja"
    if template_file.is_file():
        return template_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    # Some models ship several named templates; "default" is the one chat completion uses.
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template}
        return named.get("default")
    return template
