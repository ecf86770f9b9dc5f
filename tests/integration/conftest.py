"""Fixtures the integration suites share: the admin CLI against the session's Redis."""

import json

import pytest

from maas_tools.admin.cli import main


@pytest.fixture
def admin(redis_url, monkeypatch, capsys):
    """run(command, *args) -> (exit code, stdout, stderr) of `maas <command> <args>`."""
    monkeypatch.setenv("MAAS_REDIS_URL", redis_url)

    def run(command: str, *args: str) -> tuple[int, str, str]:
        code = main(command, list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def as_json(result) -> dict | list:
    code, out, err = result
    assert code == 0, err
    return json.loads(out)
