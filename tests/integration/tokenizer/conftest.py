from tests.unit.common.conftest import model_path, tokenizer  # noqa: F401  (shared fixtures)
