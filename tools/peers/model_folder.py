"""The Hugging Face folder a peer loads (vLLM reads no GGUF), from our model file.

The model cache already derives it piecewise: the tokenizer service writes
tokenizer.json and tokenizer_config.json (with the chat template), the engine
config.json and the safetensors shards. A peer may start before either ran,
so this writes both parts in one call, without starting an engine; a second
call only reads the markers. `python -m maas_tools.peers.model_folder [PATH]`
prints it.
"""

import sys
from pathlib import Path

from maas_services.common.model_cache import derived_folder
from maas_services.common.model_files import resolve_model_path
from maas_services.common.tokenizer_loader import load_tokenizer

# What a Hugging Face loader needs besides the weights; each is written last by its part.
_PARTS = ("config.json", "tokenizer.json", "tokenizer_config.json")


class ModelFolderError(RuntimeError):
    pass


def hf_model_folder(model: str | Path | None = None) -> Path:
    """A Hugging Face folder for `model` (a GGUF file, a folder, or empty: the bundled SmolLM2)."""
    source = resolve_model_path(str(model) if model else None)
    if source.is_dir():
        return source
    folder = derived_folder(source)
    if all((folder / part).is_file() for part in _PARTS):
        return folder
    # torch only when the weights are still to be written.
    from maas_services.engine.loader import derive_hf_folder

    load_tokenizer(source)
    derive_hf_folder(source)
    missing = [part for part in _PARTS if not (folder / part).is_file()]
    if missing:
        raise ModelFolderError(
            f"could not write {', '.join(missing)} in {folder}: "
            "set MAAS_CACHE_DIR to a writable folder"
        )
    return folder


if __name__ == "__main__":
    print(hf_model_folder(sys.argv[1] if len(sys.argv) > 1 else None))
