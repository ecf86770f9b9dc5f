"""The suite against a fake server: clean, it passes; each known defect, it catches.

Every case runs the whole suite, so "caught" means exactly the checks that
defect breaks fail and every other check still passes.
"""

import json

import pytest

from maas_tools.conformance.main import main
from tests.unit.conformance.fake_server import LIMITED_KEY, RUNNING_METRIC, Defects, serve

NOT_OFFERED = {
    "endpoints.responses",
    "endpoints.embeddings",
    "endpoints.embeddings_base64",
    "endpoints.batches",
}
ERRORS = {
    "errors.missing_model",
    "errors.unknown_model",
    "errors.bad_type",
    "errors.temperature_range",
    "errors.max_tokens_over_context",
    "errors.malformed_json",
}


def run_suite(defects: Defects, tmp_path) -> tuple[int, dict[str, dict]]:
    report = tmp_path / "report.json"
    with serve(defects) as base_url:
        code = main(
            [
                base_url,
                "--key",
                "k",
                "--format",
                "json",
                "--output",
                str(report),
                "--metrics-url",
                base_url.removesuffix("/v1") + "/metrics",
                "--running-metric",
                RUNNING_METRIC,
                "--rate-limit-probe",
                "12",
                "--rate-limit-key",
                LIMITED_KEY,
            ]
        )
    checks = json.loads(report.read_text())["checks"]
    return code, {c["id"]: c for c in checks}


def by_outcome(checks: dict[str, dict], outcome: str) -> set[str]:
    return {name for name, c in checks.items() if c["outcome"] == outcome}


def test_a_server_without_defects_passes_every_check_it_offers(tmp_path):
    code, checks = run_suite(Defects(), tmp_path)
    assert by_outcome(checks, "fail") == set(), checks
    assert by_outcome(checks, "not offered") == NOT_OFFERED
    assert code == 0
    assert checks["rate_limit.retry_after"]["detail"].startswith("429 after")


@pytest.mark.parametrize(
    ("defect", "caught"),
    [
        ("usage_unasked", {"streaming.usage_chunk"}),
        ("double_finish", {"streaming.chunk_shape", "parallel.streamed_indices"}),
        ("n_indices_wrong", {"parallel.streamed_indices"}),
        ("no_top_logprobs", {"logprobs.chat_logprobs"}),
        ("tool_args_not_json", {"tool_calls.streamed"}),
        ("json_schema_ignored", {"response_format.json_schema"}),
        ("error_envelope", ERRORS | {"models.retrieve"}),
        (
            "usage_off_by_one",
            {"usage.completion_tokens", "usage.stream_agrees", "logprobs.chat_logprobs"},
        ),
        ("no_retry_after", {"rate_limit.retry_after"}),
        ("keeps_generating", {"disconnect.stops_generation"}),
        ("no_model_retrieve", {"models.retrieve"}),
        # The next check gets a new connection: the crash is charged to its cause only.
        ("crash_on_bad_json", {"errors.malformed_json"}),
    ],
)
def test_each_known_defect_fails_its_checks_and_only_those(defect, caught, tmp_path):
    code, checks = run_suite(Defects(**{defect: True}), tmp_path)
    assert by_outcome(checks, "fail") == caught, {
        k: checks[k]["detail"] for k in by_outcome(checks, "fail")
    }
    assert by_outcome(checks, "not offered") == NOT_OFFERED
    assert code == 1
