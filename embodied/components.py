"""Imports every built-in component so that its registry entry exists: the simulators, the
policies, the algorithms and the runtimes' schemas. The application's first config
validation imports it (`embodied.config.validate_group`); components never do. Modules
import their heavy dependencies (simulators) lazily, so this stays cheap."""

import embodied.algos.dsrl  # noqa: F401
import embodied.algos.grpo  # noqa: F401
import embodied.algos.ppo  # noqa: F401
import embodied.algos.sac_rlpd  # noqa: F401
import embodied.policies.denoising.diffusion  # noqa: F401
import embodied.policies.denoising.flow  # noqa: F401
import embodied.policies.gaussian.mlp  # noqa: F401
import embodied.policies.gaussian.squashed_gaussian  # noqa: F401
import embodied.policies.pretrained.openvla  # noqa: F401
import embodied.policies.pretrained.pi0  # noqa: F401
import embodied.policies.pretrained.smolvla  # noqa: F401
import embodied.policies.vla.flow_vla  # noqa: F401
import embodied.policies.vla.token_vla  # noqa: F401
import embodied.policies.vla.vlm_expert  # noqa: F401
import embodied.runtime.configs  # noqa: F401
import embodied.sim.genesis  # noqa: F401
import embodied.sim.gymnasium_env  # noqa: F401
import embodied.sim.libero  # noqa: F401
import embodied.sim.maniskill  # noqa: F401
import embodied.sim.robosuite_env  # noqa: F401
