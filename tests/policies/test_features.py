"""A checkpoint's image inputs fed from the env's cameras, in the checkpoint's order, by
name, preset or explicit pairs; whatever cannot be fed is refused by name."""

import json

import pytest

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec
from embodied.policies.pretrained.features import PRESETS, camera_inputs, checkpoint_inputs, parse_features

LIBERO = EnvSpec(
    state_dim=8,
    action_dim=7,
    action_low=(-1.0,) * 7,
    action_high=(1.0,) * 7,
    image_shapes={"agentview": (128, 128, 3), "wrist": (128, 128, 3)},
)


def saved_config(tmp_path, cameras, state=8, action=7, empty_cameras=0) -> tuple[str, dict]:
    """A lerobot config.json with these inputs, in this order, as its save_pretrained writes it."""
    features = {name: {"type": "VISUAL", "shape": [3, 256, 256]} for name in cameras}
    features["observation.state"] = {"type": "STATE", "shape": [state]}
    saved = {
        "type": "pi05",
        "input_features": features,
        "output_features": {"action": {"type": "ACTION", "shape": [action]}},
        "empty_cameras": empty_cameras,
    }
    (tmp_path / "config.json").write_text(json.dumps(saved))
    return str(tmp_path), saved


def test_the_published_lerobot_libero_inputs_take_the_agent_view_then_the_wrist(tmp_path):
    inputs = checkpoint_inputs(*saved_config(tmp_path, ["observation.images.image", "observation.images.image2"]))
    assert camera_inputs(inputs, parse_features("libero_lerobot"), LIBERO) == ["agentview", "wrist"]


def test_the_checkpoints_order_wins_over_the_envs(tmp_path):
    inputs = checkpoint_inputs(*saved_config(tmp_path, ["observation.images.wrist", "observation.images.agentview"]))
    assert camera_inputs(inputs, {}, LIBERO) == ["wrist", "agentview"]  # by short name, the checkpoint's order
    swapped = parse_features("observation.images.wrist=agentview,observation.images.agentview=wrist")
    assert camera_inputs(inputs, swapped, LIBERO) == ["agentview", "wrist"]


def test_masked_inputs_are_left_out(tmp_path):
    inputs = checkpoint_inputs(*saved_config(tmp_path, ["observation.images.image"], empty_cameras=2))
    assert inputs.cameras[1:] == ("observation.images.empty_camera_0", "observation.images.empty_camera_1")
    assert camera_inputs(inputs, {"observation.images.image": "wrist"}, LIBERO) == ["wrist"]
    # openpi's layout records no inputs: the preset's order, its right wrist masked
    assert camera_inputs(None, parse_features("libero_openpi"), LIBERO) == ["agentview", "wrist"]
    assert PRESETS["libero_openpi"]["right_wrist_0_rgb"] == "empty"
    assert camera_inputs(None, {}, LIBERO) == ["agentview", "wrist"]  # nothing recorded or asked: the env's


def test_what_the_env_cannot_feed_is_refused_by_name(tmp_path):
    inputs = checkpoint_inputs(*saved_config(tmp_path, ["observation.images.image", "observation.images.image2"]))
    config_json = str(tmp_path / "config.json")
    with pytest.raises(ConfigError, match=r"reads \['observation.images.image', 'observation.images.image2'\]") as e:
        camera_inputs(inputs, {}, LIBERO)
    assert config_json in str(e.value) and "libero_lerobot" in str(e.value) and "agentview" in str(e.value)
    with pytest.raises(ConfigError, match=r"reads \['observation.images.image2'\]"):
        camera_inputs(inputs, {"observation.images.image": "agentview"}, LIBERO)
    with pytest.raises(ConfigError, match=r"cameras the env does not have: \['front'\]"):
        camera_inputs(inputs, {"observation.images.image": "front"}, LIBERO)
    with pytest.raises(ConfigError, match=r"maps \['observation.images.top'\], which .*config.json does not read"):
        camera_inputs(inputs, {"observation.images.top": "wrist"}, LIBERO)
    with pytest.raises(ConfigError, match="every image input is masked"):
        camera_inputs(inputs, {name: "empty" for name in inputs.cameras}, LIBERO)


def test_state_and_action_widths_must_be_the_checkpoints(tmp_path):
    cameras = ["observation.images.agentview"]
    with pytest.raises(ConfigError, match=r"config.json: input_features' state is 9 wide; the env's is 8"):
        camera_inputs(checkpoint_inputs(*saved_config(tmp_path, cameras, state=9)), {}, LIBERO)
    with pytest.raises(ConfigError, match=r"output_features' action is 6 wide; the env's is 7"):
        camera_inputs(checkpoint_inputs(*saved_config(tmp_path, cameras, action=6)), {}, LIBERO)
    features = {
        "observation.state": {"type": "STATE", "shape": [3]},
        "observation.environment_state": {"type": "STATE"},
    }
    with pytest.raises(ConfigError, match="several state inputs"):
        checkpoint_inputs(str(tmp_path), {"input_features": features})


@pytest.mark.parametrize("text", ["libero", "a=b,c", "=wrist", "a=b=c"])
def test_a_malformed_mapping_is_refused_with_the_presets(text):
    with pytest.raises(ConfigError, match="libero_lerobot, libero_openpi"):
        parse_features(text)
