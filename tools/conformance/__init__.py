"""`maas conformance`: hold any OpenAI-compatible server to the API's contract.

A client only: it speaks to BASE_URL (ending in /v1, as the openai SDK takes
it) over plain HTTP and reads the raw shapes, so a server is judged by what it
sends, not by what an SDK would forgive. Each check reports pass, fail (with
why) or not offered (the server does not serve that part of the API). The
checks live one group per module under checks/, listed in registry.py.
"""
