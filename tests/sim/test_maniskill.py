"""The ManiSkill adapter on real ManiSkill (physx_cpu)."""

import os
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import sapien

from embodied.core.errors import ConfigError
from embodied.sim.maniskill import ManiSkillEnv, make_maniskill
from embodied.sim.maniskill_common import ManiSkillConfig
from embodied.sim.worker_envs import WorkerEnvs

TASKS = ["PushCube-v1", "PickCube-v1", "StackCube-v1", "PegInsertionSide-v1"]


@pytest.fixture(scope="module")
def pushcube():
    env = make_maniskill(ManiSkillConfig(task="PushCube-v1", num_envs=3), seed=7)
    yield env
    env.close()


@pytest.mark.parametrize("task", TASKS)
def test_each_task_resets_with_state_shapes_and_instruction(task):
    env = make_maniskill(ManiSkillConfig(task=task, num_envs=1), seed=0)
    try:
        observation = env.reset()
        assert observation.state.shape == (1, env.spec.state_dim) and observation.state.dtype == np.float32
        assert env.spec.action_dim == 8 and env.spec.max_episode_steps > 0
        assert observation.instruction[0] and observation.instruction == env.instructions
        result = env.step(np.zeros((1, 2, env.spec.action_dim), np.float32))
        assert result.observation.state.shape == observation.state.shape
        assert result.executed_steps.tolist() == [2]
    finally:
        env.close()


def test_same_seed_gives_the_same_initial_observation(pushcube):
    first = pushcube.reset(seeds=[11, 12, 11])
    assert np.array_equal(first.state[0], first.state[2])
    assert not np.array_equal(first.state[0], first.state[1])
    again = pushcube.reset(seeds=[11, 12, 11])
    assert np.array_equal(first.state, again.state)


def test_chunk_step_sums_rewards_of_its_actions(pushcube):
    pushcube.reset(seeds=[3, 4, 5])
    chunk = np.random.default_rng(0).uniform(-1, 1, size=(3, 4, 8)).astype(np.float32)
    result = pushcube.step(chunk)

    single = ManiSkillEnv(ManiSkillConfig(task="PushCube-v1"))
    single.reset(4)
    rewards = [single.step(chunk[1, j]).reward for j in range(4)]
    single.close()
    assert result.reward[1] == pytest.approx(sum(rewards), rel=1e-5)
    assert result.executed_steps.tolist() == [4, 4, 4]
    np.testing.assert_array_equal(result.executed_action, chunk)


def test_actions_outside_the_bounds_are_clipped_before_execution(pushcube):
    pushcube.reset()
    result = pushcube.step(np.full((3, 1, 8), 5.0, np.float32))
    assert result.executed_action.max() == 1.0


def test_partial_reset_only_touches_the_given_envs(pushcube):
    before = pushcube.reset(seeds=[1, 2, 3])
    pushcube.step(np.full((3, 3, 8), 0.5, np.float32))
    moved = pushcube.reset(seeds=[], env_idx=[])
    after = pushcube.reset(seeds=[2], env_idx=[1])
    assert np.array_equal(after.state[1], before.state[1])
    assert np.array_equal(after.state[0], moved.state[0]) and not np.array_equal(after.state[0], before.state[0])


def test_time_limit_truncates_keeps_final_observation_and_auto_resets():
    env = make_maniskill(ManiSkillConfig(task="PushCube-v1", num_envs=2, max_episode_steps=5), seed=0)
    try:
        env.reset()
        result = env.step(np.full((2, 3, 8), 0.3, np.float32))
        assert not result.done.any()
        result = env.step(np.full((2, 3, 8), 0.3, np.float32))
        assert result.truncated.all() and not result.terminated.any()
        assert result.executed_steps.tolist() == [2, 2]  # the chunk stops where the episode ends
        assert not np.array_equal(result.final_observation.state, result.observation.state)
        assert [e.length for e in result.episodes] == [5, 5]
        fresh = env.step(np.zeros((2, 1, 8), np.float32))
        assert not fresh.done.any()
    finally:
        env.close()


def _cube_on_goal(group):
    group.reset()
    task = group.envs[0].env.unwrapped
    goal = task.goal_region.pose.p[0].numpy()
    cube = task.obj.pose.p[0].numpy()
    task.obj.set_pose(sapien.Pose(p=[goal[0], goal[1], cube[2]]))
    return group.step(np.zeros((1, 1, 8), np.float32))


