"""The most a request can cost, which the gateway reserves against a prepaid balance."""

from decimal import Decimal

from maas_services.common.prices import ModelPrice


def test_the_most_is_what_billing_charges_for_an_uncached_prompt_and_every_token():
    price = ModelPrice(input=Decimal("0.15"), cached_input=Decimal("0.075"), output=Decimal("0.6"))
    assert (
        price.most_nano_usd(1000, 50) == price.cost_nano_usd(1000, 0, 50) == 1000 * 150 + 50 * 600
    )
    # No cache hit, completion or sampling can make a request cost more.
    assert all(
        price.cost_nano_usd(1000, cached, done) <= price.most_nano_usd(1000, 50)
        for cached in (0, 500, 1000)
        for done in (0, 1, 50)
    )


def test_a_cached_price_above_the_input_price_bounds_the_most():
    price = ModelPrice(input=Decimal(1), cached_input=Decimal(2), output=Decimal(0))
    assert price.most_nano_usd(10, 0) == price.cost_nano_usd(10, 10, 0) == 20_000
