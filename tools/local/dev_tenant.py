"""The `dev` tenant and its key for local mode, kept in .maas/dev-api-key.

A key from an earlier run is reused while it still authenticates (Redis keeps
its data across runs); otherwise a fresh key is issued and written, readable by
its owner only from the moment the file exists (maas_tools.local.private_file).
"""

import contextlib
from pathlib import Path

from maas_services.gateway.admission.tenants import TenantExistsError, TenantStore
from maas_tools.local.private_file import write_private

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
    write_private(key_path, key + "\n")
    return key
