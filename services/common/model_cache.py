"""Files derived from a model file, kept so that the next start skips the work.

A GGUF file costs seconds before a process can serve: parsing its metadata
(~4 s for SmolLM2's 49k-token vocabulary on a 2-core EPYC), rebuilding the
tokenizer from it (~6 s) and dequantizing every tensor (~3 s). The engine and
the tokenizer service paid that on every start. What they derive from the file
is a Hugging Face folder (tokenizer.json, tokenizer_config.json, config.json,
model.safetensors), so each writes its part once, here, and later starts read
it back with the ordinary Hugging Face loaders; the same folder is what a peer
that cannot read GGUF (vLLM) is given.

A folder is keyed by the source file's identity (path, size, modification
time) and by `FORMAT`, so replacing the file or changing how we derive from it
starts a new folder instead of serving stale files. Each lookup marks its folder
used (its modification time), and a new folder's first file removes the folders
unused for `UNUSED_SECONDS`: the folders of replaced or deleted sources (every
test's temporary GGUF, every clone's model wheel) no longer pile up, and one in
use is never removed (an idle one is derived again, in seconds, when next asked
for). Each file is published with an atomic rename: a reader never sees half a
file, and two processes that prepare at once both end with whole files. A cache
that cannot be written (a pod's read-only root without a cache volume) is not an
error: the model loads from its source as before.

Where: $MAAS_CACHE_DIR, else $XDG_CACHE_HOME/maas, else ~/.cache/maas.
"""

import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from maas_services.common.logging import get_logger

log = get_logger(__name__)

# Bump when what is derived, or how, changes: old folders are then never read.
FORMAT = 2
# A folder nobody looked up for this long is removed when another is created.
UNUSED_SECONDS = 24 * 3600


def cache_root() -> Path:
    explicit = os.environ.get("MAAS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "maas"


def derived_folder(source: Path) -> Path:
    """The folder that holds what is derived from `source` (it may not exist yet), marked
    used where it does."""
    resolved = source.resolve()
    stat = resolved.stat()
    identity = f"{FORMAT}\0{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
    folder = cache_root() / "models" / f"{resolved.stem}-{digest}"
    with contextlib.suppress(OSError):
        os.utime(folder)
    return folder


def prune_unused(models: Path, keep: Path) -> list[Path]:
    """Remove the folders under `models` but `keep` not marked used for UNUSED_SECONDS."""
    cutoff = time.time() - UNUSED_SECONDS
    removed = []
    with contextlib.suppress(OSError):
        for folder in models.iterdir():
            with contextlib.suppress(OSError):
                if folder != keep and folder.is_dir() and folder.stat().st_mtime < cutoff:
                    shutil.rmtree(folder)
                    removed.append(folder)
    if removed:
        log.info("model_cache_pruned", folders=[f.name for f in removed])
    return removed


def publish(folder: Path, name: str, write: Callable[[Path], None]) -> bool:
    """Write `folder/name` through `write(temporary path)`; False if the cache is unwritable."""
    target = folder / name
    partial = folder / f".{name}.{os.getpid()}.partial"
    new = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write(partial)
        os.replace(partial, target)
    except OSError as exc:
        log.info("model_cache_unwritable", path=str(target), error=str(exc))
        with contextlib.suppress(OSError):
            partial.unlink()
        return False
    models = cache_root() / "models"
    if new and folder.parent == models:
        prune_unused(models, keep=folder)
    return True
