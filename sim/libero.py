"""LIBERO tasks (libero_spatial, libero_object, libero_goal, libero_10, libero_90) behind the
batched env interface, offline, with the community's evaluation protocol, and the LIBERO-PRO
perturbations of the first four that the LIBERO package ships (`<suite>_<perturbation>`):
`lan` (the instruction paraphrased), `object` (objects' appearance changed), `swap` (objects'
positions swapped) and `task` (another goal in the same scene). A perturbed suite keeps its
base suite's step limit; its instruction is the one its task file states where the
perturbation changed it (`lan`, `task`), else the base suite's.

- an episode reset with seed `s` starts from the task's standard init state `s mod 50`, with
  numpy's random state (which robosuite uses to jitter fixtures on every reset) seeded with
  `s`: the same seed gives the same scene, and evaluation passes trial numbers as seeds, so
  trial k is init state k everywhere;
- after the init state, `settle_steps` no-op actions (gripper open) let objects come to rest;
- a reset rebuilds the scene as robosuite's hard reset does, but on a copy of the model the
  worker compiled the first time (`CompiledScenes`): the same observations bit for bit, and
  about 2 s less per episode on a CPU;
- episodes end at success (the task's own goal check) or at the suite's step limit:
  spatial 220, object 280, goal 300, libero_10 520, libero_90 400;
- images (agentview, wrist) are rotated 180 degrees from robosuite's render so that up is up;
  proprio state is end-effector position (3), end-effector orientation as axis-angle (3) and
  gripper finger positions (2); actions are 7-d delta end-effector pose + gripper in [-1, 1].

LIBERO needs robosuite 1.4 and therefore its own virtualenv (`tools/setup.sh` makes
`.venv-libero`). Its envs always live in env worker processes under that interpreter
(`env.python`), reached over ZeroMQ; this module imports LIBERO only inside those workers."""

from __future__ import annotations

import copy
import hashlib
import math
import os
import re
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence

import numpy as np

from embodied.core.env import BatchedEnv, SingleEnv, SingleObservation, SingleStep
from embodied.core.errors import ConfigError
from embodied.core.paths import simulator_python
from embodied.core.registry import ENVS, unknown_name_message
from embodied.core.types import EnvSpec
from embodied.sim.latency import LatencyConfig

BASE_STEP_LIMITS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
PERTURBATIONS = ("lan", "object", "swap", "task")  # LIBERO-PRO's, as the package ships them
PRO_SUITES = {
    f"{base}_{p}": base
    for base in ("libero_spatial", "libero_object", "libero_goal", "libero_10")
    for p in PERTURBATIONS
}
SUITE_STEP_LIMITS = {**BASE_STEP_LIMITS, **{suite: BASE_STEP_LIMITS[base] for suite, base in PRO_SUITES.items()}}
SUITE_TASK_COUNTS = {suite: 90 if suite == "libero_90" else 10 for suite in SUITE_STEP_LIMITS}
CAMERAS = {"agentview": "agentview_image", "wrist": "robot0_eye_in_hand_image"}
IMAGE_SIZES = (128, 224, 256)
NOOP = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)  # hold still, gripper open
STATE_DIM = 8
ACTION_DIM = 7
CONTROL_HZ = 20.0


@dataclass
class LiberoConfig:
    MIN_WORKERS: ClassVar[int] = 1  # LIBERO cannot run in the trainer's interpreter
    name: str = "libero"
    suite: str = "libero_spatial"
    task_ids: Optional[list[int]] = None  # None: every task of the suite; env i runs task_ids[i % n]
    num_envs: int = 10
    num_workers: int = 2  # LIBERO envs always run in worker processes under `python`
    python: Optional[str] = None  # the LIBERO virtualenv's interpreter (default: .venv-libero)
    image_size: int = 128  # 128 | 224 | 256, square
    cameras: list[str] = field(default_factory=lambda: ["agentview", "wrist"])  # [] for state only
    settle_steps: int = 10  # no-op steps after the init state, as the standard evaluation does
    max_episode_steps: Optional[int] = None  # None: the suite's standard limit
    render_size: int = 256  # frames for videos
    mujoco_gl: str = "egl"  # offscreen rendering backend: egl | osmesa
    transport: str = "zmq"
    latency: LatencyConfig = field(default_factory=LatencyConfig)  # delays between world and policy (docs/robots.md)


