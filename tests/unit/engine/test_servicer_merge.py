"""The engine sends one message per sample for outputs that are ready together."""

from maas_services.engine.logprobs import TokenLogprob
from maas_services.engine.request import SeqOutput
from maas_services.engine.servicer import merged


def output(index: int, ids: list[int], text: str, completion: int, finish=None) -> SeqOutput:
    return SeqOutput(
        request_id="r",
        index=index,
        token_ids=ids,
        text=text,
        finish_reason=finish,
        prompt_tokens=5,
        completion_tokens=completion,
        cached_prompt_tokens=0,
        logprobs=[TokenLogprob(token_id=i, logprob=-1.0, top=[]) for i in ids],
    )


def test_outputs_of_each_sample_merge_in_order():
    ready = [
        output(0, [10], "Hel", 1),
        output(1, [20], "Bon", 1),
        output(0, [11, 12], "lo!", 3),
        output(1, [21], "jour", 2, finish="stop"),
    ]
    first, second = merged(ready)
    assert (first.index, first.token_ids, first.text) == (0, [10, 11, 12], "Hello!")
    assert [lp.token_id for lp in first.logprobs] == [10, 11, 12]
    assert (first.completion_tokens, first.finish_reason) == (3, None)
    assert (second.index, second.token_ids, second.text) == (1, [20, 21], "Bonjour")
    assert (second.completion_tokens, second.finish_reason) == (2, "stop")


def test_a_lone_output_is_sent_as_it_is():
    alone = output(0, [7], "x", 1)
    assert merged([alone]) == [alone]
