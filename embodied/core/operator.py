"""Who takes over from a policy, and when: one `operator:` block wherever an operator stands in
for a person. In `embodied train` it corrects an off-policy learner in simulation
(`operator.policy=scripted`, or a trained run); on a simulated robot it is `teleop=oracle`'s
(`teleop.operator.policy=<run>`). The rule that applies it is `embodied.robots.teleop.OracleRule`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

SCRIPTED = "scripted"  # operator.policy: the env's own scripted expert, which reads privileged state
TRIGGERS = ("drift", "stall")


@dataclass
class OperatorConfig:
    # the policy that plays the operator: a run or checkpoint directory, or `scripted` (training
    # only: the env's scripted expert for ManiSkill Pick/Push/StackCube, pd_ee_delta_pos, which
    # reads privileged state); None: no operator
    policy: Optional[str] = None
    # when it takes over: drift (the policy's action strays from the operator's) | stall (training
    # only: the episode's reward stops rising, as a person steps in when the robot makes no headway)
    trigger: str = "drift"
    threshold: float = 0.5  # drift: take over when the policy's action is farther than this from the operator's...
    patience: int = 3  # ... for this many steps (a robot's ticks) in a row; stall: this many steps without progress
    release: int = 10  # drift: hand back after this many steps of agreement...
    max_takeover: int = 0  # ... or after driving this many steps (0: no limit); stall: hand back after this many
    progress: float = 0.01  # stall: how far the episode's best step reward must rise to count as progress
