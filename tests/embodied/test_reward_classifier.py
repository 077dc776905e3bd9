"""The success classifier: trained from a real LeRobotDataset, used as a real env's reward."""

import numpy as np
import pytest
import torch

from embodied.cli import main
from embodied.config import RewardConfig
from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec
from embodied.reward_classifier import frame_labels
from embodied.robots.recording import DatasetRecorder, RecordingConfig
from embodied.runs.checkpoint import save_checkpoint
from embodied.runtime.classified_reward import RewardClassifier, load_reward_classifier, with_reward
from embodied.sim.maniskill import make_maniskill
from embodied.sim.maniskill_common import ManiSkillConfig

SPEC = EnvSpec(
    state_dim=1,
    action_dim=1,
    action_low=(-1.0,),
    action_high=(1.0,),
    image_shapes={"front": (32, 32, 3)},
    control_hz=10.0,
)


def toy_image(done: bool, rng: np.random.Generator) -> np.ndarray:
    """Grey noise; a finished task shows a red square somewhere (the separable feature)."""
    image = rng.integers(60, 120, (32, 32, 3), dtype=np.uint8)
    if done:
        y, x = rng.integers(0, 16, 2)
        image[y : y + 16, x : x + 16] = (230, 20, 20)
    return image


def test_frames_are_positive_only_in_the_tail_of_successful_episodes():
    episode = np.array([0, 0, 0, 0, 1, 1, 1])
    success = np.array([0, 0, 0, 1, 0, 0, 0], bool)  # episode 0 succeeded, episode 1 did not
    assert frame_labels(episode, success, tail=2).tolist() == [False, False, True, True, False, False, False]


@pytest.mark.slow
def test_the_classifier_learns_a_separable_toy_set(tmp_path):
    rng = np.random.default_rng(0)
    recorder = DatasetRecorder(RecordingConfig(dataset=str(tmp_path / "toy")), SPEC, fps=10, instruction="lift")
    recorder.open()
    for episode in range(10):
        succeeded = episode % 2 == 0
        for frame in range(12):
            done = succeeded and frame >= 8  # the last 4 frames of a success show the red square
            recorder.add(np.zeros(1), {"front": toy_image(done, rng)}, np.zeros(1), None, True, 0.0)
        recorder.end_episode(success=succeeded)
    recorder.close()

    run_dir = tmp_path / "classifier"
    assert (
        main(
            [
                "reward",
                f"dataset={tmp_path / 'toy'}",
                "positive_tail=4",
                "iterations=150",
                "batch_size=64",
                "val_fraction=0.3",
                f"run_dir={run_dir}",
            ]
        )
        == 0
    )
    metrics = __import__("json").loads((run_dir / "metrics.json").read_text())
    assert metrics["val_accuracy"] >= 0.95 and metrics["val_recall"] >= 0.9
    model = load_reward_classifier(run_dir)
    fresh = np.random.default_rng(1)
    images = np.stack([toy_image(i % 2 == 0, fresh) for i in range(20)])
    predicted = model.probability({"front": torch.from_numpy(images)}).numpy() > 0.5
    assert (predicted == (np.arange(20) % 2 == 0)).mean() >= 0.9


@pytest.mark.slow
def test_a_dataset_without_successes_or_cameras_is_refused(tmp_path):
    recorder = DatasetRecorder(RecordingConfig(dataset=str(tmp_path / "failures")), SPEC, fps=10, instruction="lift")
    recorder.open()
    recorder.add(np.zeros(1), {"front": np.zeros((32, 32, 3), np.uint8)}, np.zeros(1), None, True, 0.0)
    recorder.end_episode(success=False)
    recorder.close()
    assert main(["reward", f"dataset={tmp_path / 'failures'}", f"runs_root={tmp_path}"]) == 2


def classifier_checkpoint(path, camera, bias):
    """A classifier whose head answers `bias` as the logit for every image."""
    model = RewardClassifier([camera], hidden=[8])
    for parameter in model.head.parameters():
        torch.nn.init.zeros_(parameter)
    model.head[-1].bias.data.fill_(bias)
    save_checkpoint(
        path / "checkpoints",
        "iter_000001",
        model.head.state_dict(),
        {"cameras": [camera], "hidden": [8], "metrics": {}},
        "{}",
    )
    return str(path)


@pytest.mark.slow
def test_as_the_env_reward_the_classifier_replaces_the_reward_and_keeps_the_true_success(tmp_path):
    env = make_maniskill(
        ManiSkillConfig(task="PickCube-v1", num_envs=2, num_workers=0, obs_mode="rgb", image_size=32), seed=0
    )
    camera = next(iter(env.spec.image_shapes))
    actions = np.zeros((2, 1, env.spec.action_dim), np.float32)
    try:
        rewarded = with_reward(env, RewardConfig(classifier=classifier_checkpoint(tmp_path / "yes", camera, 10.0)))
        rewarded.reset()
        step = rewarded.step(actions)
        assert step.reward.tolist() == [1.0, 1.0] and not step.success.any()  # the env's own success stays
        assert rewarded.instructions == env.instructions  # everything else is the env's
        strict = with_reward(
            env, RewardConfig(classifier=classifier_checkpoint(tmp_path / "no", camera, 10.0), threshold=1.0)
        )
        assert strict.step(actions).reward.tolist() == [0.0, 0.0]
        with pytest.raises(ConfigError, match="reads cameras"):
            with_reward(env, RewardConfig(classifier=classifier_checkpoint(tmp_path / "wrist", "wrist", 0.0)))
    finally:
        env.close()
