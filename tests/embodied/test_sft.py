"""Demonstrations from scripted experts and SFT on them: real ManiSkill, datasets written by
the real LeRobotDataset library (in the writer's virtualenv), the real CLI."""

import json

import numpy as np
import pytest
import torch

from embodied.algos.datasets import read_frames
from embodied.build import build_policy
from embodied.cli import main
from embodied.config import SFTConfig, TrainConfig, to_schema
from embodied.core.compose import compose
from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec
from embodied.demos import DemosConfig, generate_demos
from embodied.robots.recording import DatasetRecorder, RecordingConfig
from embodied.runs.checkpoint import load_checkpoint, resolve_checkpoint
from embodied.runtime.learner import Learner
from embodied.runtime.session import TrainSession
from embodied.sft import Demonstrations, run_sft, sft_config
from embodied.sim.experts import make_expert
from embodied.sim.maniskill import ManiSkillEnv, with_state_padding
from embodied.sim.maniskill_common import ManiSkillConfig

EE_CONTROL = "env.control_mode=pd_ee_delta_pos"


def demos_config(root, *overrides):
    return to_schema(DemosConfig, compose("demos", [f"dataset={root}", "progress_bar=false", *overrides]))


SMALL_FLOW = ("policy.hidden=[64,64]", "policy.critic_hidden=[32]")


def sft_run(tmp_path, dataset, *overrides, name="sft", policy=SMALL_FLOW):
    config = to_schema(
        SFTConfig,
        compose(
            "sft",
            [
                f"dataset={dataset}",
                EE_CONTROL,
                "env.num_envs=2",
                "env.num_workers=0",
                f"runs_root={tmp_path}",
                f"run_dir={tmp_path / name}",
                "logger.progress_bar=false",
                "logger.tensorboard=false",
                *policy,
                "batch_size=32",
                "log_every=10",
                *overrides,
            ],
        ),
    )
    return run_sft(config)


@pytest.fixture(scope="module")
def pickcube_demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos") / "pickcube"
    generate_demos(demos_config(root, "episodes=3"))
    return root


@pytest.mark.parametrize("task", ["PickCube-v1", "PushCube-v1", "StackCube-v1"])
def test_scripted_experts_solve_their_tasks(task):
    env = ManiSkillEnv(ManiSkillConfig(task=task, control_mode="pd_ee_delta_pos"))
    expert = make_expert(task, "pd_ee_delta_pos")
    try:
        for seed in range(2):
            env.reset(seed)
            expert.reset()
            success = False
            for _ in range(env.spec.max_episode_steps):
                success |= env.step(expert.act(env.env.unwrapped)).success
            assert success, f"{task} seed {seed}"
    finally:
        env.close()


def test_experts_refuse_tasks_and_controls_they_do_not_know():
    with pytest.raises(ConfigError, match="no scripted expert for 'PegInsertionSide-v1'"):
        make_expert("PegInsertionSide-v1", "pd_ee_delta_pos")
    with pytest.raises(ConfigError, match="pd_ee_delta_pos, not 'pd_joint_delta_pos'"):
        make_expert("PickCube-v1", "pd_joint_delta_pos")


@pytest.mark.slow
def test_demos_are_a_dataset_of_operator_frames_and_a_second_run_continues_with_new_seeds(pickcube_demos, tmp_path):
    frames = read_frames(
        pickcube_demos,
        [
            *("observation.state", "action", "policy_action", "intervention", "episode_index"),
            *("next.success", "next.terminated", "task"),
        ],
    )
    assert sorted(set(frames["episode_index"].tolist())) == [0, 1, 2]
    assert frames["intervention"].all() and np.isnan(frames["policy_action"].astype(np.float32)).all()
    assert set(frames["task"]) == {"pick up the cube and move it to the goal position"}
    assert frames["next.success"].reshape(-1).any()
    # ManiSkill ignores terminations here: a successful demo runs on to its time limit, so no frame ends it
    assert not frames["next.terminated"].any()
    assert json.loads((pickcube_demos / "meta" / "demos.json").read_text())["next_seed"] == 3

    copy = tmp_path / "grown"
    generate_demos(demos_config(copy, "episodes=2"))
    result = generate_demos(demos_config(copy, "episodes=4"))
    assert (result.episodes, result.added) == (4, 2)
    grown = read_frames(copy, ["observation.state", "episode_index"])
    starts = np.stack([grown["observation.state"][grown["episode_index"] == e][0] for e in range(4)])
    original = read_frames(pickcube_demos, ["observation.state", "episode_index"])
    assert np.array_equal(
        starts[:2], np.stack([original["observation.state"][original["episode_index"] == e][0] for e in range(2)])
    )  # seeds 0, 1 (then 2, 3) ...
    assert json.loads((copy / "meta" / "demos.json").read_text())["next_seed"] == 4
    assert len({row.tobytes() for row in starts}) == 4  # ... and 3: no initial state twice