def test_success_fires_and_terminates_when_the_cube_is_on_the_goal():
    config = ManiSkillConfig(task="PushCube-v1", ignore_terminations=False)
    group = WorkerEnvs(partial(ManiSkillEnv, config), [0], base_seed=0)
    try:
        result = _cube_on_goal(group)
        assert result["success"][0] and result["terminated"][0]
        assert result["episodes"][0][4] is True  # the ended episode counts as a success
    finally:
        group.close()


def test_by_default_success_does_not_end_the_episode_but_counts_at_its_end():
    group = WorkerEnvs(partial(ManiSkillEnv, ManiSkillConfig(task="PushCube-v1")), [0], base_seed=0)
    try:
        result = _cube_on_goal(group)
        assert result["success"][0] and not result["terminated"][0] and not result["episodes"]
        result = group.step(np.zeros((1, 49, 8), np.float32))
        assert result["truncated"][0] and result["episodes"][0][4] is True
    finally:
        group.close()


@pytest.mark.slow
def test_rgb_observations_have_camera_images_and_proprioception():
    env = make_maniskill(ManiSkillConfig(task="PickCube-v1", num_envs=1, obs_mode="rgb", image_size=64), seed=0)
    try:
        observation = env.reset()
        assert observation.images["base_camera"].shape == (1, 64, 64, 3)
        assert observation.images["base_camera"].dtype == np.uint8
        assert observation.images["base_camera"].max() > 0
        assert env.spec.image_shapes == {"base_camera": (64, 64, 3)}
        assert observation.state.shape[1] == env.spec.state_dim > 9
    finally:
        env.close()


@pytest.mark.slow
def test_the_wrist_camera_panda_adds_a_hand_camera_and_keeps_the_state_layout():
    config = ManiSkillConfig(task="PickCube-v1", num_envs=1, obs_mode="rgb", image_size=32)
    plain = make_maniskill(config, seed=0)
    wrist = make_maniskill(replace(config, robot="panda_wristcam"), seed=0)
    try:
        observation = wrist.reset()
        assert wrist.spec.image_shapes == {"base_camera": (32, 32, 3), "hand_camera": (32, 32, 3)}
        assert observation.state.shape == plain.reset().state.shape  # the same layout (its wrist starts turned)
        assert not np.array_equal(observation.images["hand_camera"], observation.images["base_camera"])
    finally:
        plain.close()
        wrist.close()
    with pytest.raises(ConfigError, match="no_such_robot"):
        make_maniskill(replace(config, robot="no_such_robot"), seed=0)


def test_resume_state_replays_episodes_to_the_same_observation(pushcube):
    pushcube.reset()
    pushcube.step(np.full((3, 4, 8), 0.2, np.float32))
    saved = pushcube.resume_state()
    expected = pushcube.step(np.full((3, 1, 8), -0.2, np.float32))
    pushcube.reset()
    restored = pushcube.restore(saved)
    np.testing.assert_array_equal(restored.state, saved["observation_state"])
    np.testing.assert_array_equal(
        pushcube.step(np.full((3, 1, 8), -0.2, np.float32)).observation.state, expected.observation.state
    )


def test_unknown_task_names_the_closest_known_one():
    with pytest.raises(ConfigError, match="Did you mean 'PushCube-v1'"):
        make_maniskill(ManiSkillConfig(task="PushCub-v1"), seed=0)


def test_batched_scene_env_runs_chunks_partial_resets_and_time_limits():
    """The physx_cuda code path, exercised on physx_cpu (where ManiSkill allows one env)."""
    from embodied.sim.maniskill_batched import ManiSkillBatchedEnv

    env = ManiSkillBatchedEnv(
        ManiSkillConfig(task="PushCube-v1", num_envs=1, max_episode_steps=5), base_seed=0, sim_backend="physx_cpu"
    )
    try:
        first = env.reset(seeds=[env.first_seed])
        again = env.reset(seeds=[env.first_seed])
        np.testing.assert_array_equal(first.state, again.state)
        assert env.spec.state_dim == first.state.shape[1] and env.spec.max_episode_steps == 5
        result = env.step(np.full((1, 3, 8), 2.0, np.float32))
        assert result.executed_steps.tolist() == [3] and result.executed_action.max() == 1.0
        result = env.step(np.full((1, 4, 8), 0.1, np.float32))
        assert result.truncated.tolist() == [True] and result.executed_steps.tolist() == [2]
        assert result.episodes[0].length == 5
        assert np.abs(result.executed_action[0, 2:]).max() == 0.0
        assert not np.array_equal(result.final_observation.state, result.observation.state)
        assert env.resume_state() is None
    finally:
        env.close()


