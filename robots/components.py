"""Importing this module registers every robot (the `robot` config group's names) and every
operator device but the oracle (`teleop`)."""

import embodied.robots.leader_arm  # noqa: F401
import embodied.robots.lerobot_robot  # noqa: F401
import embodied.robots.sim_robot  # noqa: F401
