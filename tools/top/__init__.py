"""`maas top`: a live terminal view of a running stack, read from its /metrics and the router."""
