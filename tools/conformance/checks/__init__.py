"""One module per group of checks; each registers its checks with registry.check."""
