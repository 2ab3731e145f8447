"""NeMo Gym finds the provider through its entry point and builds it from its YAML block."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import rollbox_nemo_gym
from nemo_gym.sandbox import (
    ConnectableProvider,
    SupportsSandboxEndpoint,
    SupportsSandboxPauseResume,
    create_provider,
    get_provider_class,
    list_providers,
)
from ng_support import provider_block
from rollbox.errors import UsageError
from rollbox_nemo_gym import RollboxProvider


def test_the_entry_point_names_the_provider() -> None:
    (found,) = [ep for ep in entry_points(group="nemo_gym.sandbox_providers")
                if ep.name == "rollbox"]
    assert found.value == "rollbox_nemo_gym:RollboxProvider"
    assert found.dist is not None and found.dist.name == "rollbox-nemo-gym"
    assert "rollbox" in list_providers()
    assert get_provider_class("rollbox") is RollboxProvider


def test_the_shipped_yaml_block_makes_a_provider() -> None:
    provider = create_provider(provider_block())
    assert isinstance(provider, RollboxProvider)
    assert provider.name == "rollbox"
    assert provider.config.image == "host"
    assert isinstance(provider, ConnectableProvider)
    assert isinstance(provider, SupportsSandboxPauseResume)


def test_the_shipped_remote_yaml_block_makes_a_provider_on_rollbox_serve() -> None:
    provider = create_provider(provider_block(rollbox_nemo_gym.CONFIG_REMOTE))
    assert isinstance(provider, RollboxProvider)
    assert provider.config.backend_name == "remote"
    assert provider.config.shared_pool_options["policy"] == "none"  # the server pools
    assert isinstance(provider, SupportsSandboxEndpoint)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"bogus": 1}, "unknown rollbox provider settings: bogus"),
        ({"pool_options": {"sizee": 2}}, "unknown pool_options sizee"),
        ({"pool_options": {"policy": "nope"}}, "no pool policy named 'nope'"),
        ({"pool_options": {"policy": "static", "policy_options": {"bad": 1}}}, "does not take"),
        ({"shell": "zsh"}, "shell must be one of"),
        ({"network": "internet"}, "network must be one of"),
        ({"keep_warm_s": -1}, "keep_warm_s must be positive"),
        ({"default_timeout_s": 0}, "default_timeout_s must be positive"),
        ({"resources": {"gpu": 1}}, "resources has unknown keys gpu"),
        ({"image_rewrites": [{"from": "a"}]}, "image_rewrites entry"),
    ],
)
def test_a_bad_setting_fails_when_the_provider_is_made(settings: dict[str, object],
                                                       says: str) -> None:
    with pytest.raises(UsageError, match=says):
        create_provider({"rollbox": settings})
