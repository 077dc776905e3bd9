"""The robot side: Robot interface, robot client, safety layer and teleop devices.

Installable on a robot PC without torch; shares `embodied.core.types` and the env<->rollout
protocol with the simulator workers."""