@pytest.mark.slow
def test_multi_task_demos_alternate_tasks_and_train_one_policy_for_all(tmp_path):
    from embodied.config import EvalConfig
    from embodied.evaluate import evaluate_checkpoint

    multitask = [
        "env=maniskill_multitask",
        "env.tasks=[PushCube-v1,PickCube-v1]",
        "env.num_envs=2",
        "env.num_workers=0",
    ]
    root = tmp_path / "demos"
    generate_demos(demos_config(root, "episodes=4", *multitask))
    frames = read_frames(root, ["observation.state", "episode_index", "task"])
    tasks = [frames["task"][frames["episode_index"] == e][0] for e in range(4)]
    assert tasks == ["push the cube to the goal region", "pick up the cube and move it to the goal position"] * 2
    padded = with_state_padding(ManiSkillConfig(tasks=["PushCube-v1", "PickCube-v1"], control_mode="pd_ee_delta_pos"))
    assert frames["observation.state"].reshape(len(frames["task"]), -1).shape[1] == padded.state_dim
    run_dir = sft_run(tmp_path, root, "iterations=20", "val_fraction=0", *multitask[:2], policy=("policy=token_vla",))
    output = evaluate_checkpoint(
        EvalConfig(checkpoint=str(run_dir), episodes=2, progress_bar=False, output=str(tmp_path / "eval"))
    )
    report = json.loads((output / "report.json").read_text())
    assert set(report["instructions"]) == {"PushCube-v1", "PickCube-v1"}


