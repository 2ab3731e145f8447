"""The test cluster's pod addresses come back as host-local IPAM's do: last."""

from __future__ import annotations

import pytest
from rollbox_kubernetes.testing.nodeagent import IpPool


def test_a_freed_pod_ip_is_the_last_to_come_back() -> None:
    pool = IpPool("127.66.0.0/29")  # six hosts
    first = pool.take()
    pool.give_back(first)
    taken = [pool.take() for _ in range(6)]
    assert taken[0] != first and taken[-1] == first
    assert len(set(taken)) == 6
    with pytest.raises(RuntimeError, match="no free address"):
        pool.take()


def test_addresses_outside_loopback_are_refused() -> None:
    with pytest.raises(ValueError, match=r"127\.0\.0\.0/8"):
        IpPool("10.0.0.0/24")
