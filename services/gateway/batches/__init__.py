"""/v1/files and /v1/batches: uploaded JSONL, batches run in idle capacity (docs/batches.md)."""
