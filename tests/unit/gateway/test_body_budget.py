"""The byte budget's arithmetic and its waits, without a server."""

import asyncio

import pytest

from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.body_budget import BodyBudget, BudgetLimits
from maas_services.gateway.admission.tenants import Tenant

MiB = 1024 * 1024


def limits(**changes) -> BudgetLimits:
    return BudgetLimits(
        **{
            "total_bytes": 32 * MiB,
            "tenant_bytes": 8 * MiB,
            "body_bytes": 4 * MiB,
            "wait_seconds": 0.05,
            **changes,
        }
    )


@pytest.mark.parametrize(
    ("max_concurrency", "share"),
    [
        (1, 4 * MiB),  # one full body
        (2, 8 * MiB),  # max_concurrency x max_body_bytes
        (50, 8 * MiB),  # at most tenant_bytes
        (0, 8 * MiB),  # no concurrency limit: tenant_bytes
    ],
)
def test_a_tenant_share_follows_its_concurrency(max_concurrency, share):
    assert limits().for_tenant(Tenant(name="t", max_concurrency=max_concurrency)) == share


def test_a_share_is_never_below_one_body_nor_above_the_total():
    assert limits(tenant_bytes=MiB).for_tenant(Tenant(name="t")) == 4 * MiB
    assert limits(total_bytes=4 * MiB).for_tenant(Tenant(name="t")) == 4 * MiB


def test_a_total_that_cannot_hold_one_body_is_refused_at_start():
    with pytest.raises(ValueError, match="max_body_bytes"):
        limits(total_bytes=MiB)


async def test_a_reservation_waits_for_a_release_then_takes_its_place():
    budget = BodyBudget(limits(wait_seconds=30))
    tenant = Tenant(name="t", max_concurrency=1)
    first, second = budget.lease(tenant), budget.lease(tenant)
    await first.grow(4 * MiB)
    waiting = asyncio.create_task(second.grow(MiB))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    first.release()
    await waiting
    assert budget.held_by("t") == MiB
    second.release()
    assert budget.held == 0


async def test_over_its_share_a_tenant_gets_429_and_over_the_total_503():
    budget = BodyBudget(limits(total_bytes=12 * MiB))
    hog = budget.lease(Tenant(name="hog"))
    await hog.grow(8 * MiB)
    with pytest.raises(APIError) as own:
        await budget.lease(Tenant(name="hog")).grow(1)
    other = budget.lease(Tenant(name="other"))
    await other.grow(4 * MiB)
    with pytest.raises(APIError) as replica:
        await budget.lease(Tenant(name="third")).grow(1)
    assert (own.value.status, own.value.code) == (429, "body_budget_exceeded")
    assert own.value.headers == {"Retry-After": "1"}
    assert replica.value.status == 503
    # A refused reservation holds nothing; releases are idempotent.
    hog.release()
    hog.release()
    other.release()
    assert budget.held == 0 and budget.held_by("hog") == 0


async def test_shrinking_gives_back_what_a_smaller_message_did_not_need():
    budget = BodyBudget(limits())
    lease = budget.lease(Tenant(name="t"))
    await lease.grow(4 * MiB)
    lease.shrink_to(1000)
    assert budget.held == 1000
    lease.release()
    assert budget.held == 0
