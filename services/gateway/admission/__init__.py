"""Before a request is admitted: keys, tenants, bytes held, RPM/TPM/concurrency, balance, slots."""
