"""The `maas` command line itself: help on every command, --version, and `maas up`
refusing a flag no engine knows while passing on the ones engines do."""

import importlib.metadata
import re

import pytest

import maas_tools.local.up
from maas_tools.cli import main as maas

# The positional choices a help page lists: its subcommands (or services, or tools).
SUBCOMMANDS = re.compile(r"^positional arguments:\n\s+\{([\w,-]+)\}", re.MULTILINE)


def help_page(capsys, *command: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        maas([*command, "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0, f"maas {' '.join(command)} --help"
    return out


def subcommands(page: str) -> list[str]:
    found = SUBCOMMANDS.search(page)
    return found.group(1).split(",") if found else []


def test_every_command_and_subcommand_prints_its_help(capsys):
    commands = subcommands(help_page(capsys))
    assert {"serve", "up", "operator", "tenants", "keys", "billing"} <= set(commands)
    checked = []
    for command in commands:
        page = help_page(capsys, command)
        assert page.startswith(f"usage: maas {command}"), page
        for subcommand in subcommands(page):
            page = help_page(capsys, command, subcommand)
            assert page.startswith(f"usage: maas {command} {subcommand}"), page
            checked.append(f"{command} {subcommand}")
    # Every service's own settings page, reached through `maas serve SERVICE --help`.
    assert {f"serve {s}" for s in ("gateway", "engine", "billing", "operator")} <= set(checked)
    assert {"operator simulate", "keys list", "tenants create", "billing usage"} <= set(checked)


def test_serve_and_operator_without_a_choice_still_say_what_is_missing(capsys):
    for command in ("serve", "operator"):
        with pytest.raises(SystemExit) as exit_info:
            maas([command])
        assert exit_info.value.code == 2
        assert "required" in capsys.readouterr().err


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as exit_info:
        maas(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"maas {importlib.metadata.version('maas')}\n"


@pytest.fixture
def started(monkeypatch):
    """What `maas up` would start the stack with, without starting it."""
    configs = []

    def up(config, model_id):
        configs.append(config)
        return 0

    monkeypatch.setattr(maas_tools.local.up, "up", up)
    return configs


def test_up_passes_engine_flags_to_every_engine(started):
    flags = ["--dtype", "float32", "--no-enforce-eager", "--max-num-seqs=4", "--cache-salt", "-1"]
    with pytest.raises(SystemExit) as exit_info:
        maas(["up", "--engine-replicas", "2", *flags])
    assert exit_info.value.code == 0
    assert started[0].engine_args == flags
    assert started[0].engine_replicas == 2


@pytest.mark.parametrize(
    ("typo", "hint"),
    [
        ("--dtyp", "--dtype"),  # an engine's flag
        ("--max-num-seq=4", "--max-num-seqs"),  # with its value attached
        ("--engine-backends", "--engine-backend"),  # maas up's own
        ("--routing-polcy", "--routing-policy"),
    ],
)
def test_up_refuses_a_misspelled_flag_with_the_nearest_one(started, capsys, typo, hint):
    with pytest.raises(SystemExit) as exit_info:
        maas(["up", "--dtype", "float32", typo, "x"])
    assert exit_info.value.code == 2
    flag = typo.split("=")[0]
    assert f"maas up: error: unknown flag {flag}; did you mean {hint}?" in capsys.readouterr().err
    assert started == []


def test_up_refuses_a_flag_like_nothing_known(started, capsys):
    with pytest.raises(SystemExit) as exit_info:
        maas(["up", "--zzzzzz"])
    assert exit_info.value.code == 2
    assert "unknown flag --zzzzzz; see maas up --help" in capsys.readouterr().err
    assert started == []
