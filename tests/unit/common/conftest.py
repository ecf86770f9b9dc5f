"""Each tokenizer is loaded once per session: reading GGUF and importing transformers is slow."""

import pytest

from maas_services.common.model_files import ModelNotFoundError, default_model_path
from maas_services.common.text_tokenizer import TextTokenizer
from maas_services.common.tokenizer_loader import load_tokenizer


@pytest.fixture(scope="session")
def model_path():
    try:
        return default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tokenizer(model_path) -> TextTokenizer:
    return load_tokenizer(model_path)


@pytest.fixture(scope="session")
def hf_tokenizer(model_path):
    """transformers' own reading of the same GGUF file: the reference we must agree with."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        str(model_path.parent), gguf_file=model_path.name
    )
