"""`maas serve tokenizer`."""

import asyncio

from maas.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from services.common.grpc_server import GrpcService, run_until_signalled, start_server
from services.common.logging import get_logger
from services.common.model_files import resolve_model_path
from services.common.tokenizer_loader import load_tokenizer
from services.tokenizer.servicer import TokenizerServicer
from services.tokenizer.settings import TokenizerSettings

log = get_logger(__name__)
SERVICE_NAME = tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"].full_name


async def serve(settings: TokenizerSettings) -> None:
    path = resolve_model_path(settings.model_path)
    tokenizer = load_tokenizer(path)
    max_model_len = settings.max_model_len or tokenizer.max_model_len
    log.info(
        "tokenizer_loaded", path=str(path), vocab=tokenizer.vocab_size, max_model_len=max_model_len
    )
    servicer = TokenizerServicer(settings.model_id, tokenizer, max_model_len)
    handle = await start_server(
        "tokenizer",
        settings,
        [GrpcService(SERVICE_NAME, servicer, tokenizer_pb2_grpc.add_TokenizerServicer_to_server)],
    )
    await run_until_signalled(handle, settings.shutdown_grace_seconds)


def main(settings: TokenizerSettings) -> None:
    asyncio.run(serve(settings))
