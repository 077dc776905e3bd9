"""Importing this module registers every robot (the `robot` config group's names)."""

import embodied.robots.lerobot_robot  # noqa: F401
import embodied.robots.sim_robot  # noqa: F401