def check_config(cfg: LiberoConfig) -> None:
    if cfg.suite not in SUITE_STEP_LIMITS:
        raise ConfigError(unknown_name_message("LIBERO suite (env.suite)", cfg.suite, sorted(SUITE_STEP_LIMITS)))
    if cfg.image_size not in IMAGE_SIZES:
        raise ConfigError(f"env.image_size must be one of {IMAGE_SIZES}, got {cfg.image_size}")
    unknown = [c for c in cfg.cameras if c not in CAMERAS]
    if unknown:
        raise ConfigError(f"env.cameras: unknown {unknown}; known: {sorted(CAMERAS)}")
    if cfg.num_envs < 1 or cfg.num_workers < 1:
        raise ConfigError("LIBERO needs env.num_envs >= 1 and env.num_workers >= 1 (it runs in worker processes)")
    if cfg.transport != "zmq":
        raise ConfigError("LIBERO runs under its own interpreter, reached only with env.transport=zmq")
    if cfg.settle_steps < 0:
        raise ConfigError(f"env.settle_steps must be >= 0, got {cfg.settle_steps}")


def libero_python(cfg: LiberoConfig) -> str:
    """`env.python`, else the .venv-libero that tools/setup.sh makes in a checkout."""
    return simulator_python(cfg.python, "LIBERO", ".venv-libero", "`pip install 'embodied-rl[libero]'`")


def quat_to_axis_angle(quat_xyzw: np.ndarray) -> np.ndarray:
    """robosuite's (x, y, z, w) quaternion as an axis-angle vector."""
    x, y, z, w = (float(v) for v in quat_xyzw)
    w = min(max(w, -1.0), 1.0)
    sin_half = math.sqrt(max(1.0 - w * w, 0.0))
    if sin_half < 1e-8:
        return np.zeros(3)
    angle = 2.0 * math.acos(w)
    return np.array([x, y, z]) / sin_half * angle


def stated_instruction(bddl_file: str) -> str:
    """The `(:language ...)` a task file states. LIBERO names the standard instruction after
    the file; LIBERO-PRO's paraphrases and new goals exist only here."""
    match = re.search(r"\(:language\s+([^)]*)\)", Path(bddl_file).read_text())
    if match is None:
        raise ConfigError(f"{bddl_file} states no (:language ...)")
    return " ".join(match.group(1).split())


class CompiledScenes:
    """The models of the scenes this worker has compiled, reused on every reset.

    LIBERO resets as robosuite's hard reset does: each episode rebuilds the scene's XML and
    compiles it anew, about 2 s of a 3 s reset on a CPU, though the XML comes out the same
    byte for byte (fixtures are jittered in the simulation state afterwards, not in the XML).
    Here each distinct XML is compiled once, and every reset gets a copy of that model
    (`mj_copyModel`, about 0.15 s): the model a compile would give, and nothing an episode
    changes in it reaches the next. At most one model per env of this worker is kept."""

    def __init__(self) -> None:
        self.models: OrderedDict[bytes, Any] = OrderedDict()
        self.capacity = 0
        self.compiles = 0

    def install(self) -> None:
        """robosuite's `MjSim.from_xml_string` reads from here, in this process; one more
        scene is kept for each env that installs it."""
        from robosuite.utils import binding_utils

        self.capacity += 1
        if getattr(binding_utils.MjSim.from_xml_string, "__self__", None) is not self:
            binding_utils.MjSim.from_xml_string = self.sim

    def sim(self, xml: str) -> Any:
        import mujoco
        from robosuite.utils.binding_utils import MjSim

        key = hashlib.sha256(xml.encode()).digest()
        if key in self.models:
            self.models.move_to_end(key)
        else:
            self.models[key] = mujoco.MjModel.from_xml_string(xml)
            self.compiles += 1
            while len(self.models) > self.capacity:
                self.models.popitem(last=False)
        return MjSim(copy.copy(self.models[key]))


SCENES = CompiledScenes()


