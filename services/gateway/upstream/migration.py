"""Request migration: a stream whose engine fails goes on, on another replica.

When an engine fails under a request (its connection lost, its core dead, a
drain that outlasted its grace: the codes in MIGRATABLE), the request is sent
again, to another replica of the same deployment, with its prompt and the
output tokens its client already has as `resume_token_ids`. That engine takes
them as its own output so far (services/engine/resume.py), so the client's
stream continues with no token repeated or lost (docs/gateway.md,
"Migration"). A request migrates at most `limit` times; each resume that fails
again counts as one.

Not migrated, ending as before (an error event, billed by the cut-short rule):
a request with n > 1 (its samples share one engine stream and each would need
its own resume point), a code that blames the request or its deadline
(INVALID_ARGUMENT, DEADLINE_EXCEEDED...), a request past its limit, and one
for which no other replica answers a Pick within the hold's timeout
(GatewaySettings.hold_timeout_seconds, the same wait a request gets for a
deployment scaled to zero).

Billing: the tenant pays the prompt once and each delivered token once; the
re-prefill (prompt + resume tokens, sent again to the new replica) is the
platform's cost, counted here and carried in the usage event's
`migration_prefill_tokens`, never in its billed fields.
"""

from dataclasses import dataclass

import grpc
from prometheus_client import Counter

# Codes that say the replica went away under the request: its process or
# connection gone, its core dead (UNAVAILABLE), its server stopped at the end
# of a drain's grace (CANCELLED). Not INTERNAL (a step failure the engine could
# not pin on one request: the engine lives, and a request in that step may be
# its cause, so it is not sent on to break another replica) nor UNKNOWN.
MIGRATABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}

MIGRATIONS = Counter(
    "maas_gateway_migrations",
    "Engine failures under a running request, by what the gateway did: resumed on another"
    " replica, or ended because of the limit, no replica, n > 1, or a resume that failed",
    ["outcome"],
)
MIGRATION_PREFILL_TOKENS = Counter(
    "maas_gateway_migration_prefill_tokens",
    "Tokens sent again to prefill a migrated request (prompt + delivered output): the"
    " platform's cost, not billed to tenants",
)

RESUMED, LIMIT, NO_REPLICA, MULTIPLE_SAMPLES, RESUME_FAILED, NOT_MIGRATABLE = (
    "resumed",
    "limit",
    "no_replica",
    "n_above_1",
    "resume_failed",
    "not_migratable",
)


@dataclass(frozen=True)
class MigrationPolicy:
    limit: int
    # How long to wait for a replica to pick when none is left.
    hold_seconds: float


@dataclass
class Migrations:
    """One request's migrations so far."""

    policy: MigrationPolicy
    count: int = 0
    prefill_tokens: int = 0

    def refusal(self, code: grpc.StatusCode, n: int) -> str | None:
        """Why a failure with `code` ends the request; None: it may migrate."""
        if code not in MIGRATABLE:
            return NOT_MIGRATABLE
        if n > 1:
            return MULTIPLE_SAMPLES
        if self.count >= self.policy.limit:
            return LIMIT
        return None

    def started(self, prompt_tokens: int, resume_tokens: int) -> None:
        """A resume was sent: one more migration, its prefill the platform's."""
        self.count += 1
        self.prefill_tokens += prompt_tokens + resume_tokens
        MIGRATION_PREFILL_TOKENS.inc(prompt_tokens + resume_tokens)
