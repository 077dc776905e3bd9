"""Every camera frame and a video frame of each ManiSkill task this project offers, rendered
by this process (`python -m tests.sim.camera_frames stock|lean OUT.npz`): `stock` with SAPIEN's
own shaders (ManiSkill's gym env as it comes), `lean` as the adapter builds it
(sim/sapien_shaders.py). tests/sim/test_maniskill.py compares the two."""

from __future__ import annotations

import sys

import numpy as np


def frames(mode: str) -> dict[str, np.ndarray]:
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  (registers the tasks)

    from embodied.sim.maniskill_common import INSTRUCTIONS, ManiSkillConfig, make_gym_env

    out = {}
    for task in INSTRUCTIONS:
        robot = "panda_wristcam" if task == "PickCube-v1" else None
        config = ManiSkillConfig(task=task, obs_mode="rgb", image_size=32, render_size=64, robot=robot)
        if mode == "lean":
            env = make_gym_env(config, 1, "physx_cpu")
        else:  # the same arguments, straight to ManiSkill
            kwargs = dict(obs_mode="rgb", num_envs=1, sim_backend="physx_cpu", render_mode="rgb_array")
            kwargs.update(render_backend="cpu", control_mode=config.control_mode, reward_mode=config.reward_mode)
            kwargs.update(human_render_camera_configs=dict(width=64, height=64))
            kwargs.update(sensor_configs=dict(width=32, height=32))
            env = gym.make(task, **kwargs, **({"robot_uids": robot} if robot else {}))
        observation, _ = env.reset(seed=3)
        observation, *_ = env.step(env.action_space.sample() * 0)
        for camera, data in observation["sensor_data"].items():
            out[f"{task}/{camera}"] = data["rgb"].numpy()
        out[f"{task}/video"] = env.render().numpy()
        env.close()
    return out


if __name__ == "__main__":
    np.savez(sys.argv[2], **frames(sys.argv[1]))
