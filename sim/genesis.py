"""Genesis (`genesis-world`): many envs in one batched scene, stepped as tensors, on a CPU or a
GPU, with tasks written from its API to match ManiSkill's (`env=genesis_pickcube`).

Genesis pins what the main virtualenv cannot share (numpy 2, mujoco 4), so, as LIBERO does, it
runs in env worker processes under its own interpreter (`.venv-genesis`, made by
tools/setup.sh; `env.python` elsewhere), reached over ZeroMQ. Unlike the other simulators a
worker holds one scene of all its envs (`GenesisEnvs`): an action chunk steps them together,
an env whose episode ends inside the chunk is held still for the rest of it (its extra steps
count for nothing), and it is reset, its final observation kept for bootstrapping, once the
chunk is done. Each env's episodes are seeded as every env's are (`episode_seed`), so a run
is repeatable and a partial reset leaves the other envs as they were.

PickCube, as ManiSkill's PickCube-v1: a Franka Panda with `pd_ee_delta_pos` control (an action
is a move of the tool centre point of up to 10 cm on each axis and a gripper target, through
damped least-squares inverse kinematics), a 4 cm cube and a goal point up to 30 cm above the
table, the same 42-dimensional state (the arm's 9 joint positions and velocities, whether the
cube is grasped, the TCP pose, the goal, the cube's pose and the two offsets), the same dense
reward (reaching, grasping, placing, holding still; normalised by its maximum 5), success when
the cube is within 2.5 cm of the goal and the arm is still, 50 steps at 20 Hz. Differences from
ManiSkill's (docs/genesis.md): Genesis's physics and its Panda model, a flat floor for a
table, the grasp read from finger contacts and opening, and inverse kinematics by one damped
least-squares step per substep."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Sequence

import numpy as np

from embodied.core.env import BatchedEnv, episode_seed
from embodied.core.errors import ConfigError
from embodied.core.registry import ENVS, unknown_name_message
from embodied.core.types import EnvSpec
from embodied.sim.latency import LatencyConfig
from embodied.sim.worker_envs import step_reply

TASKS = {"PickCube": "pick up the red cube and move it to the goal"}
CONTROL_HZ = 20.0
SUBSTEPS = 5  # physics steps of 0.01 s per control step, as ManiSkill's 100 Hz sim under 20 Hz control
STATE_DIM = 42
ACTION_DIM = 4  # TCP move (3, in [-1, 1] for +-10 cm) and gripper target (-1 closed .. 1 open)
CUBE_HALF = 0.02
GOAL_THRESHOLD = 0.025
SPAWN_HALF = 0.1  # cube and goal xy within +-10 cm of the spawn centre
SPAWN_CENTRE = (0.615, 0.0)  # ManiSkill puts the robot base 61.5 cm behind the table's centre
MAX_GOAL_HEIGHT = 0.3
TCP_OFFSET = 0.1034  # from the hand link to the fingertips' centre, along the hand's z axis
HOME = (0.0, np.pi / 8, 0.0, -5 * np.pi / 8, 0.0, 3 * np.pi / 4, np.pi / 4, 0.04, 0.04)  # ManiSkill's rest pose
HOME_NOISE = 0.02
MOVE = 0.1  # metres per unit of action
DAMPING = 1e-4  # the damped least squares' lambda squared
HOLD = np.array([0.0, 0.0, 0.0, 1.0], dtype=np.float32)  # what a finished env does for the rest of a chunk
FINGER_RANGE = (-0.01, 0.04)  # the finger joints' targets for gripper -1 .. 1
DEVICES = ("cpu", "cuda")
COMPILE_TIMEOUT_S = 900.0
REWARD_MODES = ("normalized_dense", "sparse")


@dataclass
class GenesisConfig:
    MIN_WORKERS: ClassVar[int] = 1  # Genesis cannot run in the trainer's interpreter
    name: str = "genesis"
    task: str = "PickCube"  # the one task so far (ManiSkill's PickCube-v1, written for Genesis)
    num_envs: int = 64  # in all, split over the workers
    num_workers: int = 1  # each worker holds one scene of its share of the envs
    python: Optional[str] = None  # the Genesis virtualenv's interpreter (default: .venv-genesis)
    device: str = "cpu"  # cpu | cuda: where the scene's kernels run
    threads: int = 1  # CPU threads of each worker's kernels
    max_episode_steps: int = 50  # control steps at 20 Hz, as ManiSkill's PickCube-v1
    reward_mode: str = "normalized_dense"  # normalized_dense | sparse (1 on success)
    ignore_terminations: bool = False  # True: success does not end an episode, as ManiSkill's PPO trains
    transport: str = "zmq"  # the only one: the workers run under another interpreter
    latency: LatencyConfig = field(default_factory=LatencyConfig)  # not supported: refused unless zero


def check_config(cfg: GenesisConfig) -> None:
    if cfg.task not in TASKS:
        raise ConfigError(unknown_name_message("Genesis task (env.task)", cfg.task, sorted(TASKS)))
    if cfg.device not in DEVICES:
        raise ConfigError(f"env.device must be one of {DEVICES}, got '{cfg.device}'")
    if cfg.reward_mode not in REWARD_MODES:
        raise ConfigError(f"env.reward_mode must be one of {REWARD_MODES}, got '{cfg.reward_mode}'")
    if cfg.num_envs < 1 or cfg.num_workers < 1:
        raise ConfigError("Genesis needs env.num_envs >= 1 and env.num_workers >= 1 (it runs in worker processes)")
    if cfg.max_episode_steps < 1 or cfg.threads < 1:
        raise ConfigError("env.max_episode_steps and env.threads must be >= 1")
    if cfg.transport != "zmq":
        raise ConfigError("Genesis runs under its own interpreter, reached only with env.transport=zmq")
    if cfg.latency.active:
        raise ConfigError("env.latency is not supported on Genesis's batched scene; leave it at zero")


def genesis_python(cfg: GenesisConfig) -> str:
    """`env.python`, else the .venv-genesis that tools/setup.sh makes in a checkout."""
    from embodied.core.paths import simulator_python

    install = "`pip install genesis-world==1.4.5 pyzmq msgpack` and `pip install --no-deps embodied-rl`"
    return simulator_python(cfg.python, "Genesis", ".venv-genesis", install)


@ENVS.register("genesis", GenesisConfig)
def make_genesis(cfg: GenesisConfig, seed: int, stream: int = 0, env_ids: Sequence[int] | None = None) -> BatchedEnv:
    from dataclasses import asdict

    from embodied.core.env import select_env_ids
    from embodied.sim.vector import vectorize

    check_config(cfg)
    config = {**asdict(cfg), "python": genesis_python(cfg)}
    ids = select_env_ids(cfg.num_envs, env_ids)
    # a first scene compiles Genesis's kernels (minutes; cached after) before its worker answers
    return vectorize(None, ids, cfg.num_workers, seed, stream, "zmq", config, worker_timeout_s=COMPILE_TIMEOUT_S)


# ---- the worker side: one scene of every env this worker holds --------------------------------------
class GenesisEnvs:
    """The commands of `embodied.sim.worker_envs.WorkerEnvs` over one batched Genesis scene."""

    def __init__(self, cfg: GenesisConfig, env_ids: Sequence[int], base_seed: int, stream: int = 0):
        os.environ.setdefault("QD_NUM_THREADS", str(cfg.threads))
        import genesis as gs
        import torch

        self.torch, self.cfg = torch, cfg
        self.env_ids = list(env_ids)
        self.n = n = len(self.env_ids)
        self.base_seed, self.stream = base_seed, stream
        if not getattr(gs, "_initialized", False):
            gs.init(backend=gs.cpu if cfg.device == "cpu" else gs.gpu, precision="32", logging_level="error")
        self.scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=1.0 / CONTROL_HZ, substeps=SUBSTEPS),
            rigid_options=gs.options.RigidOptions(enable_collision=True, enable_joint_limit=True),
            show_viewer=False,
        )
        self.scene.add_entity(gs.morphs.Plane())
        self.robot = self.scene.add_entity(gs.morphs.MJCF(file="xml/franka_emika_panda/panda.xml"))
        self.cube = self.scene.add_entity(gs.morphs.Box(size=(2 * CUBE_HALF,) * 3, pos=(*SPAWN_CENTRE, CUBE_HALF)))
        self.scene.build(n_envs=n)
        self.device = device = gs.device  # where the scene's tensors live
        # the PD gains Genesis's own Panda examples use
        self.robot.set_dofs_kp(torch.tensor([4500, 4500, 3500, 3500, 2000, 2000, 2000, 100, 100.0], device=device))
        self.robot.set_dofs_kv(torch.tensor([450, 450, 350, 350, 200, 200, 200, 10, 10.0], device=device))
        self.hand = self.robot.get_link("hand")
        self.fingers = [self.robot.get_link(name).idx for name in ("left_finger", "right_finger")]
        self.goal = torch.zeros(n, 3, device=device)
        self.episode = np.full(n, -1, dtype=np.int64)
        self.seed = np.zeros(n, dtype=np.int64)
        self.length = np.zeros(n, dtype=np.int64)
        self.episode_return = np.zeros(n)
        self.episode_success = np.zeros(n, dtype=bool)
        self.spec = EnvSpec(
            state_dim=STATE_DIM,
            action_dim=ACTION_DIM,
            action_low=(-1.0,) * ACTION_DIM,
            action_high=(1.0,) * ACTION_DIM,
            max_episode_steps=cfg.max_episode_steps,
            control_hz=CONTROL_HZ,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "tasks": [self.cfg.task] * self.n,
            "instructions": [TASKS[self.cfg.task]] * self.n,
        }

    # ---- episodes ------------------------------------------------------------------------------------
    def reset(self, local_idx: Sequence[int] | None = None, seeds: Sequence[int] | None = None) -> dict[str, Any]:
        rows = list(range(self.n)) if local_idx is None else [int(i) for i in local_idx]
        if rows:
            self._start(rows, seeds)
        return self._observation()

    def observe(self) -> dict[str, Any]:
        return self._observation()

    def rewind(self) -> dict[str, Any]:
        self.episode[:] = -1
        return self.reset()

    def _start(self, rows: list[int], seeds: Sequence[int] | None) -> None:
        """New episodes in `rows`: each one's robot, cube and goal drawn from its own seed."""
        torch = self.torch
        qpos, cube, quat = [], [], []
        for k, i in enumerate(rows):
            self.episode[i] += 1
            seed = episode_seed(self.base_seed, self.env_ids[i], int(self.episode[i]), self.stream)
            self.seed[i] = seed if seeds is None else int(seeds[k])
            rng = np.random.default_rng(int(self.seed[i]))
            noise = np.concatenate([rng.normal(0.0, HOME_NOISE, 7), np.zeros(2)])
            qpos.append(np.asarray(HOME) + noise)
            xy = np.asarray(SPAWN_CENTRE) + rng.uniform(-SPAWN_HALF, SPAWN_HALF, 2)
            cube.append([*xy, CUBE_HALF])
            yaw = rng.uniform(0.0, 2 * np.pi)
            quat.append([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)])
            goal_xy = np.asarray(SPAWN_CENTRE) + rng.uniform(-SPAWN_HALF, SPAWN_HALF, 2)
            self.goal[i] = torch.tensor([*goal_xy, CUBE_HALF + rng.uniform(0.0, MAX_GOAL_HEIGHT)], device=self.device)
            self.length[i], self.episode_return[i], self.episode_success[i] = 0, 0.0, False
        idx = torch.tensor(rows, device=self.device)
        as_tensor = lambda values: torch.tensor(np.asarray(values), dtype=torch.float32, device=self.device)  # noqa: E731
        self.robot.set_qpos(as_tensor(qpos), envs_idx=idx, zero_velocity=True)
        self.robot.control_dofs_position(as_tensor(qpos), envs_idx=idx)
        self.cube.set_pos(as_tensor(cube), envs_idx=idx, zero_velocity=True)
        self.cube.set_quat(as_tensor(quat), envs_idx=idx, zero_velocity=True)

    # ---- stepping ------------------------------------------------------------------------------------
    def step(self, chunk: np.ndarray) -> dict[str, Any]:
        n, chunk_size, action_dim = chunk.shape
        chunk = np.clip(chunk, -1.0, 1.0).astype(np.float32)
        active = np.ones(n, dtype=bool)
        reward = np.zeros(n, dtype=np.float32)
        terminated, truncated, success = (np.zeros(n, dtype=bool) for _ in range(3))
        executed_steps = np.zeros(n, dtype=np.int64)
        executed_action = np.zeros((n, chunk_size, action_dim), dtype=np.float32)
        final_state = np.zeros((n, STATE_DIM), dtype=np.float32)
        for j in range(chunk_size):
            actions = np.where(active[:, None], chunk[:, j], HOLD)  # a finished env holds still
            self._act(actions)
            info = self._evaluate()
            step_reward = self._reward(info)
            reward += np.where(active, step_reward, 0.0).astype(np.float32)
            executed_action[active, j] = chunk[active, j]
            executed_steps += active
            self.length += active
            success |= info["success"] & active
            ended_here = active & info["success"] & (not self.cfg.ignore_terminations)
            out_of_time = active & ~ended_here & (self.length >= self.cfg.max_episode_steps)
            terminated |= ended_here
            truncated |= out_of_time
            if (ended_here | out_of_time).any():
                final_state[ended_here | out_of_time] = info["state"][ended_here | out_of_time]
            active &= ~(ended_here | out_of_time)
            if not active.any():
                break
        self.episode_return += reward
        self.episode_success |= success
        done = terminated | truncated
        episodes = [
            [
                self.env_ids[i],
                self.cfg.task,
                float(self.episode_return[i]),
                int(self.length[i]),
                bool(self.episode_success[i]),
            ]
            for i in np.flatnonzero(done)
        ]
        state = info["state"]  # where the chunk's last step left every env
        final_state[~done] = state[~done]
        if done.any():
            self._start([int(i) for i in np.flatnonzero(done)], None)
            state = self._state()
        return step_reply(
            {"state": state, "images": {}},
            {"state": final_state, "images": {}},
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=success,
            executed_steps=executed_steps,
            executed_action=executed_action,
            episodes=episodes,
        )

    def _act(self, actions: np.ndarray) -> None:
        """pd_ee_delta_pos, as ManiSkill's: the TCP's target is where it is plus the move, in
        the same orientation; one damped least-squares step of the arm's joints towards it
        sets the joints' targets, which the PD controllers track over the step's substeps."""
        torch = self.torch
        actions = torch.as_tensor(actions, device=self.device)
        error = (MOVE * actions[:, :3]).unsqueeze(-1)
        jacobian = self.robot.get_jacobian(link=self.hand)[:, :3, :7]  # the hand's: the TCP moves with it
        damped = jacobian @ jacobian.mT + DAMPING * torch.eye(3, device=self.device)
        dq = (jacobian.mT @ torch.linalg.solve(damped, error)).squeeze(-1)
        low, high = FINGER_RANGE
        fingers = (low + (actions[:, 3:4] + 1) / 2 * (high - low)).expand(-1, 2)
        self.robot.control_dofs_position(torch.cat([self.robot.get_qpos()[:, :7] + dq, fingers], 1))
        self.scene.step()

    # ---- what the task reads -------------------------------------------------------------------------
    def _tcp(self) -> tuple[Any, Any]:
        """The tool centre point's position (n, 3) and the hand's orientation (n, 4, wxyz)."""
        from genesis.utils.geom import transform_by_quat

        quat = self.hand.get_quat()
        offset = self.torch.tensor([0.0, 0.0, TCP_OFFSET], device=self.device).expand(self.n, 3)
        return self.hand.get_pos() + transform_by_quat(offset, quat), quat

    def _grasped(self) -> np.ndarray:
        """Both fingers touch the cube and the gripper is not shut on nothing."""
        contacts = self.robot.get_contacts(with_entity=self.cube)
        links = contacts["link_a"], contacts["link_b"]
        valid = contacts.get("valid_mask")
        touching = []
        for finger in self.fingers:
            hit = (links[0] == finger) | (links[1] == finger)
            if valid is not None:
                hit = hit & valid
            touching.append(hit.any(-1).cpu().numpy() if hit.dim() > 1 else hit.cpu().numpy())
        opening = self.robot.get_qpos()[:, 7:9].sum(1).cpu().numpy()
        return touching[0] & touching[1] & (opening > CUBE_HALF)

    def _evaluate(self) -> dict[str, np.ndarray]:
        torch = self.torch
        tcp, hand_quat = self._tcp()
        cube_pos, cube_quat = self.cube.get_pos(), self.cube.get_quat()
        qpos, qvel = self.robot.get_qpos(), self.robot.get_dofs_velocity()
        grasped = self._grasped()
        placed = (torch.linalg.norm(self.goal - cube_pos, dim=1) <= GOAL_THRESHOLD).cpu().numpy()
        still = (qvel[:, :7].abs().max(1).values <= 0.2).cpu().numpy()
        state = torch.cat(
            [
                qpos,
                qvel,
                torch.as_tensor(grasped, dtype=torch.float32, device=self.device)[:, None],
                tcp,
                hand_quat,
                self.goal,
                cube_pos,
                cube_quat,
                cube_pos - tcp,
                self.goal - cube_pos,
            ],
            1,
        )
        return {
            "state": state.cpu().numpy().astype(np.float32),
            "success": placed & still,
            "placed": placed,
            "grasped": grasped,
            "reach": torch.linalg.norm(cube_pos - tcp, dim=1).cpu().numpy(),
            "place": torch.linalg.norm(self.goal - cube_pos, dim=1).cpu().numpy(),
            "speed": torch.linalg.norm(qvel[:, :7], dim=1).cpu().numpy(),
        }

    def _reward(self, info: dict[str, np.ndarray]) -> np.ndarray:
        """ManiSkill's PickCube dense reward over its maximum 5, or 1 on success (sparse)."""
        if self.cfg.reward_mode == "sparse":
            return info["success"].astype(np.float32)
        grasped = info["grasped"].astype(np.float64)
        reward = 1 - np.tanh(5 * info["reach"]) + grasped
        reward += (1 - np.tanh(5 * info["place"])) * grasped
        reward += (1 - np.tanh(5 * info["speed"])) * info["placed"]
        return (np.where(info["success"], 5.0, reward) / 5).astype(np.float32)

    def _state(self) -> np.ndarray:
        return self._evaluate()["state"]

    def _observation(self) -> dict[str, Any]:
        return {"state": self._state(), "images": {}}

    # ---- what the other commands need ----------------------------------------------------------------
    def render(self, local_idx: int) -> np.ndarray:
        raise ConfigError("Genesis renders no frames here: its CPU cameras run at about 18 frames/s")

    def expert_actions(self) -> np.ndarray:
        return pick_cube_expert(self._state())

    def resume_state(self) -> None:
        """None: its envs step together, so one env's episode cannot be replayed alone; a
        resumed run starts fresh episodes, as on ManiSkill's batched scene."""
        return None

    def restore(self, saved: dict[str, Any]) -> dict[str, Any]:
        raise ConfigError("env=genesis cannot restore a saved mid-episode state")

    def close(self) -> None:
        pass


