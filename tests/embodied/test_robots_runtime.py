"""runtime=robots: robot clients as the env side of online learning, over real ZeroMQ
sockets with a simulated ManiSkill robot and the real SAC/RLPD learner."""

import json
import subprocess
import threading
from itertools import accumulate

import numpy as np
import pytest
import torch

from embodied.algos.replay import from_trajectory
from embodied.config import RewardConfig, TrainConfig, to_schema
from embodied.core.compose import compose
from embodied.core.episodes import Episode, EpisodeNotTaken, parse_episode
from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec
from embodied.robots.policy_client import PolicyClient, ServerError
from embodied.runtime.classified_reward import load_reward_classifier
from embodied.runtime.configs import RobotsRuntimeConfig
from embodied.runtime.policy_server import PolicyServer, ServeConfig
from embodied.runtime.robot_learner import LatestWeights, OutcomeReward, RobotsRuntime, episode_trajectory
from tests.cli import embodied, start
from tests.embodied.test_reward_classifier import classifier_checkpoint

SPEC = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0), control_hz=20.0)


def episode(ticks=4, **changes) -> dict:
    body = Episode(
        states=np.arange((ticks + 1) * 3, dtype=np.float32).reshape(ticks + 1, 3),
        actions=np.full((ticks, 2), 0.5, np.float32),
        rewards=np.arange(ticks, dtype=np.float32),
        intervened=np.array([False, True] * (ticks // 2)),
        terminated=True,
        success=True,
        instruction="push",
    ).to_message()
    return {**body, **changes}


def test_an_episode_becomes_transitions_that_end_where_the_task_ended():
    parsed = parse_episode(episode(), SPEC, max_ticks=100)
    transitions = from_trajectory(episode_trajectory(parsed, policy_version=2), lambda a: a)
    states = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(transitions.state.numpy(), states[:-1])
    np.testing.assert_array_equal(transitions.next_state.numpy(), states[1:])
    np.testing.assert_array_equal(transitions.reward.numpy(), [0, 1, 2, 3])
    np.testing.assert_array_equal(transitions.discount.numpy(), [1, 1, 1, 0])  # terminal: no bootstrap
    np.testing.assert_array_equal(transitions.intervened.numpy(), [False, True, False, True])
    cut = parse_episode(episode(terminated=False), SPEC, max_ticks=100)  # a time limit: bootstrapped
    assert from_trajectory(episode_trajectory(cut, 0), lambda a: a).discount.tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"states": np.zeros((4, 3), np.float32)}, "one per acted tick and the one after"),
        ({"actions": np.zeros((4, 3), np.float32)}, r"actions must be float32 \(4, 2\)"),
        ({"actions": np.zeros((4, 2), np.float64)}, "actions must be a 2-d float32"),
        ({"actions": np.full((4, 2), 2.0, np.float32)}, "outside the action bounds"),
        ({"rewards": np.array([0, np.nan, 0, 0], np.float32)}, "rewards contain NaN"),
        ({"intervened": np.zeros(3, bool)}, "one entry per acted tick"),
        ({"terminated": 1}, "terminated must be true or false"),
        ({"actions": np.zeros((0, 2), np.float32)}, "1 to 100 acted ticks"),
        ({"policy_version": "7"}, "policy_version must be an integer"),
    ],
)
def test_a_malformed_episode_is_refused_naming_what_is_wrong(changes, message):
    with pytest.raises(ValueError, match=message):
        parse_episode(episode(**changes), SPEC, max_ticks=100)
    with pytest.raises(ValueError, match="a map"):
        parse_episode([1, 2], SPEC, max_ticks=100)


CAMERA_SPEC = EnvSpec(
    state_dim=3,
    action_dim=2,
    action_low=(-1.0, -1.0),
    action_high=(1.0, 1.0),
    control_hz=20.0,
    image_shapes={"front": (32, 32, 3), "wrist": (4, 4, 3)},
)


