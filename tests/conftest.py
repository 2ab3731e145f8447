"""Shared test configuration for the cross-package tests."""

# pytester: the conformance suite is itself tested against broken backends
# (tests/conformance/test_suite_can_fail.py).
# k8s_cluster: a real Kubernetes control plane for tests/cluster (built from Go modules).
pytest_plugins = ["pytester", "rollbox_kubernetes.testing.fixtures"]
