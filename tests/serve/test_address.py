"""Server addresses: what ``--listen`` and ``url=`` mean."""

from __future__ import annotations

from rollbox_remote.address import Address


def test_port_zero_stays_zero_so_a_server_picks_a_free_port() -> None:
    # It used to become 80: as root, every "127.0.0.1:0" server then fought for port 80.
    assert Address.parse("127.0.0.1:0").port == 0
    assert Address.parse("https://127.0.0.1:0").port == 0


def test_a_missing_port_is_the_schemes() -> None:
    assert Address.parse("http://rollbox.example").port == 80
    assert Address.parse("https://rollbox.example").port == 443
    assert Address.parse("127.0.0.1:8750").port == 8750
