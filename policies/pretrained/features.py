"""Which of the env's cameras feeds which image input of a pretrained checkpoint.

A checkpoint was trained on inputs with names of its own: lerobot's LIBERO checkpoints on
`observation.images.image` (the agent view) and `observation.images.image2` (the wrist
camera), openpi's on `base_0_rgb`, `left_wrist_0_rgb` and an empty `right_wrist_0_rgb`. The
order of the cameras in the prompt is part of what the model learned, so it is the
checkpoint's order, never the env's. `policy.features` says how the env's cameras map onto
them (pi0, pi0.5, SmolVLA and OpenVLA alike):
- empty: each input the checkpoint names (lerobot's `config.json` `input_features`) is the
  env camera of the same short name (`observation.images.wrist` <- `wrist`);
- a preset (`PRESETS`), for the published checkpoints' conventions;
- explicit pairs, `<checkpoint input>=<env camera>,...`, `empty` for an input the model
  sees masked, as it was trained where that camera was absent.
This binds where the checkpoint acts as trained (`policy.normalization=checkpoint`); on a
new robot the env's cameras are the inputs (in the mapping's order, else by name), as
lerobot's fine-tuning takes its dataset's features. An input the env cannot provide is
refused with its name, never fed a blank image. Inputs
that are masked (lerobot's `empty_camera_<i>`, or `empty` here) are left out of the prompt:
a masked token is invisible to every other token, so leaving it out computes the same."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec

EMPTY = "empty"
IMAGE_PREFIX = "observation.images."
PRESETS: dict[str, dict[str, str]] = {
    # lerobot's LIBERO env and the HuggingFaceVLA/libero dataset its checkpoints train on
    "libero_lerobot": {"observation.images.image": "agentview", "observation.images.image2": "wrist"},
    # openpi's LiberoInputs: the wrist image on the left wrist slot, the right one masked
    "libero_openpi": {"base_0_rgb": "agentview", "left_wrist_0_rgb": "wrist", "right_wrist_0_rgb": EMPTY},
    # OpenVLA-OFT's LIBERO evaluation: the third-person image, then the wrist image
    "libero_openvla": {"full_image": "agentview", "wrist_image": "wrist"},
}


@dataclass(frozen=True)
class CheckpointInputs:
    """What a checkpoint's config.json says it reads and writes."""

    source: str  # the file, for messages
    cameras: tuple[str, ...]  # its image inputs, in its order
    empty: frozenset[str]  # lerobot's placeholder cameras, always masked
    state_dim: Optional[int]
    action_dim: Optional[int]


def checkpoint_inputs(pretrained: str, saved: dict) -> CheckpointInputs | None:
    """The inputs lerobot's `config.json` (`saved`) records, or None where it records none
    (openpi's layout)."""
    features = saved.get("input_features")
    if not isinstance(features, dict) or not features:
        return None
    folder = Path(pretrained) if Path(pretrained).is_dir() else Path(pretrained).parent
    source = str(folder / "config.json")
    states = [name for name, f in features.items() if f.get("type") == "STATE"]
    if len(states) > 1:
        raise ConfigError(f"{source}: input_features has several state inputs {states}; the env gives one state")
    cameras = [name for name, f in features.items() if f.get("type") == "VISUAL"]
    empty = [f"{IMAGE_PREFIX}empty_camera_{i}" for i in range(int(saved.get("empty_cameras") or 0))]
    cameras += [name for name in empty if name not in cameras]
    action = (saved.get("output_features") or {}).get("action", {})
    return CheckpointInputs(
        source=source,
        cameras=tuple(cameras),
        empty=frozenset(empty),
        state_dim=int(features[states[0]]["shape"][-1]) if states else None,
        action_dim=int(action["shape"][-1]) if action.get("shape") else None,
    )


def parse_features(text: str) -> dict[str, str]:
    """`policy.features`: empty, a preset's name, or `<input>=<camera>,...`."""
    text = text.strip()
    if not text:
        return {}
    if text in PRESETS:
        return dict(PRESETS[text])
    pairs = [part.split("=") for part in text.split(",") if part.strip()]
    if "=" not in text or any(len(pair) != 2 or not all(p.strip() for p in pair) for pair in pairs):
        raise ConfigError(
            f"policy.features must be a preset ({', '.join(sorted(PRESETS))}) or "
            f"<checkpoint input>=<env camera>,... ; got '{text}'"
        )
    return {name.strip(): camera.strip() for name, camera in pairs}


def camera_inputs(inputs: CheckpointInputs | None, mapping: dict[str, str], spec: EnvSpec) -> list[str]:
    """The env cameras to feed the model, in the order of the checkpoint's inputs, masked
    ones left out. Refused, with names, where the env lacks a camera the checkpoint reads,
    where the state or action widths disagree, or where the mapping names what neither has."""
    env_cameras = sorted(spec.image_shapes)
    presets = ", ".join(sorted(PRESETS))
    hint = f"the env has {env_cameras or 'no cameras'}; map them with policy.features (presets: {presets})"
    unknown = sorted(c for c in mapping.values() if c != EMPTY and c not in env_cameras)
    if unknown:
        raise ConfigError(f"policy.features names cameras the env does not have: {unknown}; {hint}")
    if inputs is None:  # nothing recorded: the mapping's order, else the env's
        return [camera for camera in mapping.values() if camera != EMPTY] if mapping else env_cameras
    if inputs.state_dim is not None and inputs.state_dim != spec.state_dim:
        raise ConfigError(
            f"{inputs.source}: input_features' state is {inputs.state_dim} wide; the env's is {spec.state_dim}"
        )
    if inputs.action_dim is not None and inputs.action_dim != spec.action_dim:
        raise ConfigError(
            f"{inputs.source}: output_features' action is {inputs.action_dim} wide; the env's is {spec.action_dim}"
        )
    stray = sorted(set(mapping) - set(inputs.cameras))
    if stray:
        raise ConfigError(
            f"policy.features maps {stray}, which {inputs.source} does not read; "
            f"its image inputs: {list(inputs.cameras)}"
        )
    chosen, missing = [], []
    for name in inputs.cameras:
        camera = mapping.get(name, EMPTY if name in inputs.empty else name.removeprefix(IMAGE_PREFIX))
        if camera == EMPTY:
            continue
        if camera not in env_cameras:
            missing.append(name)
        chosen.append(camera)
    if missing:
        raise ConfigError(f"{inputs.source}: input_features reads {missing}, which the env does not provide; {hint}")
    if not chosen:
        raise ConfigError(f"{inputs.source}: every image input is masked; the model needs at least one camera")
    return chosen
