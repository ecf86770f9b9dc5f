"""A request the deployment cannot serve is a 400 before it is queued.

The router reports what a deployment's ready replicas serve
(DeploymentStats.serves, common/serves.py): an embedding request to a deployment
that only generates, or a completion to one that only embeds, is the client's
mistake, named as such. A deployment with no ready replica (scaled to zero, or
starting) is not judged here: its engine refuses the request with
INVALID_ARGUMENT, which the client also gets as a 400.
"""

from maas.v1 import router_pb2
from maas_services.common.openai_api.errors import bad_request
from maas_services.common.openai_api.parsed_request import ParsedRequest
from maas_services.common.serves import EMBED, GENERATE, offered


def check_serves(request: ParsedRequest, stats: router_pb2.DeploymentStats | None) -> None:
    if stats is None or not any(r.ready for r in stats.replicas):
        return
    serves = offered(stats.serves)
    if request.sampling.HasField("embedding"):
        if EMBED not in serves:
            raise bad_request(
                f"The model '{request.model}' does not serve embeddings.",
                param="model",
                code="model_not_supported",
            )
    elif GENERATE not in serves:
        raise bad_request(
            f"The model '{request.model}' serves embeddings only: use /v1/embeddings.",
            param="model",
            code="model_not_supported",
        )
