"""Importing this module registers every robot (the `robot` config group's names)."""

import robots.lerobot_robot  # noqa: F401
import robots.sim_robot  # noqa: F401
