"""The core's messages carry the engine's dataclasses whole, whatever fields they have."""

from maas_services.common.grammar.spec import GrammarSpec
from maas_services.engine.core import protocol
from maas_services.engine.logprobs import TokenLogprob
from maas_services.engine.request import SeqOutput
from maas_services.engine.sampling_params import SamplingParams


def test_every_sampling_field_crosses():
    params = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        min_p=0.1,
        repetition_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=2**64 - 1,
        max_tokens=3,
        min_tokens=1,
        ignore_eos=True,
        stop=["x", "yz"],
        stop_token_ids=[7],
        n=2,
        logprobs=True,
        top_logprobs=3,
        speculative=True,
        grammar=GrammarSpec("regex", "a+"),
    )
    add = protocol.Add("r", [1, 2], params, priority=3, tenant="t", share_prefix_cache=True)
    assert protocol.decode_input(protocol.encode(add)) == add


def test_a_step_batch_crosses_in_order():
    output = SeqOutput(
        "r", 1, [5], "hi", "stop", 2, 1, 0, computed_prompt_tokens=2,
        logprobs=[TokenLogprob(5, -0.25, [(5, -0.25), (6, -2.0)])], scheduled_time=1.5,
    )  # fmt: skip
    batch = protocol.StepBatch(
        load=protocol.Load(1, 2, 0.5),
        scheduled=["r"],
        outputs=[output],
        failures=[protocol.Failure("q", "bad", engine=True)],
        kv_events=[("stored", [2**63 + 1]), ("cleared", [])],
    )
    assert protocol.decode_output(protocol.encode(batch)) == batch