def test_outcome_images_must_be_exactly_the_learners_cameras_one_frame_per_tick():
    frames = np.zeros((4, 32, 32, 3), np.uint8)
    parsed = parse_episode(episode(outcome_images={"front": frames}), CAMERA_SPEC, 100, outcome_cameras=["front"])
    assert parsed.outcome_images["front"].shape == (4, 32, 32, 3)
    for images, message in (
        ({}, r"exactly the cameras \['front'\]"),
        ({"front": frames, "wrist": np.zeros((4, 4, 4, 3), np.uint8)}, "exactly the cameras"),
        ({"front": frames[:3]}, r"uint8 \(4, 32, 32, 3\): one frame per acted tick"),
        ({"front": frames.astype(np.float32)}, "must be uint8"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_episode(episode(outcome_images=images), CAMERA_SPEC, 100, outcome_cameras=["front"])
    with pytest.raises(ValueError, match=r"exactly the cameras \[\]"):  # not asked for: not taken
        parse_episode(episode(outcome_images={"front": frames}), CAMERA_SPEC, 100)


def test_the_policys_frames_come_like_states_one_more_than_the_acted_ticks():
    frames = np.arange(5 * 4 * 4 * 3, dtype=np.uint8).reshape(5, 4, 4, 3)
    parsed = parse_episode(episode(images={"wrist": frames}), CAMERA_SPEC, 100, policy_cameras=["wrist"])
    trajectory = episode_trajectory(parsed, policy_version=0)
    transitions = from_trajectory(trajectory, lambda a: a, cameras=["wrist"])
    np.testing.assert_array_equal(transitions.images["wrist"].numpy(), frames[:-1])
    np.testing.assert_array_equal(transitions.next_images["wrist"].numpy(), frames[1:])
    with pytest.raises(ValueError, match=r"uint8 \(5, 4, 4, 3\): one frame per acted tick and the one after"):
        parse_episode(episode(images={"wrist": frames[:4]}), CAMERA_SPEC, 100, policy_cameras=["wrist"])
    with pytest.raises(
        ValueError, match=r"images must hold exactly the cameras \['wrist'\] \(the learner's policy_cameras\)"
    ):
        parse_episode(episode(), CAMERA_SPEC, 100, policy_cameras=["wrist"])


def test_the_classifier_rewards_each_tick_by_what_it_led_to(tmp_path):
    torch.manual_seed(0)
    path = classifier_checkpoint(tmp_path / "clf", "front", 0.0)
    model = load_reward_classifier(path)
    with torch.no_grad():  # a head that tells frames apart
        for parameter in model.head.parameters():
            parameter.normal_(0, 0.02)
    frames = np.random.default_rng(0).integers(0, 255, (7, 32, 32, 3), dtype=np.uint8)
    probability = model.probability({"front": torch.from_numpy(frames)}).numpy()
    threshold = float(np.median(probability))
    reward = OutcomeReward(RewardConfig(classifier=path, threshold=threshold), CAMERA_SPEC)
    reward.model = model
    parsed = parse_episode(
        episode(ticks=7, intervened=np.zeros(7, bool), outcome_images={"front": frames}),
        CAMERA_SPEC,
        100,
        outcome_cameras=["front"],
    )
    expected = (probability > threshold).astype(np.float32)
    assert 0 < expected.sum() < 7
    np.testing.assert_array_equal(reward(parsed), expected)
    np.testing.assert_array_equal(reward(parsed, frames_per_pass=3), expected)  # in passes: the same
    with pytest.raises(ConfigError, match="reads cameras"):
        OutcomeReward(RewardConfig(classifier=path), SPEC)


def test_servers_refuse_episodes_they_cannot_learn_from_and_learning_ones_ack_them():
    def infer(observation):
        return np.zeros((observation.batch_size, 1, 2), np.float32)

    taken = []

    def on_episode(client, body):
        if len(taken) == 1:
            raise EpisodeNotTaken("the run has all its 4 env steps")
        taken.append(parse_episode(body, SPEC, max_ticks=100))
        return {"transitions": taken[-1].length, "policy_version": 5}

    for learns in (False, True):
        server = PolicyServer(
            infer,
            SPEC,
            {"policy": "zeros", "chunk_size": 1, "learning": learns},
            ServeConfig(endpoint="tcp://127.0.0.1:*", stats_every_s=0),
            on_episode=on_episode if learns else None,
        )
        stop = threading.Event()
        thread = threading.Thread(target=server.serve_forever, args=(stop.is_set,), daemon=True)
        thread.start()
        client = PolicyClient(server.endpoint, SPEC)
        try:
            client.connect(5.0)
            assert client.learning == learns
            if not learns:
                with pytest.raises(ServerError, match="runtime=robots"):
                    client.send_episode(episode(), timeout_s=5.0)
            else:
                with pytest.raises(ServerError, match="outside the action bounds"):
                    client.send_episode(episode(actions=np.full((4, 2), 9.0, np.float32)), timeout_s=5.0)
                assert client.send_episode(episode(), timeout_s=5.0) == {"transitions": 4, "policy_version": 5}
                assert len(taken) == 1  # the refused one stored nothing
                with pytest.raises(ServerError, match="not taken: the run has all"):
                    client.send_episode(episode(), timeout_s=5.0)
                # Two refused, one of them malformed: a finished run's refusal is not the robot's fault.
                assert (server.stats.refused, server.stats.malformed) == (2, 1)
        finally:
            client.close()
            stop.set()
            thread.join(5)
            server.close()


def test_the_newest_weights_replace_ones_not_yet_taken():
    latest = LatestWeights()
    assert latest.take() is None
    latest.put(1, {"w": torch.zeros(1)})
    latest.put(2, {"w": torch.ones(1)})
    version, weights = latest.take()
    assert version == 2 and float(weights["w"]) == 1.0 and latest.take() is None


def test_on_policy_algorithms_and_unknown_weight_modes_are_refused(tmp_path):
    config = to_schema(TrainConfig, compose("train", ["runtime=robots", f"run_dir={tmp_path / 'ppo'}"]))
    with pytest.raises(ConfigError, match="algo=sac_rlpd"):
        RobotsRuntime(config.runtime).train(config)
    with pytest.raises(ConfigError, match="runtime.apply_weights"):
        config = to_schema(
            TrainConfig,
            compose(
                "train", ["runtime=robots", "algo=sac_rlpd", "policy=squashed_gaussian", "runtime.apply_weights=never"]
            ),
        )
        RobotsRuntime(RobotsRuntimeConfig(apply_weights="never")).train(config)


LEARNER = [
    "runtime=robots",
    "runtime.endpoint=tcp://127.0.0.1:*",
    "policy=squashed_gaussian",
    "policy.hidden=[32]",
    "algo=sac_rlpd",
    "algo.utd_ratio=1",
    "algo.batch_size=16",
    "algo.num_critics=2",
    "algo.critic_hidden=[32]",
    "eval_every=0",
    "eval_episodes=0",
    "checkpoint_every=1",
    "logger.progress_bar=false",
    "logger.tensorboard=false",
]


def learn_from_a_robot(arguments, run_dir, output, episodes=20, env=None, robot_arguments=()):
    """A learning server and a simulated robot client, each in its own process (`env`: their
    environment variables, default this process's). The robot has more episodes than a run
    here needs: on a busy machine its loop skips stalled ticks, so episodes can be short, and a
    robot that ran out before the run had its env steps would leave the server waiting. The ack
    of the episode that completes the run stops the robot."""
    server = start("train", *arguments, env=env, inherit_env=env is None)
    try:
        line = ""
        while "learning from robots on" not in line:
            line = server.stdout.readline()
            assert line or server.poll() is None, server.stderr.read()[-3000:]
        endpoint = line.split(" on ", 1)[1].split()[0]
        client = embodied(
            "robot",
            "robot=sim",
            f"robot.env_from={run_dir}",
            f"server={endpoint}",
            f"episodes={episodes}",
            "max_episode_steps=20",
            f"output={output}",
            *robot_arguments,
            check=False,
            timeout=300,
            env=env,
            inherit_env=env is None,
        )
        assert client.returncode == 0, client.stderr[-3000:]
        try:  # the learner works through the queued episodes first: slow on a loaded machine
            assert server.wait(timeout=300) == 0, server.stderr.read()[-3000:]
        except subprocess.TimeoutExpired:
            server.kill()
            pytest.fail(f"the learning server did not finish after the robot did:\n{server.stderr.read()[-3000:]}")
    finally:
        if server.poll() is None:
            server.kill()
    return json.loads((output / "summary.json").read_text())


def cumulative(summary) -> list[int]:
    """The transitions the learner had after each episode the robot sent."""
    return list(accumulate(episode["steps"] for episode in summary["episodes"]))


@pytest.mark.slow
def test_a_robot_client_feeds_the_learner_which_stops_it_when_done_and_resumes_with_its_replay(tmp_path):
    run_dir = tmp_path / "run"
    summary = learn_from_a_robot([*LEARNER, "total_env_steps=60", f"run_dir={run_dir}"], run_dir, tmp_path / "robot")
    # 20-tick episodes, three for the run's 60 env steps; a tick the robot's loop skips after a
    # stall (a busy machine) is no transition, and then a fourth episode is needed. The ack of the
    # episode that completes the run says so, and the robot stops.
    totals = cumulative(summary)
    assert totals[-1] >= 60 and (len(totals) == 1 or totals[-2] < 60)
    assert summary["learner"] == {"sent": len(totals), "transitions": totals[-1], "not_taken": 0}
    assert [e["learner"]["taken"] for e in summary["episodes"]] == [True] * len(totals)
    assert all(0 < e["steps"] <= 20 for e in summary["episodes"])
    # Weights are applied between episodes: each episode is acted by one policy version.
    ticks = [json.loads(line) for line in (tmp_path / "robot" / "steps.jsonl").read_text().splitlines()]
    for index in range(len(totals)):
        versions = {t["policy_version"] for t in ticks if t["episode"] == index and "policy_version" in t}
        assert len(versions) == 1
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["replay/online"] for m in metrics] == totals
    assert [m["train/policy_version"] for m in metrics] == list(range(1, len(totals) + 1))
    assert (run_dir / "checkpoints" / "latest").is_file()

    # Resumed: the replay buffer, counters and weights come back, and a robot just connects.
    resumed = learn_from_a_robot([f"resume={run_dir}", "total_env_steps=100"], run_dir, tmp_path / "robot-2")
    more = [totals[-1] + total for total in cumulative(resumed)]
    assert more[-1] >= 100 and (len(more) == 1 or more[-2] < 100)
    assert resumed["learner"] == {"sent": len(more), "transitions": more[-1] - totals[-1], "not_taken": 0}
    assert resumed["episodes"][0]["learner"]["policy_version"] >= len(totals)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["replay/online"] for m in metrics] == totals + more
    assert metrics[-1]["train/iteration"] == len(totals) + len(more)


