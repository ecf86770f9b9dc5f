"""The routing policy and scorer names a deployment may choose, in one list.

The router implements them (services/router/policies.py, registry.py); the
ModelDeployment CRD offers them as its enum and weight keys. Naming them here
lets the operator validate a spec without importing the router's plugins.
"""

ROUTING_POLICIES = ("round_robin", "least_load", "prefix_affinity")
DEFAULT_ROUTING_POLICY = "prefix_affinity"
# The scorers a policy's weights may name.
SCORER_NAMES = ("prefix", "adapter", "queue", "kv_cache", "session", "requests")
