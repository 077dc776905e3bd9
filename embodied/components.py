"""Imports every built-in component so that its registry entry exists. Modules import their
heavy dependencies (simulators) lazily, so this stays cheap."""

import embodied.algos.grpo  # noqa: F401
import embodied.algos.ppo  # noqa: F401
import embodied.algos.sac_rlpd  # noqa: F401
import embodied.runtime.local  # noqa: F401
import embodied.runtime.procs  # noqa: F401
import embodied.runtime.ray_runtime  # noqa: F401
import embodied.runtime.robots  # noqa: F401
import policies.diffusion  # noqa: F401
import policies.flow  # noqa: F401
import policies.flow_vla  # noqa: F401
import policies.flow_vlm  # noqa: F401
import policies.mlp  # noqa: F401
import policies.pi0  # noqa: F401
import policies.squashed_gaussian  # noqa: F401
import policies.token_vla  # noqa: F401
import sim.gymnasium_env  # noqa: F401
import sim.libero  # noqa: F401
import sim.maniskill  # noqa: F401
import sim.robosuite_env  # noqa: F401
