"""The operator-facing tools: the `maas` command (cli.py) and what it runs
besides the services — the local stack (`maas up`), bench, top, admin, peers,
distill and eval. Imported as `maas_tools` (pyproject's package-dir mapping);
nothing under services/ imports from here.
"""
