from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from maas_services.common.canary import canary_deployment
from maas_services.common.prices import ModelPrice, PriceTable

CHART_VALUES = Path(__file__).parents[3] / "charts" / "maas" / "values.yaml"


def test_cost_is_exact_nano_usd_with_cached_tokens_at_their_own_price():
    price = ModelPrice(input=Decimal("0.15"), cached_input=Decimal("0.075"), output=Decimal("0.6"))
    # 800 uncached at 150, 200 cached at 75, 50 out at 600 nano-USD per token.
    assert (
        price.cost_nano_usd(prompt=1000, cached=200, completion=50)
        == 800 * 150 + 200 * 75 + 50 * 600
    )


def test_unlisted_deployments_use_the_default_price():
    table = PriceTable(
        models={"a": ModelPrice(output=Decimal(1))}, default=ModelPrice(output=Decimal(2))
    )
    assert table.for_deployment("b").cost_nano_usd(0, 0, 1) == 2000
    assert table.lists("a") and not table.lists("b")


def test_a_canary_costs_its_models_price_until_it_is_listed_itself():
    table = PriceTable(
        models={"m": ModelPrice(output=Decimal(1)), "n-canary": ModelPrice(output=Decimal(3))},
        default=ModelPrice(output=Decimal(2)),
    )
    assert table.for_deployment(canary_deployment("m")).cost_nano_usd(0, 0, 1) == 1000
    assert table.lists("m-canary")
    assert table.for_deployment("n-canary").cost_nano_usd(0, 0, 1) == 3000
    # Only the operator's suffix names a canary, and only of a listed model.
    assert not table.lists("x-canary") and not table.lists("-canary") and not table.lists("m-canar")


def test_negative_prices_are_refused():
    with pytest.raises(ValidationError):
        ModelPrice(input=Decimal("-1"))


def test_the_charts_price_table_is_what_billing_reads():
    values = yaml.safe_load(CHART_VALUES.read_text())
    table = PriceTable.model_validate(values["prices"])
    assert table.models, "the chart ships no prices"
    assert all(p.output > 0 for p in table.models.values())
