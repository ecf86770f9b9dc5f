"""`maas serve tokenizer`."""

import os

from maas.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from maas_services.common import event_loop
from maas_services.common.grpc_server import (
    GrpcService,
    ServerHandle,
    run_until_signalled,
    start_server,
)
from maas_services.common.logging import get_logger
from maas_services.common.model_files import resolve_model_path
from maas_services.common.text_tokenizer import TextTokenizer
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.tokenizer.compile_admission import CompileAdmission
from maas_services.tokenizer.encode_pool import EncodePool
from maas_services.tokenizer.grammar_validator import GrammarValidator
from maas_services.tokenizer.registry import Deployment, TokenizerRegistry
from maas_services.tokenizer.servicer import TokenizerServicer
from maas_services.tokenizer.settings import TokenizerSettings

log = get_logger(__name__)
SERVICE_NAME = tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"].full_name


async def start_tokenizer(
    settings: TokenizerSettings, tokenizer: TextTokenizer
) -> tuple[ServerHandle, EncodePool]:
    """Serve `tokenizer` as the default deployment and settings.tokenizer_models
    beside it; the caller stops the server, then shuts the pool down."""
    default = Deployment.of(
        settings.model_id, tokenizer, settings.max_model_len or tokenizer.max_model_len
    )
    registry = TokenizerRegistry(
        default, settings.tokenizer_models, settings.max_resident_tokenizers, load_tokenizer
    )
    pool = EncodePool(settings.encode_threads, settings.encode_queue)
    grammars = GrammarValidator(
        settings.grammar_limits(),
        CompileAdmission(settings.grammar_budget_s_per_minute, settings.grammar_max_in_flight),
        settings.grammar_cache_mb << 20,
        settings.grammar_tenant_cache_mb << 20,
    )
    servicer = TokenizerServicer(registry, pool, grammars)
    log.info(
        "tokenizer_loaded",
        deployment=settings.model_id,
        vocab=tokenizer.vocab_size,
        max_model_len=default.max_model_len,
        max_token_chars=default.max_token_chars,
        encode_threads=settings.encode_threads,
        more_deployments=sorted(settings.tokenizer_models),
    )
    handle = await start_server(
        "tokenizer",
        settings,
        [GrpcService(SERVICE_NAME, servicer, tokenizer_pb2_grpc.add_TokenizerServicer_to_server)],
    )
    return handle, pool


async def serve(settings: TokenizerSettings) -> None:
    path = resolve_model_path(settings.model_path)
    log.info("tokenizer_loading", path=str(path))
    handle, pool = await start_tokenizer(settings, load_tokenizer(path))
    await run_until_signalled(handle, settings.shutdown_grace_seconds)
    pool.shutdown()


def main(settings: TokenizerSettings) -> None:
    # Concurrency comes from the encode threads; the Rust encoder's own thread pool
    # would spread a chat's few pieces over other cores per call: 132 against 75 us
    # of CPU for the bench's chat, plus the wakeups (docs/tokenizer.md, Speed).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    event_loop.run(serve(settings))
