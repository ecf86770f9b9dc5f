"""Which of `maas up`'s unrecognised flags go on to the engines.

`maas up` passes every flag it does not know itself to every engine (`maas up
--dtype float32`). A flag no engine knows either would only fail once the stack
is starting, in each engine's log, so it is refused at once instead, with the
nearest flag of either parser as the hint. The engine's flags are read from the
parser pydantic-settings builds for `maas serve engine`, so the two cannot drift.
"""

import argparse
import difflib
import re

from pydantic_settings import CliSettingsSource

from maas_services.engine.settings import EngineSettings

# A flag: "--name", "--name=value" or "-x"; not a negative number passed as a value.
FLAG = re.compile(r"^(--?[A-Za-z][\w.-]*)")


def options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string a parser accepts."""
    return {option for action in parser._actions for option in action.option_strings}


def refused_flag(argv: list[str], up_parser: argparse.ArgumentParser) -> str | None:
    """The error for the first flag in argv (what up_parser left) that no engine knows,
    or None when every one passes on."""
    known = options(CliSettingsSource(EngineSettings).root_parser)
    for token in argv:
        match = FLAG.match(token)
        if match is None or match.group(1) in known:
            continue
        flag = match.group(1)
        hint = difflib.get_close_matches(flag, sorted(known | options(up_parser)), n=1)
        if hint:
            return f"unknown flag {flag}; did you mean {hint[0]}?"
        return f"unknown flag {flag}; see maas up --help and maas serve engine --help"
    return None