@pytest.mark.slow
def test_a_killed_env_worker_is_reported_not_waited_on():
    from embodied.core.errors import EnvWorkerError

    env = make_maniskill(ManiSkillConfig(task="PushCube-v1", num_envs=2, num_workers=2), seed=0)
    try:
        env.reset()
        env.workers[1].process.kill()
        env.workers[1].process.join()
        with pytest.raises(EnvWorkerError, match="died"):
            env.step(np.zeros((2, 1, 8), np.float32))
    finally:
        env.close()


def test_an_mlp_policy_refuses_camera_observations_it_would_ignore():
    from embodied.core.types import EnvSpec
    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig

    spec = EnvSpec(
        state_dim=4,
        action_dim=2,
        action_low=(-1.0, -1.0),
        action_high=(1.0, 1.0),
        image_shapes={"base_camera": (64, 64, 3)},
    )
    with pytest.raises(ConfigError, match="obs_mode=state"):
        MLPGaussianPolicy(MLPPolicyConfig(), spec)


def test_gpu_backend_without_cuda_is_a_clear_config_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the gpu backend is available")
    with pytest.raises(ConfigError, match="needs an NVIDIA GPU"):
        make_maniskill(ManiSkillConfig(backend="gpu"), seed=0)


def test_rewind_replays_the_same_episode_sequence(pushcube):
    first = pushcube.rewind()
    pushcube.step(np.full((3, 2, 8), 0.4, np.float32))
    pushcube.reset()
    assert np.array_equal(pushcube.rewind().state, first.state)


@pytest.mark.slow
def test_several_tasks_run_in_blocks_of_envs_with_padded_states_and_their_own_instructions():
    from embodied.sim.maniskill_common import INSTRUCTIONS

    tasks = ["PushCube-v1", "PickCube-v1", "StackCube-v1"]
    env = make_maniskill(ManiSkillConfig(tasks=tasks, num_envs=6, control_mode="pd_ee_delta_pos"), seed=0)
    try:
        native = {}
        for task in tasks:
            single = ManiSkillEnv(ManiSkillConfig(task=task, control_mode="pd_ee_delta_pos"))
            native[task] = single.reset(0).state
            single.close()
        assert env.spec.state_dim == max(len(state) for state in native.values())
        observation = env.reset(seeds=[0] * 6)
        assert observation.instruction == [INSTRUCTIONS[t] for t in tasks for _ in range(2)]
        for row, task in enumerate(t for t in tasks for _ in range(2)):
            state = observation.state[row]
            np.testing.assert_array_equal(state[: len(native[task])], native[task])  # the task's own state...
            assert not state[len(native[task]) :].any()  # ... then zeros
        result = env.step(np.zeros((6, 1, env.spec.action_dim), np.float32))
        assert result.observation.state.shape == (6, env.spec.state_dim)
    finally:
        env.close()
    with pytest.raises(ConfigError, match="cpu backend"):
        make_maniskill(ManiSkillConfig(tasks=tasks, backend="gpu"), seed=0)
    with pytest.raises(ConfigError, match="cannot give each of 3 tasks an env"):
        make_maniskill(ManiSkillConfig(tasks=tasks, num_envs=2), seed=0)
    with pytest.raises(ConfigError, match="env.tasks"):
        make_maniskill(ManiSkillConfig(tasks=["PushCube-v1", "Nope-v1"]), seed=0)