# where PickCube's state keeps what the expert reads
TCP, GOAL, CUBE, GRASPED = slice(19, 22), slice(26, 29), slice(29, 32), 18
APPROACH = 0.05  # the expert lines up this far above the cube before it descends


def pick_cube_expert(state: np.ndarray) -> np.ndarray:
    """A scripted PickCube expert reading the state (B, 42): above the cube, down to it,
    close, then to the goal and hold still there; (B, 4) actions."""
    tcp, cube, goal = state[:, TCP], state[:, CUBE], state[:, GOAL]
    grasped = state[:, GRASPED] > 0.5
    above = cube + np.array([0.0, 0.0, APPROACH])
    lined_up = np.linalg.norm((cube - tcp)[:, :2], axis=1) < 0.01
    down = tcp[:, 2] - cube[:, 2] < 0.01
    target = np.where((lined_up & ~grasped)[:, None], cube, above)
    target = np.where(grasped[:, None], goal, target)
    gripper = np.where(grasped | (lined_up & down), -1.0, 1.0)
    move = np.clip((target - tcp) / MOVE, -1.0, 1.0)
    move = np.where((lined_up & down & ~grasped)[:, None], 0.0, move)  # closing: hold still
    return np.concatenate([move, gripper[:, None]], 1).astype(np.float32)


if __name__ == "__main__":  # tools/setup.sh: compile the kernels once, and check the install
    warm = GenesisEnvs(GenesisConfig(num_envs=2), [0, 1], base_seed=0)
    warm.reset()
    warm.step(np.zeros((2, 1, ACTION_DIM), dtype=np.float32))
    print("Genesis: a PickCube scene built and stepped")
