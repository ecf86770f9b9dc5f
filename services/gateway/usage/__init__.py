"""After a request: its usage event to the Redis stream (spooled while Redis is down), usage API."""
