"""The GPU campaign's simulator steps: the batched physx_cuda env against the CPU env, its
throughput against ManiSkill's own stepping, PPO's learning speed from state, and offscreen
rendering. What the steps share (Scale, StepResult, measure) is in gpu_steps.py."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.gpu_steps import Scale, StepResult, embodied, measure, require_physx_gpu


# ---- 1. correctness: the batched (GPU) env against the CPU env on the same seeds ---------------
def compare_envs(task: str, num_envs: int, sim_backend: str, chunk: int, seed: int) -> dict[str, Any]:
    from embodied.core.env import episode_seed
    from embodied.sim.maniskill import make_maniskill
    from embodied.sim.maniskill_batched import ManiSkillBatchedEnv
    from embodied.sim.maniskill_common import ManiSkillConfig

    config = ManiSkillConfig(task=task, num_envs=num_envs)
    reference = make_maniskill(dataclasses.replace(config, backend="cpu"), seed=seed)
    candidate = ManiSkillBatchedEnv(config, base_seed=seed, sim_backend=sim_backend)
    try:
        seeds = [episode_seed(seed, i, 0) for i in range(num_envs)]
        first = [reference.reset(seeds=seeds).state, candidate.reset(seeds=seeds).state]
        spec = reference.spec
        limit = int(spec.max_episode_steps)
        rng = np.random.default_rng(seed)
        low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
        drift, reward_gap, mismatched, final_kept, episodes = [], [], [], True, [[], []]
        for _ in range(-(-limit // chunk) + 1):  # one chunk into the second episode
            actions = rng.uniform(low, high, (num_envs, chunk, spec.action_dim)).astype(np.float32)
            results = [reference.step(actions), candidate.step(actions)]
            for key in ("terminated", "truncated", "executed_steps"):
                if not np.array_equal(getattr(results[0], key), getattr(results[1], key)):
                    mismatched.append(key)
            done = results[1].done
            if not episodes[0]:  # the first episodes; later ones start from each side's own reset seeds
                reward_gap.append(float(np.abs(results[0].reward - results[1].reward).max()))
                ends = [np.where(r.done[:, None], r.final_observation.state, r.observation.state) for r in results]
                drift.append(float(np.abs(ends[0] - ends[1]).max()))
            if done.any():  # the ended episode's last observation is kept apart from the new one's first
                final = results[1].final_observation.state[done]
                final_kept &= not np.allclose(final, results[1].observation.state[done])
            for side, result in enumerate(results):
                episodes[side] += [(e.env_id, e.length) for e in result.episodes]
        return {
            "task": task,
            "num_envs": num_envs,
            "chunk": chunk,
            "limit": limit,
            "reset_max_abs_diff": float(np.abs(first[0] - first[1]).max()),
            "first_episode_state_drift": max(drift),
            "first_episode_reward_gap": max(reward_gap),
            "flags_mismatched": sorted(set(mismatched)),
            "final_observation_kept": bool(final_kept),
            "episodes_reference": sorted(episodes[0]),
            "episodes_candidate": sorted(episodes[1]),
            "truncated_at_limit": all(length == limit for _, length in episodes[1]) and len(episodes[1]) == num_envs,
        }
    finally:
        reference.close()
        candidate.close()


def correctness(scale: Scale, work: Path) -> StepResult:
    require_physx_gpu(scale)
    rows = [
        measure("compare_envs", task=task, num_envs=scale.sizes(64)[0], sim_backend=scale.sim_backend, chunk=5, seed=3)
        for task in ("PushCube-v1", "PickCube-v1")
    ]
    ok = [
        r["reset_max_abs_diff"] < 1e-4
        and not r["flags_mismatched"]
        and r["final_observation_kept"]
        and r["truncated_at_limit"]
        and r["episodes_reference"] == r["episodes_candidate"]
        for r in rows
    ]
    return StepResult(
        "same seeds give the same first state (< 1e-4); chunked steps end, truncate and auto-reset where the CPU "
        "env does, keeping the final observation",
        all(ok),
        rows,
        [
            "the first episode's state drift and reward gap measure how far GPU and CPU physics part under the "
            "same random actions: reported, not judged (on one backend, as with --smoke, they are zero)"
        ],
    )


# ---- 2. throughput: our batched env against ManiSkill's own stepping ----------------------------
def env_rates(task: str, num_envs: int, obs_mode: str, sim_backend: str, steps: int) -> dict[str, Any]:
    import torch

    from embodied.sim.maniskill_batched import ManiSkillBatchedEnv
    from embodied.sim.maniskill_common import ManiSkillConfig, flatten_state, make_gym_env

    config = ManiSkillConfig(task=task, num_envs=num_envs, obs_mode=obs_mode)
    raw = make_gym_env(config, num_envs, sim_backend)
    raw.reset(seed=0)
    device = raw.unwrapped.device
    action = torch.rand((num_envs, *raw.unwrapped.single_action_space.shape), device=device) * 2 - 1
    for _ in range(3):
        observation, *_ = raw.step(action)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        observation, *_ = raw.step(action)
    synchronize()
    raw_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(steps):
        flatten_state(observation)
    to_host_s = time.perf_counter() - started
    raw.close()
    ours = ManiSkillBatchedEnv(config, base_seed=0, sim_backend=sim_backend)
    actions = np.random.default_rng(0).uniform(-1, 1, (num_envs, 1, ours.spec.action_dim)).astype(np.float32)
    for _ in range(3):
        ours.step(actions)
    started = time.perf_counter()
    for _ in range(steps):
        ours.step(actions)
    ours_s = time.perf_counter() - started
    ours.close()
    return {
        "task": task,
        "obs_mode": obs_mode,
        "num_envs": num_envs,
        "steps": steps,
        "raw_steps_per_s": num_envs * steps / raw_s,
        "ours_steps_per_s": num_envs * steps / ours_s,
        "ratio": raw_s / ours_s,
        "state_to_host_share": to_host_s / raw_s,
    }


def throughput(scale: Scale, work: Path) -> StepResult:
    require_physx_gpu(scale)
    steps = 3 if scale.smoke else 100
    rows = [
        measure(
            "env_rates", task="PushCube-v1", num_envs=n, obs_mode="state", sim_backend=scale.sim_backend, steps=steps
        )
        for n in scale.sizes(256, 1024, 4096)
    ]
    rows += [
        measure("env_rates", task="PushCube-v1", num_envs=n, obs_mode="rgb", sim_backend=scale.sim_backend, steps=steps)
        for n in scale.sizes(64, 256)
    ]
    host = max(r["state_to_host_share"] for r in rows)
    notes = [
        f"copying observations to the host costs up to {host:.0%} of a raw step"
        + (": above 10%, keep them on the GPU through the local runtime (the issue's rule)" if host > 0.1 else "")
    ]
    return StepResult(
        "our batched env steps at >= 0.9x ManiSkill's raw GPU stepping (a cheap policy)",
        all(r["ratio"] >= 0.9 for r in rows),
        rows,
        notes,
    )


# ---- 3. learning speed: PPO from state with physx_cuda ------------------------------------------
PPO_RUNS = {  # ManiSkill's published PPO baselines' settings (examples/baselines/ppo)
    "PushCube-v1": {"num_envs": 2048, "rollout_steps": 20, "total": 2_000_000, "published": "< 1 min"},
    "PickCube-v1": {"num_envs": 1024, "rollout_steps": 50, "total": 10_000_000, "published": "2-5 min"},
}


def ppo(scale: Scale, work: Path) -> StepResult:
    require_physx_gpu(scale)
    rows = []
    for task, run in PPO_RUNS.items():
        env = f"env=maniskill_{task.split('-')[0].lower()}"
        num_envs, total, rollout = (1, 4, 2) if scale.smoke else (run["num_envs"], run["total"], run["rollout_steps"])
        run_dir = work / f"ppo-{task}"
        embodied(
            "train",
            env,
            f"env.backend={scale.env_backend}",
            f"env.num_envs={num_envs}",
            "env.num_workers=0",
            f"algo.rollout_steps={rollout}",
            f"algo.num_minibatches={1 if scale.smoke else 32}",
            "algo.update_epochs=8",
            f"total_env_steps={total}",
            f"runtime.device={scale.device}",
            "eval_every=0",
            "eval_episodes=0",
            f"checkpoint_every={2 if scale.smoke else 5}",
            "keep_checkpoints=1000",
            f"time_limit_s={60 if scale.smoke else 480}",
            "logger.progress_bar=false",
            f"run_dir={run_dir}",
            cwd=work,
            timeout=900,
        )
        curve = checkpoint_successes(run_dir, env, scale, work)
        reached = next(((steps, seconds) for steps, seconds, success in curve if success >= 0.9), None)
        rows.append(
            {
                "task": task,
                "num_envs": num_envs,
                "curve": curve,
                "published": run["published"],
                "env_steps_to_90": reached[0] if reached else None,
                "seconds_to_90": reached[1] if reached else None,
            }
        )
    return StepResult(
        ">= 90% deterministic success, in wall time beside ManiSkill's published PPO baseline",
        all(r["env_steps_to_90"] is not None for r in rows),
        rows,
        [
            "success: each checkpoint evaluated afterwards on CPU envs (16 workers, 64 episodes), so "
            "evaluation never shares the GPU scene"
        ],
    )


def checkpoint_successes(run_dir: Path, env: str, scale: Scale, work: Path) -> list[tuple[int, float, float]]:
    """(env steps, training seconds, deterministic success) of every checkpoint of a run,
    each evaluated on CPU envs (`env`, the run's env option)."""
    from embodied.runs.checkpoint import load_checkpoint_state

    curve = []
    for checkpoint in sorted((run_dir / "checkpoints").glob("iter_*")):
        state = load_checkpoint_state(checkpoint)
        episodes, workers = (1, 0) if scale.smoke else (64, 16)
        output = work / "eval" / run_dir.name / checkpoint.name
        embodied(
            "eval",
            f"checkpoint={checkpoint}",
            env,
            "env.backend=cpu",
            f"env.num_envs={max(workers, 1)}",
            f"env.num_workers={workers}",
            f"episodes={episodes}",
            f"output={output}",
            "progress_bar=false",
            cwd=work,
            timeout=600,
        )
        report = json.loads((output / "report.json").read_text())
        curve.append((int(state["env_steps"]), float(state.get("elapsed_s", 0.0)), report["overall"]["success_rate"]))
    return curve


# ---- 7. offscreen rendering: EGL on the GPU against CPU rendering ---------------------------------
SCENE = """<mujoco><worldbody><light pos="0 0 3"/><geom type="plane" size="1 1 .1"/>
<body pos="0 0 .1"><freejoint/><geom type="box" size=".05 .05 .05" rgba="1 0 0 1"/></body>
<camera name="agentview" pos="0 -1 1" xyaxes="1 0 0 0 .7 .7"/><camera name="wrist" pos=".3 0 .5"
xyaxes="0 1 0 -.7 0 .7"/></worldbody></mujoco>"""


def render_rate(backend: str, size: int, frames: int) -> dict[str, Any]:
    os.environ["MUJOCO_GL"] = backend
    import mujoco

    if not hasattr(mujoco, "Renderer"):  # mujoco leaves it out, silently, when its GL bindings fail to import
        import OpenGL  # noqa: F401  (PyOpenGL, the usual cause: its import error names it)

        raise RuntimeError(f"mujoco {mujoco.__version__} offers no Renderer with MUJOCO_GL={backend}")
    model = mujoco.MjModel.from_xml_string(SCENE)
    data = mujoco.MjData(model)
    renderer = mujoco.Renderer(model, size, size)
    started = time.perf_counter()
    for _ in range(frames):
        mujoco.mj_step(model, data)
        for camera in ("agentview", "wrist"):
            renderer.update_scene(data, camera)
            renderer.render()
    return {"backend": backend, "size": size, "steps_per_s": frames / (time.perf_counter() - started)}


def rendering(scale: Scale, work: Path) -> StepResult:
    rows, notes = (
        [],
        [
            "LIBERO itself cannot travel to the GPU machine (its mujoco 2.3.7 has no Python 3.12 build, "
            "its assets are 622 MB): this renders LIBERO's two 128 px cameras on a small MuJoCo scene"
        ],
    )
    for backend in ("egl", "osmesa"):
        try:
            rows.append(measure("render_rate", backend=backend, size=128, frames=5 if scale.smoke else 500))
        except RuntimeError as error:
            notes.append(f"{backend}: unavailable ({str(error).splitlines()[-1][:200]})")
    return StepResult(
        "steps/s with both cameras rendered through EGL, beside CPU rendering where it runs", None, rows, notes
    )


MEASUREMENTS = {"compare_envs": compare_envs, "env_rates": env_rates, "render_rate": render_rate}
