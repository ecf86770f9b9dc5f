"""Which deployment serves a model name: routing table, its hot reload, running deployments."""
