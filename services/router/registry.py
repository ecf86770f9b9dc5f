"""Plugin names, as policies and configured weights use them, and how to build each."""

from collections.abc import Callable

from maas_services.router.filters.adapter import AdapterFilter
from maas_services.router.filters.available import AvailableFilter
from maas_services.router.filters.overload import OverloadFilter
from maas_services.router.pickers.max_score import MaxScorePicker
from maas_services.router.pickers.round_robin import RoundRobinPicker
from maas_services.router.plugin import Filter, Picker, PluginDeps, Scorer
from maas_services.router.scorers.adapter import AdapterScorer
from maas_services.router.scorers.kv_cache import KvCacheScorer
from maas_services.router.scorers.least_requests import LeastRequestsScorer
from maas_services.router.scorers.prefix import PrefixScorer
from maas_services.router.scorers.queue import QueueScorer
from maas_services.router.scorers.session import SessionScorer

FILTERS: dict[str, Callable[[PluginDeps], Filter]] = {
    "available": lambda deps: AvailableFilter(),
    "adapter": lambda deps: AdapterFilter(),
    "overload": lambda deps: OverloadFilter(deps.settings.overload_margin),
}
SCORERS: dict[str, Callable[[PluginDeps], Scorer]] = {
    "prefix": lambda deps: PrefixScorer(deps.index, deps.history),
    "adapter": lambda deps: AdapterScorer(),
    "queue": lambda deps: QueueScorer(),
    "kv_cache": lambda deps: KvCacheScorer(),
    "session": lambda deps: SessionScorer(),
    "requests": lambda deps: LeastRequestsScorer(),
}
PICKERS: dict[str, Callable[[PluginDeps], Picker]] = {
    "max_score": lambda deps: MaxScorePicker(),
    "round_robin": lambda deps: RoundRobinPicker(),
}
