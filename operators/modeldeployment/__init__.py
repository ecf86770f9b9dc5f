"""The ModelDeployment operator: CRD, autoscaling policy and kopf handlers.

Pure modules (crd_schema, defaults, spec, policy, drain, resources, simulate)
import neither kopf nor kubernetes, so the policy can be tested and simulated
without a cluster; handlers and main wire them to kopf.
"""
