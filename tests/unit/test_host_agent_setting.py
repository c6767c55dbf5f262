"""``mdata.trainer.host-agent``: true and false as set; ``auto`` on at scale, where one Dask
client per trainer process is what the scheduler can no longer afford (docs/deploying.md)."""

from __future__ import annotations

import pytest

from mdata import config
from mdata.errors import TrainerError
from mdata.trainer.environment import AUTO_AGENT_WORLD, wants_host_agent


def test_the_default_is_auto():
    assert config.get("trainer.host-agent") == "auto"


@pytest.mark.parametrize("env, on", [
    ({}, False),  # not under torchrun: a single process has nobody to share a client with
    ({"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "64"}, False),  # small: the scheduler has time
    ({"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": str(AUTO_AGENT_WORLD)}, True),
    ({"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16384"}, True),
    ({"LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "16384"}, False),  # one process per host: no peers
    ({"LOCAL_WORLD_SIZE": "eight", "WORLD_SIZE": "16384"}, False),
])
def test_auto_is_on_for_a_process_with_local_peers_in_a_large_world(env, on):
    assert wants_host_agent("auto", env) is on
    assert wants_host_agent(" AUTO ", env) is on


@pytest.mark.parametrize("setting, on", [(True, True), (False, False), ("true", True),
                                         ("off", False), ("0", False), (None, False)])
def test_true_and_false_are_taken_as_set_whatever_the_world(setting, on):
    assert wants_host_agent(setting, {"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16384"}) is on
    assert wants_host_agent(setting, {}) is on


def test_another_setting_names_the_choices():
    with pytest.raises(TrainerError, match="true, false or auto, got 'sometimes'"):
        wants_host_agent("sometimes", {})
