"""The safety layer: each limit clips and is counted; watchdog and e-stop command the safe action."""

import numpy as np
import pytest

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec
from embodied.robots.safety import SafetyConfig, SafetyLayer, WorkspaceConfig

SPEC = EnvSpec(state_dim=3, action_dim=4, action_low=(-1.0,) * 4, action_high=(1.0,) * 4, control_hz=20.0)


def test_actions_outside_the_bounds_are_clipped_and_counted():
    safety = SafetyLayer(SafetyConfig(action_low=[-0.5], action_high=[0.5]), SPEC)
    sent, stop = safety.filter(np.array([0.9, -2.0, 0.1, 0.0]), previous=None)
    assert stop is None
    np.testing.assert_allclose(sent, [0.5, -0.5, 0.1, 0.0])
    assert safety.counts["bounds"] == 1
    safety.filter(np.array([0.1, 0.1, 0.1, 0.1]), previous=None)
    assert safety.counts["bounds"] == 1  # an action inside the bounds is not an intervention


def test_the_change_per_step_is_limited_per_dimension():
    safety = SafetyLayer(SafetyConfig(max_delta=[0.1, 0.1, 0.5, 0.5]), SPEC)
    previous = np.zeros(4)
    sent, _ = safety.filter(np.array([0.8, -0.05, -0.8, 0.2]), previous)
    np.testing.assert_allclose(sent, [0.1, -0.05, -0.5, 0.2], atol=1e-6)
    assert safety.counts["max_delta"] == 1


def test_workspace_ee_delta_keeps_the_next_position_inside_the_box():
    box = WorkspaceConfig(low=[0.0, -0.2, 0.0], high=[0.5, 0.2, 0.4], action_scale=0.1)
    safety = SafetyLayer(SafetyConfig(workspace=box), SPEC)
    position = np.array([0.45, 0.0, 0.2])
    sent, stop = safety.filter(np.array([1.0, 0.5, 0.0, 1.0]), None, position)
    assert stop is None
    np.testing.assert_allclose(sent[:3], [0.5, 0.5, 0.0], atol=1e-6)  # x may move only 0.05 m = 0.5 units
    assert sent[3] == 1.0  # the gripper is not a position dimension
    assert safety.counts["workspace"] == 1
    outside = np.array([0.6, 0.0, 0.2])  # already past the box: only motion back toward it passes
    sent, _ = safety.filter(np.array([0.3, 0.0, 0.0, 0.0]), None, outside)
    assert sent[0] == 0.0
    sent, _ = safety.filter(np.array([-0.3, 0.0, 0.0, 0.0]), None, outside)
    assert sent[0] == pytest.approx(-0.3)


def test_workspace_stop_mode_asks_for_the_safe_action_outside_the_box():
    box = WorkspaceConfig(low=[0.0, -0.2, 0.0], high=[0.5, 0.2, 0.4], mode="stop")
    safety = SafetyLayer(SafetyConfig(workspace=box), SPEC)
    _, stop = safety.filter(np.zeros(4), None, np.array([0.1, 0.0, 0.1]))
    assert stop is None
    sent, stop = safety.filter(np.zeros(4), None, np.array([0.1, 0.0, 0.9]))
    assert sent is None and stop == "workspace" and safety.counts["workspace"] == 1


def test_a_workspace_without_a_reported_position_is_an_error():
    safety = SafetyLayer(SafetyConfig(workspace=WorkspaceConfig(low=[0, 0, 0], high=[1, 1, 1])), SPEC)
    with pytest.raises(ConfigError, match="end-effector position"):
        safety.filter(np.zeros(4), None, None)


def test_watchdog_expires_after_its_period_and_commands_the_safe_action():
    safety = SafetyLayer(SafetyConfig(watchdog_s=0.2, safe_action="hold"), SPEC)
    safety.action_arrived(100.0)
    assert not safety.watchdog_expired(100.19)
    assert safety.watchdog_expired(100.21)
    hold = np.array([0.0, 0.0, 0.0, 0.7], dtype=np.float32)
    np.testing.assert_array_equal(safety.safe_action(hold, "watchdog"), hold)
    assert safety.counts["watchdog"] == 1
    zero = SafetyLayer(SafetyConfig(safe_action="zero"), SPEC)
    np.testing.assert_array_equal(zero.safe_action(hold, "watchdog"), np.zeros(4))


def test_estop_latches_until_reset():
    safety = SafetyLayer(SafetyConfig(), SPEC)
    safety.estop("key")
    assert safety.estopped and safety.estop_reason == "key"
    safety.estop("SIGUSR1")
    assert safety.estopped
    safety.reset_estop()
    assert not safety.estopped


def test_bad_safety_configs_fail_with_the_key_named():
    with pytest.raises(ConfigError, match="safe_action"):
        SafetyLayer(SafetyConfig(safe_action="freeze"), SPEC)
    with pytest.raises(ConfigError, match="max_delta"):
        SafetyLayer(SafetyConfig(max_delta=[0.1, 0.1]), SPEC)
    with pytest.raises(ConfigError, match="workspace"):
        SafetyLayer(SafetyConfig(workspace=WorkspaceConfig(low=[0, 0], high=[1, 1])), SPEC)
    with pytest.raises(ConfigError, match="watchdog_s"):
        SafetyLayer(SafetyConfig(watchdog_s=0), SPEC)


def test_disabled_safety_passes_actions_through_uncounted():
    safety = SafetyLayer(SafetyConfig(enabled=False), SPEC)
    sent, _ = safety.filter(np.array([5.0, 0, 0, 0]), None)
    assert sent[0] == 5.0 and sum(safety.counts.values()) == 0


@pytest.mark.parametrize("enabled", [True, False])
def test_nan_or_infinite_actions_are_replaced_by_the_safe_action(enabled):
    safety = SafetyLayer(SafetyConfig(enabled=enabled), SPEC)
    sent, stop = safety.filter(np.array([np.nan, 0, np.inf, 0]), previous=np.zeros(4))
    assert sent is None and stop == "non_finite" and safety.counts["non_finite"] == 1


def test_the_box_output_stays_within_the_bounds():
    box = WorkspaceConfig(low=[0.0, -0.2, 0.0], high=[0.5, 0.2, 0.4], action_scale=0.1)
    safety = SafetyLayer(SafetyConfig(workspace=box, action_low=[0.5, -1, -1, -1], action_high=[1, 1, 1, 1]), SPEC)
    sent, _ = safety.filter(np.array([1.0, 0, 0, 0]), None, np.array([0.49, 0.0, 0.2]))
    assert sent[0] == 0.5  # the box asked for 0.1, the bounds for at least 0.5: the bounds hold


def test_zero_cannot_be_the_safe_action_when_it_is_out_of_bounds():
    spec = EnvSpec(state_dim=1, action_dim=1, action_low=(0.2,), action_high=(1.0,))
    with pytest.raises(ConfigError, match="zero is outside the action bounds"):
        SafetyLayer(SafetyConfig(safe_action="zero"), spec)
