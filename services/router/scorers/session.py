"""Session affinity: one replica per session id (x-session-id header or `user`).

The replica is the session's rendezvous-hash winner among the candidates, not
a remembered past pick: every router replica agrees with no shared state, a
restarted router keeps the mapping, and a replica leaving moves only its own
sessions. Scored 1 for that replica, 0 for the rest; no session, no preference.
"""

from maas_services.router import rendezvous
from maas_services.router.endpoints import Endpoint
from maas_services.router.plugin import PickContext


class SessionScorer:
    def score(self, ctx: PickContext, endpoints: list[Endpoint]) -> list[float]:
        if not ctx.session_id or not endpoints:
            return [0.0] * len(endpoints)
        key = ctx.session_id.encode()
        home = max(endpoints, key=lambda e: rendezvous.weight(key, e.endpoint_id))
        return [1.0 if e is home else 0.0 for e in endpoints]
