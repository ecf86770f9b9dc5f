"""A request cancelled while its admission call is in flight gives back what
the call took: the script may have run on Redis with its reply never read
(a client gone while queued at the limiter, or a cancelled gRPC call)."""

import asyncio
import uuid

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import Tenant


class HeldReplies:
    """A TCP relay to Redis that passes commands on but holds Redis's replies
    while `held`: the moment after a script ran and before its caller heard."""

    def __init__(self, host: str, port: int):
        self._target = (host, port)
        self.held = False
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"

    async def _serve(self, client_r, client_w) -> None:
        redis_r, redis_w = await asyncio.open_connection(*self._target)

        async def pipe(reader, writer, holds: bool) -> None:
            try:
                while data := await reader.read(65536):
                    if holds and self.held:
                        continue  # lost, as a reply to a cancelled call is
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        await asyncio.gather(pipe(client_r, redis_w, False), pipe(redis_r, client_w, True))

    async def stop(self) -> None:
        self._server.close()


async def test_a_cancel_during_the_admission_call_gives_the_lease_back(make_cluster, redis_url):
    host, port = redis_url.removeprefix("redis://").split("/")[0].split(":")
    relay = HeldReplies(host, int(port))
    cluster = await make_cluster(replicas=1, via_redis=await relay.start())
    direct = open_redis(redis_url)
    who = Tenant(name=f"cancel-{uuid.uuid4().hex[:8]}", max_concurrency=1)
    leases = f"maas:rl:{{{who.name}}}:inflight"
    try:
        # Scripts loaded (a held NOSCRIPT reply would stop the script running at
        # all) and the tenant's quota read: the next call to lose its reply is the
        # admission's.
        assert await cluster.run(who)
        await cluster.pipeline.background.wait()
        relay.held = True
        request = asyncio.create_task(cluster.complete(who))
        # The admission script has run (the lease is taken); its reply is held.
        async with asyncio.timeout(30):
            while await direct.zcard(leases) == 0:
                await asyncio.sleep(0.01)
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        relay.held = False
        await cluster.pipeline.background.wait()
        assert await direct.zcard(leases) == 0
    finally:
        await direct.aclose()
        await relay.stop()
