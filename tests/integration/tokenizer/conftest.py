import pytest

from tests.integration.tokenizer.toy_model import write_toy_model
from tests.unit.common.conftest import model_path, tokenizer  # noqa: F401  (shared fixtures)


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory):
    """A Hugging Face folder with a tokenizer unlike SmolLM2's (toy_model.py)."""
    return write_toy_model(tmp_path_factory.mktemp("toy-model"))
