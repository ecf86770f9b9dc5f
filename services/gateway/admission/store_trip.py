"""Admission's Redis scripts sent together: one round trip, not one per gate.

Once a request is tokenized, the rate limiter charges its tokens (TPM) and,
for a prepaid tenant, the quota gate holds its most cost against the balance:
two scripts that used to wait on each other, a round trip each, before the
request could go on. Each gate describes its script as a StoreCall; `replies`
sends them in one pipeline (not a transaction: each script is atomic on its
own, and neither reads what the other writes) and the gates read their own
reply, in the order the pipeline's caller chooses (pipeline.py: the limiter's
first, so a refused request's hold is released like any request's that ends).
"""

from dataclasses import dataclass

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from maas_services.gateway.admission.store_faults import STORE_FAILURES


@dataclass(frozen=True)
class StoreCall:
    script: AsyncScript
    keys: list[str]
    args: list


async def replies(*calls: StoreCall) -> list[object]:
    """Each call's reply, or the store's exception for it, in one round trip."""
    if not calls:
        return []
    if len(calls) == 1:
        (call,) = calls
        try:
            return [await call.script(keys=call.keys, args=call.args)]
        except STORE_FAILURES as exc:
            return [exc]
    # EVALSHA, not the Scripts: a pipeline holding Scripts asks SCRIPT EXISTS first.
    pipe = calls[0].script.registered_client.pipeline(transaction=False)
    for call in calls:
        pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
    try:
        answered = await pipe.execute(raise_on_error=False)
    except STORE_FAILURES as exc:
        return [exc] * len(calls)
    # A Redis that lost its scripts (a restart): those alone, which loads them.
    return [
        (await replies(call))[0] if isinstance(reply, NoScriptError) else reply
        for call, reply in zip(calls, answered, strict=True)
    ]
