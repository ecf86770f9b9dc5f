"""The usage event: one per finished request, from the gateway to billing.

It travels as the fields of a Redis stream entry, so every value is a string.
"""

from pydantic import BaseModel, Field

USAGE_STREAM = "maas:usage:events"


class UsageEvent(BaseModel):
    request_id: str = Field(min_length=1)
    tenant: str = Field(min_length=1)
    key_id: str = ""
    # The name the client sent (an alias, or a deployment exposed by name).
    model: str
    # The ModelDeployment that served it, which prices the request.
    deployment: str = ""
    # The LoRA adapter it ran with ("" for the base model): priced by its own
    # price where the table has one, else by its deployment's (prices.py).
    adapter: str = ""
    endpoint: str = ""
    prompt_tokens: int = Field(ge=0)
    cached_prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(ge=0)
    finish_reason: str = ""
    started_at: float
    ttft_seconds: float = 0.0
    duration_seconds: float = 0.0
    # Tokens prefilled again when the request migrated to another replica
    # (docs/gateway.md "Migration"): the platform's cost, never billed.
    migration_prefill_tokens: int = Field(0, ge=0)
    # W3C trace context of the request, so billing's span joins its trace.
    traceparent: str = ""
    # The batch the request was a line of ("" for an interactive request):
    # billing prices it at the batch price (prices.py).
    batch_id: str = ""

    @property
    def served_by(self) -> str:
        """The deployment to price by; an event that names none (the field is
        optional) is priced by the name the client sent."""
        return self.deployment or self.model

    def to_fields(self) -> dict[str, str]:
        return {name: str(value) for name, value in self.model_dump().items()}

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> "UsageEvent":
        return cls.model_validate(fields)
