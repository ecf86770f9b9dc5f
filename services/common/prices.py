"""The price table: USD per million tokens for input, cached input and output.

Shared by billing, which prices every usage event with it
(services/billing/ledger.py), and the gateway, which reserves the most a
prepaid request can cost before admitting it (services/gateway/admission/quota_gate.py).
Billing loads the table from its file and publishes it in Redis (PRICES_KEY,
services/billing/consumer.py); the gateway reads it from there, so the two
price with one table.

Prices are keyed by deployment, the ModelDeployment that served the request,
not by the name the client sent: aliases and canary splits change which
deployment serves a name, and it is the deployment that costs. A canary
(`<model>-canary`) the table does not list costs what its model costs
(services/common/canary.py). Any other deployment the table does not list is
billed at `default` and counted in maas_billing_unpriced_events_total
(services/billing/ledger.py): billing cannot know which deployments exist, so
the alert on that counter is what catches a deployment rolled out without a
price.

Loaded from a YAML file (a ConfigMap in Kubernetes). Charges are computed in
nano-USD as exact integers, so summing millions of line items never drifts:
a price of p USD per million tokens is p * 1000 nano-USD per token.

    models:
      smollm2-135m-instruct: {input: 0.05, cached_input: 0.025, output: 0.10}
      # A batch column of its own; without one a batch line costs half (BATCH_DEFAULT_FACTOR).
      smollm2-135m-instruct-q8:
        {input: 0.06, output: 0.12, batch: {input: 0.02, output: 0.04}}
    default: {input: 0.0, cached_input: 0.0, output: 0.0}
    adapters:                   # LoRA adapters (issue #34) with a price of their own
      sql-upper: {input: 0.08, output: 0.16}

A request run with a LoRA adapter (a usage event with `adapter`) is priced at
the adapter's price where `adapters` lists one, else at its deployment's, the
base it ran on (`for_served`).

A batch line (a usage event with `batch_id`, services/gateway/batches/) is
priced at its model's `batch` prices; the gateway's prepaid reservation
holds the interactive (dearer) price and settles to the batch price.
"""

from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

from maas_services.common.canary import canary_of

NANO_PER_TOKEN_PER_USD_PER_MILLION = Decimal(1000)
# A batch line costs this much of the interactive price unless the table says (OpenAI's 50%).
BATCH_DEFAULT_FACTOR = Decimal("0.5")
# The table as billing last loaded it (PriceTable's JSON), for the gateway.
PRICES_KEY = "maas:billing:prices"


class ModelPrice(BaseModel):
    input: Decimal = Field(Decimal(0), ge=0)
    cached_input: Decimal = Field(Decimal(0), ge=0)
    output: Decimal = Field(Decimal(0), ge=0)
    # A batch line's prices (/v1/batches; its own `batch` is not read); None:
    # the interactive prices times BATCH_DEFAULT_FACTOR.
    batch: "ModelPrice | None" = None

    def for_batch(self) -> "ModelPrice":
        """The prices a batch line is billed at."""
        if self.batch is not None:
            return self.batch
        return ModelPrice(
            input=self.input * BATCH_DEFAULT_FACTOR,
            cached_input=self.cached_input * BATCH_DEFAULT_FACTOR,
            output=self.output * BATCH_DEFAULT_FACTOR,
        )

    def cost_nano_usd(self, prompt: int, cached: int, completion: int) -> int:
        uncached = max(prompt - cached, 0)
        usd_per_million = (
            uncached * self.input + cached * self.cached_input + completion * self.output
        )
        nano = usd_per_million * NANO_PER_TOKEN_PER_USD_PER_MILLION
        return int(nano.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))

    def most_nano_usd(self, prompt: int, completion: int) -> int:
        """The most `prompt` and `completion` tokens can cost: every prompt token
        at the dearer of the cached and uncached prices."""
        if self.cached_input > self.input:
            return self.cost_nano_usd(prompt, prompt, completion)
        return self.cost_nano_usd(prompt, 0, completion)


class PriceTable(BaseModel):
    models: dict[str, ModelPrice] = Field(default_factory=dict)
    default: ModelPrice = Field(default_factory=ModelPrice)
    adapters: dict[str, ModelPrice] = Field(default_factory=dict)

    def for_served(self, deployment: str, adapter: str = "") -> ModelPrice:
        """The price of a request `deployment` served, with `adapter` ("": none)."""
        if adapter and adapter in self.adapters:
            return self.adapters[adapter]
        return self.for_deployment(deployment)

    def for_deployment(self, deployment: str) -> ModelPrice:
        listed = self._listed_as(deployment)
        return self.models[listed] if listed else self.default

    def lists(self, deployment: str) -> bool:
        return self._listed_as(deployment) is not None

    def _listed_as(self, deployment: str) -> str | None:
        if deployment in self.models:
            return deployment
        model = canary_of(deployment)
        return model if model in self.models else None

    @classmethod
    def load(cls, path: str) -> "PriceTable":
        if not path:
            return cls()
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})
