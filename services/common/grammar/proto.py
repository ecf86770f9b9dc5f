"""maas.v1.Grammar <-> GrammarSpec, for the engine and the tokenizer service alike."""

from maas.v1 import common_pb2
from maas_services.common.grammar.spec import GrammarError, GrammarSpec


def grammar_from_proto(grammar: common_pb2.Grammar) -> GrammarSpec:
    """Raise GrammarError for an unset or unknown kind."""
    if grammar.kind == common_pb2.Grammar.KIND_UNSPECIFIED:
        raise GrammarError("grammar kind is unset")
    try:
        name = common_pb2.Grammar.Kind.Name(grammar.kind)
    except ValueError:
        raise GrammarError(f"unknown grammar kind {grammar.kind}") from None
    return GrammarSpec(name.removeprefix("KIND_").lower(), grammar.text)


def grammar_to_proto(spec: GrammarSpec) -> common_pb2.Grammar:
    return common_pb2.Grammar(
        kind=common_pb2.Grammar.Kind.Value(f"KIND_{spec.kind.upper()}"), text=spec.text
    )
