"""Real LIBERO (offline assets) in env workers under its own virtualenv (.venv-libero)."""

import json
import subprocess
import textwrap

import numpy as np
import pytest

from embodied.core.errors import ConfigError
from embodied.sim.libero import (
    BASE_STEP_LIMITS,
    PRO_SUITES,
    SUITE_STEP_LIMITS,
    LiberoConfig,
    libero_python,
    make_libero,
)


def run_in_libero(code: str) -> dict:
    """Run `code` under LIBERO's interpreter; it prints one JSON line with its findings."""
    result = subprocess.run(
        [libero_python(LiberoConfig()), "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"MUJOCO_GL": "egl", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("suite", sorted(BASE_STEP_LIMITS))
@pytest.mark.slow
def test_every_suite_builds_with_its_step_limit_and_instruction(suite):
    env = make_libero(
        LiberoConfig(suite=suite, task_ids=[0], num_envs=1, num_workers=1, cameras=[], settle_steps=0), seed=0
    )
    try:
        assert env.spec.max_episode_steps == SUITE_STEP_LIMITS[suite]
        assert env.spec.state_dim == 8 and env.spec.action_dim == 7 and env.spec.control_hz == 20.0
        observation = env.reset()
        assert observation.state.shape == (1, 8) and observation.instruction[0]
        assert env.tasks[0].startswith(f"{suite}/0:")
    finally:
        env.close()


def test_every_libero_pro_suite_ships_its_task_files_and_init_states():
    found = run_in_libero(f"""
        import json, os
        from libero.libero import benchmark, get_libero_path

        suites = benchmark.get_benchmark_dict()
        counts = {{}}
        for name in {sorted(PRO_SUITES)!r}:
            suite = suites[name]()
            counts[name] = sum(
                os.path.isfile(suite.get_task_bddl_file_path(i)) and len(suite.get_task_init_states(i)) >= 50
                for i in range(suite.n_tasks)
            )
        print(json.dumps(counts))
    """)
    assert found == {suite: 10 for suite in PRO_SUITES}


@pytest.mark.slow
def test_libero_pro_perturbations_run_with_their_own_instructions():
    """Each perturbation of libero_goal's task 0 builds, resets and steps; a paraphrase (lan)
    or a new goal (task) is what the policy is told, a perturbed scene keeps the instruction."""
    instructions = {}
    for suite in ("libero_goal", *(f"libero_goal_{p}" for p in ("lan", "object", "swap", "task"))):
        env = make_libero(
            LiberoConfig(suite=suite, task_ids=[0], num_envs=1, num_workers=1, cameras=[], settle_steps=0), seed=0
        )
        try:
            assert env.spec.max_episode_steps == SUITE_STEP_LIMITS["libero_goal"]
            observation = env.reset()
            result = env.step(np.zeros((1, 2, 7), np.float32))
            assert result.observation.state.shape == (1, 8) and np.isfinite(result.observation.state).all()
            instructions[suite.removeprefix("libero_goal").lstrip("_") or "base"] = observation.instruction[0]
        finally:
            env.close()
    assert instructions["base"] == "open the middle drawer of the cabinet"
    assert instructions["object"] == instructions["swap"] == instructions["base"]
    assert instructions["lan"] not in (instructions["base"], "") and instructions["task"] != instructions["base"]


@pytest.mark.slow
def test_same_init_state_gives_the_same_first_observation_and_images_are_upright():
    env = make_libero(LiberoConfig(suite="libero_goal", task_ids=[0, 1], num_envs=2, num_workers=1), seed=0)
    try:
        first = env.reset(seeds=[7, 7])
        second = env.reset(seeds=[7, 7])
        other = env.reset(seeds=[8, 8])
    finally:
        env.close()
    assert set(first.images) == {"agentview", "wrist"} and first.images["agentview"].shape == (2, 128, 128, 3)
    np.testing.assert_array_equal(first.state, second.state)
    np.testing.assert_array_equal(first.images["agentview"], second.images["agentview"])
    assert not np.array_equal(first.state[0], other.state[0])  # init state 8 is another scene
    assert first.instruction == ["open the middle drawer of the cabinet", "put the bowl on the stove"]
    # Upright: the table (bright wood) fills the bottom rows, the back wall the top ones.
    image = first.images["agentview"][0].astype(float)
    assert image[-20:].mean() > image[:20].mean()


@pytest.mark.slow
def test_a_reset_on_the_reused_scene_gives_exactly_what_a_recompiled_one_gives():
    """The worker compiles a scene once and resets on copies of it; robosuite compiles it on
    every reset. Both give the same observations, frames included, bit for bit, also after
    another episode has run on the same env."""
    found = run_in_libero("""
        import json
        import numpy as np
        from robosuite.utils import binding_utils

        compile_every_time = binding_utils.MjSim.from_xml_string
        from embodied.sim.libero import SCENES, LiberoConfig, LiberoEnv

        env = LiberoEnv(LiberoConfig(suite="libero_goal", task_ids=[0], settle_steps=2))
        actions = np.random.default_rng(0).uniform(-1, 1, (6, 7))

        def episode(seed):
            return [env.reset(seed), *(env.step(action).observation for action in actions)]

        def same(a, b):
            return all(
                np.array_equal(x.state, y.state) and all(np.array_equal(x.images[c], y.images[c]) for c in x.images)
                for x, y in zip(a, b)
            )

        reused = episode(7)
        episode(3)
        after_another = episode(7)
        compiles = SCENES.compiles
        binding_utils.MjSim.from_xml_string = compile_every_time
        compiled = episode(7)
        env.close()
        print(json.dumps({"compiles": compiles, "reused": same(reused, compiled),
                          "after_another": same(after_another, compiled), "cameras": sorted(compiled[0].images),
                          "moved": not np.array_equal(compiled[0].state, compiled[-1].state)}))
    """)
    assert found == {
        "compiles": 1,  # the env's construction; its three resets reused that scene
        "reused": True,
        "after_another": True,
        "cameras": ["agentview", "wrist"],
        "moved": True,
    }


@pytest.mark.slow
def test_a_state_only_env_makes_its_renderer_for_videos_alone_and_films_as_before():
    """Without cameras the env makes its renderer only when a video asks for a frame, not on
    every reset as robosuite does; its states and its frames are what they were with
    robosuite's renderer, but for the first frame: making the renderer brings the scene's
    poses up to the current state, where robosuite draws them as of the last physics substep."""
    found = run_in_libero("""
        import json
        import numpy as np
        from embodied.sim.libero import LiberoConfig, LiberoEnv

        actions = np.random.default_rng(1).uniform(-1, 1, (4, 7))

        def episode(renderer_at_reset):
            env = LiberoEnv(LiberoConfig(suite="libero_spatial", task_ids=[1], cameras=[], settle_steps=1))
            env.env.env.has_offscreen_renderer = renderer_at_reset  # robosuite's reset makes it
            env.reset(5)
            made = env.env.env.sim._render_context_offscreen is not None
            states, frames = [], []
            for action in actions:
                states.append(env.step(action).observation.state)
                frames.append(env.render())
            env.close()
            return made, np.stack(states), np.stack(frames)

        lazily, states, frames = episode(False)
        at_reset, reset_states, reset_frames = episode(True)
        print(json.dumps({"made_at_reset": [lazily, at_reset], "states": bool(np.array_equal(states, reset_states)),
                          "frames": bool(np.array_equal(frames[1:], reset_frames[1:])), "shape": list(frames.shape),
                          "lit": bool(frames.mean() > 20)}))
    """)
    assert found == {
        "made_at_reset": [False, True],
        "states": True,
        "frames": True,
        "shape": [4, 256, 256, 3],
        "lit": True,
    }


@pytest.mark.slow
def test_episodes_are_truncated_at_the_step_limit():
    env = make_libero(
        LiberoConfig(
            suite="libero_spatial",
            task_ids=[0],
            num_envs=1,
            num_workers=1,
            cameras=[],
            settle_steps=0,
            max_episode_steps=3,
        ),
        seed=0,
    )
    try:
        env.reset()
        result = env.step(np.zeros((1, 3, 7), np.float32))
    finally:
        env.close()
    assert result.truncated[0] and not result.terminated[0] and result.executed_steps[0] == 3
    assert result.episodes and result.episodes[0].length == 3 and not result.episodes[0].success


@pytest.mark.slow
def test_success_fires_on_a_state_that_satisfies_the_goal():
    found = run_in_libero("""
        import json
        import numpy as np
        from embodied.sim.libero import LiberoConfig, LiberoEnv

        env = LiberoEnv(LiberoConfig(suite="libero_goal", task_ids=[0], cameras=[], settle_steps=0))
        env.reset(0)
        before = env.step(np.zeros(7)).success
        sim = env.env.sim
        drawer = sim.model.jnt_qposadr[sim.model.joint_name2id("wooden_cabinet_1_middle_level")]
        sim.data.qpos[drawer] = -0.15  # the middle drawer pulled open
        sim.forward()
        after = env.step(np.zeros(7))
        env.close()
        print(json.dumps({"before": before, "after": after.success, "terminated": after.terminated,
                          "reward": after.reward}))
    """)
    assert found == {"before": False, "after": True, "terminated": True, "reward": 1.0}


@pytest.mark.slow
def test_the_libero_worker_never_imports_torch():
    found = run_in_libero("""
        import json, sys
        from embodied.sim.worker import single_env_factory
        env = single_env_factory({"name": "libero", "suite": "libero_object", "task_ids": [0], "cameras": [],
                                  "settle_steps": 0})(0)
        env.reset(0)
        env.close()
        print(json.dumps({"torch": "torch" in sys.modules}))
    """)
    assert found == {"torch": False}


def test_libero_config_errors_are_specific():
    with pytest.raises(ConfigError, match="libero_goal"):
        make_libero(LiberoConfig(suite="libero_gaol"), seed=0)
    with pytest.raises(ConfigError, match="image_size"):
        make_libero(LiberoConfig(image_size=100), seed=0)
    with pytest.raises(ConfigError, match="no LIBERO interpreter"):
        make_libero(LiberoConfig(python="/nonexistent/python"), seed=0)
