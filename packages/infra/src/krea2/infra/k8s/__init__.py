"""Kubernetes launch for krea2: manifests for training (JobSet + Kueue) and autoscaled
krablet workers, the faulty-node lifecycle, and applying them with the ``k8s`` extra.

Rendering is pure (dicts in, dicts out) and needs no cluster; only
:mod:`krea2.infra.k8s.apply` talks to an API server.
"""
