"""One tokenizer per deployment, loaded on first use, a bounded number resident.

A gateway fronts several models (SmolLM2 on the native engine, a Qwen or a
Llama on vLLM), each with its own vocabulary, chat template and context
length, and names the deployment in every request's `model`. The default
deployment (--model-id, --model-path) is loaded at startup and never evicted;
the others (--tokenizer-models) are loaded when a request first names them,
on a thread, since parsing a GGUF's metadata or a large tokenizer.json takes
seconds the event loop must not lose. Requests that arrive while a load is
under way wait for that one load, and a caller that goes away does not cancel
it for the others. At most `max_resident` of them stay loaded: the least
recently used is dropped (a request already holding it finishes with it).

A load that fails is not remembered: the next request tries again, so a
volume that mounts late or a corrected file is picked up without a restart.
"""

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from maas_services.common.logging import get_logger
from maas_services.common.text_tokenizer import TextTokenizer
from maas_services.tokenizer.grammar_check import GrammarChecker
from maas_services.tokenizer.settings import TokenizerSource

log = get_logger(__name__)

Loader = Callable[[Path], TextTokenizer]

# Names come from the service's own configuration, never from a request: a bounded label.
LOADS = Counter(
    "maas_tokenizer_loads_total",
    "Tokenizers loaded on first use (or again after eviction), by deployment and outcome",
    ["deployment", "outcome"],
)


class UnknownDeploymentError(LookupError):
    pass


class DeploymentLoadError(RuntimeError):
    pass


@dataclass(frozen=True)
class Deployment:
    """A deployment's tokenizer, with what every request checks against."""

    name: str
    tokenizer: TextTokenizer
    max_model_len: int
    max_token_chars: int
    grammars: GrammarChecker

    @classmethod
    def of(cls, name: str, tokenizer: TextTokenizer, max_model_len: int) -> "Deployment":
        """Takes a pass over the vocabulary (max_token_chars): build it off the event loop."""
        chars = tokenizer.max_token_chars
        # Made here, not by the first chat: a small one is encoded on the event loop,
        # and copying SmolLM2's vocabulary for the plain-text encoder takes ~0.3 s.
        _ = tokenizer.special_tokens, tokenizer.plain_text_tokenizer
        return cls(name, tokenizer, max_model_len, chars, GrammarChecker(tokenizer))


class TokenizerRegistry:
    def __init__(
        self,
        default: Deployment,
        sources: dict[str, TokenizerSource],
        max_resident: int,
        load: Loader,
    ):
        self.default = default
        self._sources = sources
        self._max_resident = max_resident
        self._load = load
        self._resident: OrderedDict[str, Deployment] = OrderedDict()
        self._loading: dict[str, asyncio.Task[Deployment]] = {}

    def names(self) -> list[str]:
        return [self.default.name, *sorted(self._sources)]

    async def get(self, name: str) -> Deployment:
        """The deployment `name` (the default when empty); UnknownDeploymentError
        if none is configured by that name, DeploymentLoadError if it cannot load."""
        if not name or name == self.default.name:
            return self.default
        resident = self._resident.get(name)
        if resident is not None:
            self._resident.move_to_end(name)
            return resident
        source = self._sources.get(name)
        if source is None:
            raise UnknownDeploymentError(name)
        task = self._loading.get(name)
        if task is None:
            task = asyncio.create_task(self._load_one(name, source))
            # Every waiter may be gone by the time a load fails: the failure is logged, not lost.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._loading[name] = task
        # Shielded: one caller's cancelled RPC must not cancel the load the others wait on.
        return await asyncio.shield(task)

    async def _load_one(self, name: str, source: TokenizerSource) -> Deployment:
        try:
            log.info("tokenizer_loading", deployment=name, path=source.path)
            try:
                deployment = await asyncio.to_thread(self._open, name, source)
            except Exception as exc:
                LOADS.labels(name, "failed").inc()
                log.error("tokenizer_load_failed", deployment=name, error=str(exc)[:300])
                # The detail (paths, file contents) is for the log, not for tenants.
                raise DeploymentLoadError(
                    f"the tokenizer of {name!r} could not be loaded; retry later"
                ) from exc
            LOADS.labels(name, "loaded").inc()
            self._resident[name] = deployment
            while len(self._resident) > self._max_resident:
                evicted, _ = self._resident.popitem(last=False)
                log.info("tokenizer_evicted", deployment=evicted)
            log.info(
                "tokenizer_loaded",
                deployment=name,
                vocab=deployment.tokenizer.vocab_size,
                max_model_len=deployment.max_model_len,
            )
            return deployment
        finally:
            del self._loading[name]

    def _open(self, name: str, source: TokenizerSource) -> Deployment:
        tokenizer = self._load(Path(source.path))
        return Deployment.of(name, tokenizer, source.max_model_len or tokenizer.max_model_len)