@pytest.mark.slow
def test_with_a_reward_classifier_robots_send_their_outcome_frames_and_the_learner_rewards_them(tmp_path):
    env = ["env.obs_mode=rgb", "env.image_size=32", "policy.cameras=[]"]  # a policy of the state alone
    classifier = classifier_checkpoint(tmp_path / "clf", "base_camera", 10.0)  # every frame: success
    run_dir = tmp_path / "run"
    summary = learn_from_a_robot(
        [*LEARNER, *env, f"reward.classifier={classifier}", "total_env_steps=40", f"run_dir={run_dir}"],
        run_dir,
        tmp_path / "robot",
    )
    assert summary["learner"]["transitions"] >= 40 and summary["learner"]["not_taken"] == 0
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == summary["learner"]["sent"]
    # The classifier's reward is 1 on every tick, so returns equal lengths; PushCube's own dense
    # reward, which the robot reported, is below 1 per tick.
    for m in metrics:
        assert m["rollout/episode_return"] == m["rollout/episode_length"]
        assert m["robots/reported_return"] < m["rollout/episode_length"]


@pytest.mark.slow
def test_a_robot_teaches_a_pixel_policy_with_an_operator_and_a_classifier_on_its_frames(tmp_path):
    """The real-robot loop in simulation: the policy reads the robot's camera, episodes carry
    its frames, a scripted operator takes over, the classifier rewards what each tick led to on
    the same camera, and the learned weights come back to the robot."""
    from embodied.runs.checkpoint import load_checkpoint, resolve_checkpoint

    rgb = ["env.obs_mode=rgb", "env.image_size=32"]
    expert = tmp_path / "expert"
    trained = embodied(
        "train",
        *[a for a in LEARNER if not a.startswith("runtime")],
        *rgb,
        "policy.cameras=[]",
        "env.num_envs=1",
        "env.num_workers=0",
        "total_env_steps=2",
        f"run_dir={expert}",
        check=False,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    classifier = classifier_checkpoint(tmp_path / "clf", "base_camera", 10.0)  # every frame: success
    run_dir = tmp_path / "run"
    pixels = ["policy.image_backbone=random_cnn", "policy.image_projection=8"]
    operator = [
        "teleop=oracle",
        f"teleop.operator.policy={expert}",
        "teleop.operator.threshold=0.001",
        "teleop.operator.patience=1",
    ]
    summary = learn_from_a_robot(
        [*LEARNER, *rgb, *pixels, f"reward.classifier={classifier}", "total_env_steps=60", f"run_dir={run_dir}"],
        run_dir,
        tmp_path / "robot",
        # episodes the operator or the classifier ends early are short: the robot has more than
        # the run needs, and the ack of the episode that completes it stops the robot
        episodes=20,
        robot_arguments=operator,
    )
    assert summary["learner"]["transitions"] >= 60 and summary["learner"]["not_taken"] == 0
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m["rollout/episode_return"] == m["rollout/episode_length"] for m in metrics)  # the classifier's
    assert sum(m["robots/episode_intervened"] for m in metrics) > 0 and metrics[-1]["replay/offline"] > 0
    ticks = [json.loads(line) for line in (tmp_path / "robot" / "steps.jsonl").read_text().splitlines()]
    # weights apply when an episode arrives: the third episode is acted by what the first taught
    assert max(t.get("policy_version", 0) for t in ticks) >= 1
    _, state = load_checkpoint(resolve_checkpoint(run_dir))
    online = state["learner"]["algo"]["online"]["data"]
    frames = online["images/base_camera"]
    assert frames.dtype == torch.uint8 and frames.shape[1:] == (32, 32, 3) and int(frames.max()) > 0
    assert torch.equal(online["next_images/base_camera"][0], frames[1])  # the episode's next frame