@pytest.mark.slow
def test_camera_frames_read_back_exactly_as_the_env_rendered_them(tmp_path):
    root = tmp_path / "rgb"
    generate_demos(
        demos_config(
            root, "episodes=1", "env.obs_mode=rgb", "env.image_size=32", "max_attempts=1", "keep_failures=true"
        )
    )
    frames = read_frames(root, ["observation.images.base_camera", "episode_index"])
    env = ManiSkillEnv(
        ManiSkillConfig(task="PickCube-v1", control_mode="pd_ee_delta_pos", obs_mode="rgb", image_size=32)
    )
    try:
        first = env.reset(0).images["base_camera"]
    finally:
        env.close()
    assert frames["observation.images.base_camera"].shape[1:] == (32, 32, 3)
    assert np.array_equal(frames["observation.images.base_camera"][0], first)

    # The built-in VLA learns from them, its frozen encoders run once per frame.
    run_dir = sft_run(
        tmp_path,
        root,
        "env.obs_mode=rgb",
        "env.image_size=32",
        "iterations=4",
        "log_every=2",
        policy=("policy=flow_vla", "policy.hidden=[32]", "policy.critic_hidden=[16]"),
    )
    losses = [json.loads(line)["sft/loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_sft_lowers_the_loss_and_its_run_is_evaluated_like_any_run(pickcube_demos, tmp_path):
    run_dir = sft_run(tmp_path, pickcube_demos, "iterations=100", "lr=1e-3", "batch_size=64", "log_every=20")
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in logged] == [20, 40, 60, 80, 100]
    assert logged[-1]["sft/loss"] < 0.8 * logged[0]["sft/loss"]
    assert all(np.isfinite(m["sft/val_loss"]) for m in logged)  # one of the three episodes is held out
    assert main(["eval", f"checkpoint={run_dir}", "episodes=2", "progress_bar=false"]) == 0
    report = json.loads((run_dir / "eval" / "PickCube-v1" / "report.json").read_text())
    assert report["overall"]["episodes"] == 2


def test_a_resumed_sft_run_ends_with_the_weights_of_an_uninterrupted_one(pickcube_demos, tmp_path):
    whole = sft_run(tmp_path, pickcube_demos, "iterations=30", "checkpoint_every=0", name="whole")
    cut = sft_run(tmp_path, pickcube_demos, "iterations=20", "checkpoint_every=0", name="cut")
    # as a run written before `steps` was `iterations` and the log's x-axis `iteration`
    (cut / "config.yaml").write_text((cut / "config.yaml").read_text().replace("iterations: 20", "steps: 20"))
    (cut / "metrics.jsonl").write_text((cut / "metrics.jsonl").read_text().replace('"iteration"', '"sft_step"'))
    resumed = run_sft(sft_config(["iterations=30"], resume=str(tmp_path / "cut")))
    expected, _ = load_checkpoint(resolve_checkpoint(whole))
    weights, state = load_checkpoint(resolve_checkpoint(resumed))
    assert state["iteration"] == 30
    assert all(torch.equal(expected[k], weights[k]) for k in expected)
    steps = [json.loads(line)["iteration"] for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert steps == [10, 20, 30]
    with pytest.raises(ConfigError, match=r"cannot change 'dataset' .* this command 'elsewhere'\)"):
        sft_config(["dataset=elsewhere"], resume=str(resumed))
    # the starting command again, with resume= added: its restated settings are the run's
    again = [f"dataset={pickcube_demos}", EE_CONTROL, "env.num_envs=2", "env.num_workers=0", *SMALL_FLOW]
    assert sft_config([*again, "iterations=40"], resume=str(resumed)).iterations == 40
    with pytest.raises(ConfigError, match=r"cannot change 'env\.num_envs' .* \(the run has 2, this command 16\)"):
        sft_config([f"dataset={pickcube_demos}", "env=maniskill_pickcube"], resume=str(resumed))
    logged = (whole / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds a run"):  # a new run into it would mix the two
        sft_run(tmp_path, pickcube_demos, "iterations=5", name="whole")
    assert (whole / "metrics.jsonl").read_text() == logged


def test_a_new_training_run_starts_from_the_sft_weights_with_init(pickcube_demos, tmp_path):
    run_dir = sft_run(tmp_path, pickcube_demos, "iterations=10")
    sft_weights, _ = load_checkpoint(resolve_checkpoint(run_dir))
    overrides = [
        "env=maniskill_pickcube",
        EE_CONTROL,
        "env.num_envs=2",
        "env.num_workers=0",
        "policy=flow",
        "policy.hidden=[64,64]",
        "policy.critic_hidden=[32]",
        f"runs_root={tmp_path}",
        f"init={run_dir}",
    ]
    config = to_schema(TrainConfig, compose("train", overrides))
    spec = EnvSpec.from_dict(load_checkpoint(resolve_checkpoint(run_dir))[1]["spec"])
    policy = build_policy(config.policy, spec, torch.device("cpu"))
    TrainSession(config).restore(Learner(policy, None, torch.device("cpu")))
    assert all(torch.equal(sft_weights[k], v) for k, v in policy.state_dict().items())

    # RL may ask for another critic: the value function starts fresh, everything else is SFT's
    wider = to_schema(TrainConfig, compose("train", [*overrides, "policy.critic_hidden=[16,16]"]))
    policy = build_policy(wider.policy, spec, torch.device("cpu"))
    TrainSession(wider).restore(Learner(policy, None, torch.device("cpu")))
    loaded = policy.state_dict()
    reshaped = [k for k in sft_weights if loaded[k].shape != sft_weights[k].shape]
    assert reshaped and all(k.startswith("critic.") for k in reshaped) and "critic.4.weight" in loaded
    assert all(torch.equal(sft_weights[k], v) for k, v in loaded.items() if not k.startswith("critic."))

    other = to_schema(
        TrainConfig,
        compose("train", [*overrides[:4], "policy=mlp_gaussian", f"runs_root={tmp_path}", f"init={run_dir}"]),
    )
    mlp = build_policy(other.policy, spec, torch.device("cpu"))
    with pytest.raises(ConfigError, match=f"init={run_dir}: its weights do not fit policy 'mlp_gaussian'"):
        TrainSession(other).restore(Learner(mlp, None, torch.device("cpu")))


SPEC = EnvSpec(state_dim=2, action_dim=1, action_low=(-1.0,), action_high=(1.0,), control_hz=10.0)


def record(root, episodes):
    """Episodes of (intervention, safety_override) flags; frame i has state [i, 0] and action i/100."""
    recorder = DatasetRecorder(RecordingConfig(dataset=str(root)), SPEC, fps=10, instruction="reach")
    recorder.open()
    index = 0
    for flags in episodes:
        for intervention, override in flags:
            recorder.add(np.array([index, 0.0]), {}, np.array([index / 100]), None, intervention, 0.0, override)
            index += 1
        recorder.end_episode(success=True)
    recorder.close()


def test_interventions_only_keeps_the_corrections_and_chunks_end_with_their_segment(tmp_path):
    # frames 0-4: policy, 2 corrections, policy, correction; frames 5-7: correction, safety hold, correction
    record(tmp_path / "d", [[(0, 0), (1, 0), (1, 0), (0, 0), (1, 0)], [(1, 0), (1, 1), (1, 0)]])
    corrections = Demonstrations(tmp_path / "d", SPEC, horizon=3, frames="interventions")
    assert corrections.rows.tolist() == [1, 2, 4, 5, 7]
    assert corrections.chunk.tolist() == [[1, 2, 2], [2, 2, 2], [4, 4, 4], [5, 5, 5], [7, 7, 7]]
    everything = Demonstrations(tmp_path / "d", SPEC, horizon=3)
    assert everything.rows.tolist() == [0, 1, 2, 3, 4, 5, 7]  # never the safety layer's hold
    assert everything.chunk[0].tolist() == [0, 1, 2] and everything.chunk[4].tolist() == [4, 4, 4]
    observation, actions = everything.batch(np.array([0, 4]), torch.device("cpu"))
    assert observation.state[:, 0].tolist() == [0.0, 4.0] and observation.instruction == ["reach", "reach"]
    assert torch.allclose(actions[:, :, 0], torch.tensor([[0.0, 0.01, 0.02], [0.04, 0.04, 0.04]]))
    train, val = everything.split(0.5, seed=0)
    assert (
        len(train)
        and len(val)
        and not set(everything.episode[everything.rows[train]]) & set(everything.episode[everything.rows[val]])
    )


def test_a_dataset_that_does_not_fit_the_env_is_refused_naming_each_difference(tmp_path):
    record(tmp_path / "d", [[(1, 0)]])
    camera_spec = EnvSpec(
        state_dim=3,
        action_dim=1,
        action_low=(-1.0,),
        action_high=(1.0,),
        image_shapes={"front": (8, 8, 3)},
        control_hz=10.0,
    )
    with pytest.raises(
        ConfigError,
        match=r"observation.state has shape \[2\], the env \[3\]; cameras \{\}, "
        r"the env \{'front': \[8, 8, 3\]\}",
    ):
        Demonstrations(tmp_path / "d", camera_spec, horizon=1)
    with pytest.raises(ConfigError, match="no LeRobotDataset"):
        Demonstrations(tmp_path / "missing", SPEC, horizon=1)
    with pytest.raises(ConfigError, match="frames must be one of"):
        Demonstrations(tmp_path / "d", SPEC, horizon=1, frames="corrections")


@pytest.mark.parametrize("policy", ["token_vla", "mlp_gaussian", "diffusion"])
def test_token_gaussian_and_diffusion_policies_learn_the_demos_by_their_own_loss(pickcube_demos, tmp_path, policy):
    run_dir = sft_run(
        tmp_path, pickcube_demos, "iterations=30", "lr=1e-3", "val_fraction=0", policy=(f"policy={policy}",)
    )
    losses = [json.loads(line)["sft/loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and losses[-1] < 0.85 * losses[0]


def test_an_hg_dagger_round_starts_from_the_corrected_policy_and_keeps_its_statistics(pickcube_demos, tmp_path):
    deployed = sft_run(tmp_path, pickcube_demos, "iterations=10", name="deployed")
    again = sft_run(
        tmp_path, pickcube_demos, "iterations=1", "lr=0", f"init={deployed}", "frames=interventions", name="round"
    )
    start, _ = load_checkpoint(resolve_checkpoint(deployed))
    after, _ = load_checkpoint(resolve_checkpoint(again))
    assert all(torch.equal(start[k], after[k]) for k in start)  # lr 0: the weights and statistics it began with
    with pytest.raises(ConfigError, match=f"init={deployed}: its weights do not fit policy 'mlp_gaussian'"):
        sft_run(
            tmp_path, pickcube_demos, "iterations=1", f"init={deployed}", name="wrong", policy=("policy=mlp_gaussian",)
        )


@pytest.mark.slow
def test_pi0_sft_on_a_new_dataset_keeps_the_datasets_statistics_in_its_checkpoint(pickcube_demos, tmp_path):
    """policy.normalization=dataset: SFT computes the demonstrations' state and action
    statistics in pi0's mode (mean/std), trains in those units, and its checkpoint carries
    them, so the run's policy acts as trained when loaded again (eval, serve, init=)."""
    from embodied.core.types import Observation
    from embodied.runs.loading import load_run_policy
    from tests.policies.tiny import TINY_PI0

    run_dir = sft_run(
        tmp_path, pickcube_demos, "iterations=2", "val_fraction=0", policy=(*TINY_PI0, "policy.normalization=dataset")
    )
    frames = read_frames(pickcube_demos, ["observation.state", "action"])
    loaded = load_run_policy(run_dir).policy
    state = frames["observation.state"].astype(np.float64)
    np.testing.assert_allclose(loaded.normalizer.offset.numpy(), state.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        loaded.action_normalizer.scale_out.numpy(), frames["action"].std(0), rtol=1e-4, atol=1e-5
    )
    with torch.no_grad():
        chunk = loaded.act(Observation(state=torch.from_numpy(state[:2]).float(), instruction=["pick", "pick"]))
    assert torch.isfinite(chunk.actions).all()