@pytest.mark.parametrize("task, collections", [("PushCube-v1", 2), ("PegInsertionSide-v1", 4)])
def test_maniskills_collections_on_cpu_scenes_skip_older_objects(task, collections, monkeypatch):
    """ManiSkill collects garbage whenever it builds or clears a scene (PegInsertionSide with one
    env rebuilds its scene at every reset as well); on physx_cpu the objects that existed before
    are frozen out of those collections (0.2-1 s each in a process that imported torch) and given
    back afterwards, so garbage made before is still freed."""
    import gc
    import weakref

    seen = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: seen.append(gc.get_freeze_count()) or collect(*args))

    class Node:
        pass

    enabled = gc.isenabled()
    gc.disable()  # no automatic collection from here to the last one: only ManiSkill's and ours
    try:
        garbage = Node()
        garbage.itself = garbage  # a cycle: only a collection frees it
        alive = weakref.ref(garbage)
        del garbage
        env = ManiSkillEnv(ManiSkillConfig(task=task, num_envs=1))  # builds, then resets once
        env.reset(1)
        env.close()
        assert len(seen) == collections and min(seen) > 0  # ManiSkill's, while older objects were frozen
        assert gc.get_freeze_count() == 0 and alive() is not None  # nothing kept frozen; the cycle waits
        collect()
        assert alive() is None  # ... for the next regular collection
    finally:
        if enabled:
            gc.enable()


@pytest.mark.slow
def test_the_lean_shaders_render_every_task_byte_for_byte_as_sapiens_own(tmp_path):
    """sim/sapien_shaders.py: each task's cameras (PickCube's wrist camera too) and its video
    frame, rendered in a process of their own with SAPIEN's shaders and with the lean ones."""
    import subprocess
    import sys

    from tests.cli import ROOT

    rendered = {}
    for mode in ("stock", "lean"):
        out = tmp_path / f"{mode}.npz"
        subprocess.run(
            [sys.executable, "-m", "tests.sim.camera_frames", mode, str(out)], cwd=ROOT, check=True, timeout=600
        )
        rendered[mode] = dict(np.load(out))
    assert rendered["lean"].keys() == rendered["stock"].keys()
    assert {"PickCube-v1/hand_camera", "PushCube-v1/base_camera", "PushCube-v1/video"} <= rendered["lean"].keys()
    for name, image in rendered["stock"].items():
        assert image.std() > 0, name  # a scene, not a blank
        np.testing.assert_array_equal(rendered["lean"][name], image, err_msg=name)


def test_the_lean_shaders_are_derived_once_and_a_pack_they_do_not_fit_keeps_sapiens_own(tmp_path):
    from pathlib import Path

    from embodied.sim.sapien_shaders import derive

    stock = Path(sapien.__file__).parent / "vulkan_shader"
    lean = derive(stock, tmp_path / "cache")
    assert lean is not None and derive(stock, tmp_path / "cache") == lean
    assert [path.name for path in (tmp_path / "cache").iterdir()] == [lean.name]  # no staging left behind
    for pack in ("minimal", "default"):
        assert not [path for path in (lean / pack).iterdir() if "samplerBRDFLUT" in path.read_text()]
    assert (lean / "rt").is_dir() and (lean / "common").is_dir()  # the other packs as they are

    other = tmp_path / "other"
    (other / "minimal").mkdir(parents=True)
    (other / "default").mkdir()
    (other / "minimal" / "gbuffer.frag").write_text("vec2 b = textureLod(samplerBRDFLUT, uv, 0).xy;\n")
    assert derive(other, tmp_path / "cache2") is None
    assert not list((tmp_path / "cache2").iterdir())


def test_a_scene_lit_by_an_environment_map_is_refused_by_the_lean_shaders():
    from types import SimpleNamespace

    from embodied.sim.sapien_shaders import check_scene

    def env(cubemap):
        scene = SimpleNamespace(sub_scenes=[SimpleNamespace(render_system=SimpleNamespace(cubemap=cubemap))])
        return SimpleNamespace(unwrapped=SimpleNamespace(scene=scene, spec=SimpleNamespace(id="Lit-v1")))

    check_scene(env(None))
    with pytest.raises(RuntimeError, match="Lit-v1 lights its scene with an environment map"):
        check_scene(env(object()))


def test_an_unwritable_shader_cache_keeps_sapiens_own_shaders_with_one_warning(tmp_path):
    import subprocess
    import sys

    from tests.cli import ROOT

    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would go")
    script = (
        "import logging; logging.basicConfig(); import sapien.render;"
        "from embodied.sim.sapien_shaders import use_lean_shaders;"
        "print(use_lean_shaders(), use_lean_shaders(), getattr(sapien.render.set_camera_shader_dir, 'lean', False))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "XDG_CACHE_HOME": str(blocked)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False", "False"]
    assert result.stderr.count("SAPIEN's shaders stay as they are") == 1
