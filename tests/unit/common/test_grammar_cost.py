"""Grammar cost caps, read from the parsed grammar (services/common/grammar/cost.py)."""

import json

import pytest

from benchmarks.structured_schemas import SCHEMAS
from maas_services.common.grammar import cost
from maas_services.common.grammar.cache import TenantCache
from maas_services.common.grammar.spec import GrammarError, GrammarSpec
from tests.e2e.test_structured_outputs import WEATHER, City

# The issue's attack: 287 characters that took 37 s and 564 MB to compile.
ATTACK = "root ::= " + " ".join(f"r{i}" for i in range(10)) + "\n"
ATTACK += "\n".join(f'r{i} ::= [^"\\nab]{{4,128}}' for i in range(10))


def measured(kind: str, text: str = "") -> cost.GrammarCost:
    return cost.measure(cost.parse(GrammarSpec(kind, text)))


def test_counts_rules_classes_and_repetition_bounds_outside_strings_and_classes():
    # Brackets and braces inside "strings" and [classes] are text, not structure.
    normal_form = (
        'root ::= (("[" a{2, 5} "{9}" b{0, -1} [\\]{}] c{3, -1}))\n'
        'a ::= (([a-z]))\nb ::= (("\\"[" [^\\"]))\nc ::= (("x"))\n'
    )
    assert cost.count(normal_form) == cost.GrammarCost(rules=4, classes=3, repeat_bound=5 + 0 + 3)


def test_the_parsed_form_is_what_is_counted():
    got = measured("ebnf", 'root ::= [a-z]{2,40} "-" [0-9]{1,3} "x"*')
    assert got.classes >= 2 and got.repeat_bound == 40 + 3


def test_the_issues_attack_grammar_is_refused_naming_the_limit():
    with pytest.raises(
        GrammarError, match=r"repetition bounds .* add up to 1280 after parsing; at most 256"
    ):
        measured("ebnf", ATTACK).check()


@pytest.mark.parametrize(
    "kind, text",
    [("json_schema", json.dumps(schema)) for _, schema in SCHEMAS]
    + [
        ("json_schema", json.dumps(WEATHER["function"]["parameters"])),
        ("json_schema", json.dumps(City.model_json_schema())),
        ("json_object", ""),
        ("regex", "[a-z]+@[a-z]+\\.com"),
        ("choice", '["yes", "no"]'),
    ],
)
def test_real_schemas_and_tools_pass_the_caps(kind, text):
    measured(kind, text).check()


def test_every_cap_is_named():
    caps = cost.CostCaps(rules=3, classes=2, repeat_bound=10)
    for grammar, name in [
        (cost.GrammarCost(rules=4, classes=0, repeat_bound=0), "4 rules"),
        (cost.GrammarCost(rules=1, classes=3, repeat_bound=0), "3 character classes"),
        (cost.GrammarCost(rules=1, classes=1, repeat_bound=11), "add up to 11"),
    ]:
        with pytest.raises(GrammarError, match=name):
            grammar.check(caps)


def test_a_grammar_that_does_not_parse_is_named():
    with pytest.raises(GrammarError, match='Rule "nowhere" is not defined'):
        measured("ebnf", "root ::= nowhere")


def test_the_cache_is_per_tenant_and_a_tenant_over_its_bytes_evicts_only_itself():
    cache: TenantCache[str] = TenantCache(total_bytes=1000, tenant_bytes=400)
    cache.put("a", "regex", "x", "A1", 100)
    cache.put("b", "regex", "x", "B1", 100)
    assert cache.get("a", "regex", "x") == "A1" and cache.get("c", "regex", "x") is None
    for i in range(5):  # a's new grammars push out a's oldest, never b's
        cache.put("a", "regex", f"y{i}", f"A{i}", 100)
    assert cache.get("b", "regex", "x") == "B1"
    assert cache.get("a", "regex", "x") is None
    assert cache.bytes_held("a") <= 400


def test_a_full_cache_evicts_from_the_tenant_holding_most():
    cache: TenantCache[str] = TenantCache(total_bytes=600, tenant_bytes=400)
    for i in range(3):
        cache.put("big", "regex", f"{i}", "v", 120)
    cache.put("small", "regex", "s", "v", 120)
    cache.put("small", "regex", "t", "v", 120)  # total over 600: "big" pays
    assert cache.get("small", "regex", "s") == "v"
    assert cache.bytes_held("big") < 3 * 121
