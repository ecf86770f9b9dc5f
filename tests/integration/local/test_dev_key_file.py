"""The dev key file is its owner's alone from its first byte (real Redis behind the key).

A file written and chmod-ed after is readable in between, and whoever opened it
then keeps reading whatever lands in it: here a reader holds the old file open
while the key is written, and must see nothing of it.
"""

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import TenantStore
from maas_tools.local.dev_tenant import KEY_FILE, ensure_dev_key


async def test_the_key_file_is_born_private(redis_url, tmp_path):
    path = tmp_path / KEY_FILE
    path.write_text("stale-key\n")
    path.chmod(0o644)
    redis = open_redis(redis_url)
    try:
        with open(path) as early_reader:
            key = await ensure_dev_key(TenantStore(redis), tmp_path)
            assert early_reader.read() == "stale-key\n"
        assert await TenantStore(redis).authenticate(key) is not None
    finally:
        await redis.aclose()
    assert path.read_text() == key + "\n"
    assert path.stat().st_mode & 0o777 == 0o600
