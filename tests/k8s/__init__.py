"""A one-node Kubernetes for the suite (tests/k8s/cluster.py); see its docstring."""
