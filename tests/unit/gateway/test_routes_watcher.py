import asyncio

from maas_services.gateway.routing.routes_watcher import RoutesWatcher

ALIAS = "models:\n  small:\n    routes: [{deployment: %s}]\n"


async def test_the_table_follows_its_file(tmp_path):
    path = tmp_path / "routes.yaml"
    watcher = RoutesWatcher(str(path), interval=0.05)
    assert watcher.table.models == {}  # no file yet: every model as itself
    watcher.start()
    try:
        path.write_text(ALIAS % "a")
        await asyncio.sleep(0.2)
        assert watcher.table.resolve("small", "standard", "", {"a"}).deployment == "a"
        # Kubernetes swaps a ConfigMap's file by renaming a new one into place.
        staged = tmp_path / "staged.yaml"
        staged.write_text(ALIAS % "b")
        staged.replace(path)
        await asyncio.sleep(0.2)
        assert watcher.table.resolve("small", "standard", "", {"b"}).deployment == "b"
    finally:
        await watcher.stop()


def test_a_broken_file_keeps_the_last_good_table(tmp_path):
    path = tmp_path / "routes.yaml"
    path.write_text(ALIAS % "a")
    watcher = RoutesWatcher(str(path))
    path.write_text("models: [unclosed")
    assert not watcher.reload()
    path.write_text("models:\n  small: {routes: []}\n")
    assert not watcher.reload()
    assert watcher.table.resolve("small", "standard", "", {"a"}).deployment == "a"
