"""The `dev` tenant and its key for local mode, kept in .maas/dev-api-key.

A key from an earlier run is reused while it still authenticates (Redis keeps
its data across runs); otherwise a fresh key is issued and written.
"""

import contextlib
from pathlib import Path

from services.gateway.tenants import TenantExistsError, TenantStore

DEV_TENANT = "dev"
KEY_FILE = "dev-api-key"


async def ensure_dev_key(store: TenantStore, state_dir: Path) -> str:
    key_path = state_dir / KEY_FILE
    if key_path.exists():
        key = key_path.read_text().strip()
        if key and await store.authenticate(key) is not None:
            return key
    with contextlib.suppress(TenantExistsError):
        await store.create_tenant(DEV_TENANT, tier="standard")
    _key_id, key = await store.create_key(DEV_TENANT)
    key_path.write_text(key + "\n")
    key_path.chmod(0o600)
    return key