class LiberoEnv(SingleEnv):
    """One LIBERO task in this (worker) process."""

    def __init__(self, cfg: LiberoConfig, env_id: int = 0):
        os.environ.setdefault("MUJOCO_GL", cfg.mujoco_gl)
        os.environ.setdefault("PYOPENGL_PLATFORM", cfg.mujoco_gl)
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs.env_wrapper import ControlEnv

        check_config(cfg)
        SCENES.install()
        suite = benchmark.get_benchmark_dict()[cfg.suite]()
        task_ids = cfg.task_ids if cfg.task_ids is not None else list(range(suite.n_tasks))
        bad = [t for t in task_ids if not 0 <= t < suite.n_tasks]
        if bad:
            raise ConfigError(f"env.task_ids {bad} are not in {cfg.suite} (tasks 0-{suite.n_tasks - 1})")
        self.task_id = task_ids[env_id % len(task_ids)]
        task = suite.get_task(self.task_id)
        self.task = f"{cfg.suite}/{self.task_id}:{task.name}"
        self.init_states = suite.get_task_init_states(self.task_id)
        bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
        self.instruction = str(task.language)
        if cfg.suite in PRO_SUITES:
            base_bddl = os.path.join(get_libero_path("bddl_files"), PRO_SUITES[cfg.suite], task.bddl_file)
            stated = stated_instruction(bddl)
            if not os.path.isfile(base_bddl) or stated != stated_instruction(base_bddl):
                self.instruction = stated
        self.cfg = cfg
        self.cameras = list(cfg.cameras)
        size = cfg.image_size
        # LIBERO's OffScreenRenderEnv, whose offscreen renderer (a GL context made anew on every
        # reset, about 1 s on a CPU) a state-only env makes only when a video asks for a frame
        self.env = ControlEnv(
            bddl_file_name=bddl,
            camera_heights=size,
            camera_widths=size,
            has_renderer=False,
            has_offscreen_renderer=bool(self.cameras),
            use_camera_obs=bool(self.cameras),
        )
        self.limit = cfg.max_episode_steps or SUITE_STEP_LIMITS[cfg.suite]
        self.steps = 0
        self.spec = EnvSpec(
            state_dim=STATE_DIM,
            action_dim=ACTION_DIM,
            action_low=(-1.0,) * ACTION_DIM,
            action_high=(1.0,) * ACTION_DIM,
            image_shapes={c: (size, size, 3) for c in self.cameras},
            max_episode_steps=self.limit,
            control_hz=CONTROL_HZ,
        )

    def _observation(self, raw: dict[str, Any]) -> SingleObservation:
        state = np.concatenate(
            [raw["robot0_eef_pos"], quat_to_axis_angle(raw["robot0_eef_quat"]), raw["robot0_gripper_qpos"]]
        ).astype(np.float32)
        # robosuite renders upside down and mirrored; a 180-degree turn shows the scene upright
        images = {c: np.ascontiguousarray(raw[CAMERAS[c]][::-1, ::-1]) for c in self.cameras}
        return SingleObservation(state=state, images=images)

    def reset(self, seed: int) -> SingleObservation:
        np.random.seed(seed % 2**32)  # robosuite places fixtures with numpy's global generator
        self.env.reset()
        raw = self.env.set_init_state(self.init_states[seed % len(self.init_states)])
        for _ in range(self.cfg.settle_steps):
            raw, _, _, _ = self.env.step(NOOP)
        self.steps = 0
        return self._observation(raw)

    def step(self, action: np.ndarray) -> SingleStep:
        raw, _, _, _ = self.env.step(np.asarray(action, dtype=np.float64))
        self.steps += 1
        success = bool(self.env.check_success())
        return SingleStep(
            observation=self._observation(raw),
            reward=float(success),  # LIBERO's reward: 1 at success, else 0
            terminated=success,
            truncated=not success and self.steps >= self.limit,
            success=success,
        )

    def render(self) -> np.ndarray:
        robosuite_env = self.env.env
        if robosuite_env.sim._render_context_offscreen is None:
            from robosuite.utils.binding_utils import MjRenderContextOffscreen

            # the renderer robosuite's reset makes for an env with cameras, set up as it sets it
            # up; making it runs the model forward, so this first frame shows the poses of the
            # current state, where robosuite's show them as of the last physics substep
            context = MjRenderContextOffscreen(robosuite_env.sim, device_id=robosuite_env.render_gpu_device_id)
            context.vopt.geomgroup[0] = 1 if robosuite_env.render_collision_mesh else 0
            context.vopt.geomgroup[1] = 1 if robosuite_env.render_visual_mesh else 0
        frame = robosuite_env.sim.render(
            height=self.cfg.render_size, width=self.cfg.render_size, camera_name="agentview"
        )
        return np.ascontiguousarray(frame[::-1, ::-1])

    def close(self) -> None:
        self.env.close()


@ENVS.register("libero", LiberoConfig)
def make_libero(cfg: LiberoConfig, seed: int, stream: int = 0, env_ids: Sequence[int] | None = None) -> BatchedEnv:
    from embodied.sim.vector import vectorize_config

    check_config(cfg)
    config = {**asdict(cfg), "python": libero_python(cfg)}
    return vectorize_config(LiberoEnv, cfg, seed, stream, env_ids, transport="zmq", env_config=config)
