"""The chart's alert rules pass Prometheus's own checker, `promtool check rules`.

The other alert tests read the rules' metric names; this one holds the whole
file to what a Prometheus server would load: PromQL that parses, durations,
labels and annotations that template. promtool comes with Debian's
`prometheus` package, which `.ci/run` installs; MAAS_REQUIRE_PROMTOOL=1 (set
there) makes its absence a failure rather than a skip.
"""

import os
import shutil
import subprocess

import pytest
import yaml

from tests.k8s.test_chart import helm, render_set  # noqa: F401 (helm is a fixture)

PROMTOOL = shutil.which("promtool")


@pytest.mark.parametrize(
    "values",
    [(), ("prometheusRule.billingLagSeconds=60", "prometheusRule.billingLagFor=2m")],
    ids=["defaults", "tuned"],
)
def test_the_charts_alert_rules_pass_promtool(helm, tmp_path, values):  # noqa: F811
    if PROMTOOL is None:
        if os.environ.get("MAAS_REQUIRE_PROMTOOL") == "1":
            pytest.fail(
                "promtool is required (MAAS_REQUIRE_PROMTOOL=1): apt-get install prometheus"
            )
        pytest.skip("no promtool here (Debian: apt-get install prometheus)")
    docs = render_set(helm, "prometheusRule.enabled=true", *values)
    (rules,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rules["spec"]["groups"]}))
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout
