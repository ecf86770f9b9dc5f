"""`maas eval`: quality checks of the engine's own model code on text shipped in the repo."""
