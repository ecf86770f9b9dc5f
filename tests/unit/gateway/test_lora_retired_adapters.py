"""A private adapter the routing table stops listing, while engines still report it, is
no one's: not shared with every tenant as a flag-loaded adapter is. Listed again, it
takes its new table's visibility."""

from maas_services.gateway.routing.routes_watcher import RoutesWatcher

BASE = "base"
RUNNING = {BASE}
# What the router reports: the engines still hold both adapters.
REPORTED = {"secret": BASE, "flagged": BASE}


def table(adapters: str) -> str:
    return f"deployments:\n  {BASE}: {{}}\nadapters:\n{adapters or '  {}'}\n"


PRIVATE = f"  secret: {{deployment: {BASE}, source: /a/secret, tenants: [acme]}}\n"
PUBLIC = f"  secret: {{deployment: {BASE}, source: /a/secret}}\n"


def visible(watcher: RoutesWatcher, tenant: str) -> dict[str, str]:
    return watcher.table.adapter_names(RUNNING, "standard", tenant, REPORTED)


def resolves(watcher: RoutesWatcher, tenant: str) -> bool:
    return watcher.table.resolve("secret", "standard", "", RUNNING, tenant, REPORTED) is not None


def test_a_removed_private_adapter_is_shared_with_no_one(tmp_path):
    path = tmp_path / "routes.yaml"
    path.write_text(table(PRIVATE))
    watcher = RoutesWatcher(str(path))
    assert visible(watcher, "acme") == {"secret": BASE, "flagged": BASE}
    assert visible(watcher, "other") == {"flagged": BASE}
    path.write_text(table(""))
    assert watcher.reload()
    for tenant in ("acme", "other"):
        assert visible(watcher, tenant) == {"flagged": BASE}
        assert not resolves(watcher, tenant)
    # Remembered across later tables, not only the next one.
    path.write_text(table("") + "expose_deployments: false\n")
    assert watcher.reload()
    assert not resolves(watcher, "other")
    # Listed again, public this time: every tenant's.
    path.write_text(table(PUBLIC))
    assert watcher.reload()
    assert resolves(watcher, "other") and resolves(watcher, "acme")


def test_an_operator_fragment_removed_retires_its_private_adapters(tmp_path):
    watcher = RoutesWatcher("")
    watcher.apply_configmap({"acme-lora": table(PRIVATE)})
    assert resolves(watcher, "acme") and not resolves(watcher, "other")
    # The ModelDeployment is deleted: its fragment goes, the engines still report it.
    watcher.apply_configmap({})
    assert not resolves(watcher, "acme") and not resolves(watcher, "other")
    assert visible(watcher, "other") == {"flagged": BASE}


def test_a_public_adapter_removed_is_shared_as_any_reported_adapter(tmp_path):
    path = tmp_path / "routes.yaml"
    path.write_text(table(PUBLIC))
    watcher = RoutesWatcher(str(path))
    path.write_text(table(""))
    assert watcher.reload()
    assert resolves(watcher, "other")
