from pydantic import Field

from services.common.settings import ServiceSettings


class RouterSettings(ServiceSettings):
    engines: list[str] = Field(
        default_factory=list,
        description="static engine endpoints as ID=HOST:PORT or HOST:PORT",
    )
    poll_interval_seconds: float = Field(0.5, gt=0, description="how often engines report load")
