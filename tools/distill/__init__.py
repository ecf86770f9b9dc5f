"""`maas distill-draft`: train a small draft model from the target, on CPU, in minutes."""
