"""Configuration shared by every service.

Each service declares a pydantic-settings class that extends ``ServiceSettings``.
Values come from, highest first: command-line flags (``--metrics-port 9100``),
environment variables with the ``MAAS_`` prefix (``MAAS_METRICS_PORT=9100``),
then the defaults written here. Flags and env share one schema, so what
``maas serve X --help`` lists is exactly what can be set.
"""

from typing import Literal, TypeVar

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MAAS_",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="ignore",
    )

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(0, ge=0, le=65535, description="main port (0 picks a free one)")
    metrics_port: int = Field(
        0, ge=0, le=65535, description="Prometheus /metrics port (0 picks a free one)"
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    shutdown_grace_seconds: float = Field(
        30.0, gt=0, description="how long in-flight requests may run after SIGTERM"
    )


T = TypeVar("T", bound="ServiceSettings")


def parse_settings(cls: type[T], argv: list[str], prog: str) -> T:
    """Build settings from flags (argv) over env over defaults."""
    return cls(_cli_parse_args=argv, _cli_prog_name=prog)