def test_a_recording_robot_sends_the_state_its_last_action_led_to(tmp_path):
    """Saving the recorded episode holds the robot (a simulator steps on it): the episode's
    last state is read before that, so replaying the executed actions ends in it."""
    from embodied.robots.client import RobotClient, RobotClientConfig
    from embodied.robots.recording import RecordingConfig
    from embodied.robots.safety import SafetyConfig
    from embodied.robots.sim_robot import SimRobot, SimRobotConfig

    pendulum = SimRobotConfig(env={"name": "gymnasium", "task": "Pendulum-v1"})
    robot = SimRobot(pendulum)
    taken = []

    def on_episode(client, body):
        taken.append(parse_episode(body, robot.spec, max_ticks=1000))
        return {"transitions": taken[-1].length, "policy_version": 0}

    def infer(observation):
        return np.full((observation.batch_size, 1, 1), 0.5, np.float32)

    server = PolicyServer(
        infer,
        robot.spec,
        {"policy": "half", "chunk_size": 1, "learning": True},
        ServeConfig(endpoint="tcp://127.0.0.1:*", stats_every_s=0),
        on_episode=on_episode,
    )
    stop = threading.Event()
    thread = threading.Thread(target=server.serve_forever, args=(stop.is_set,), daemon=True)
    thread.start()
    config = RobotClientConfig(
        server=server.endpoint,
        episodes=1,
        max_episode_steps=15,
        control_hz=100.0,
        output=str(tmp_path / "robot"),
        safety=SafetyConfig(safe_action="zero"),
        record=RecordingConfig(dataset=str(tmp_path / "data")),
    )
    try:
        summary = RobotClient(robot, PolicyClient(server.endpoint, robot.spec), config, tmp_path / "robot").run()
    finally:
        stop.set()
        thread.join(5)
        server.close()
    assert summary["learner"]["sent"] == 1 and len(taken) == 1
    episode = taken[0]
    replay = SimRobot(pendulum)
    with replay:
        replay.reset_episode(config.seed)
        np.testing.assert_allclose(replay.get_observation().state, episode.states[0], rtol=1e-6)
        for action in episode.actions:
            replay.send_action(action)
        np.testing.assert_allclose(replay.get_observation().state, episode.states[-1], rtol=1e-5, atol=1e-6)
