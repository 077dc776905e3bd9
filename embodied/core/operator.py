"""Who takes over from a policy, and when: one `operator:` block wherever an operator stands in
for a person. In `embodied train` it corrects an off-policy learner in simulation
(`operator.policy=scripted`, or a trained run); on a simulated robot it is `teleop=oracle`'s
(`teleop.operator.policy=<run>`). The rule that applies it is `embodied.robots.teleop.OracleRule`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

SCRIPTED = "scripted"  # operator.policy: the env's own scripted expert, which reads privileged state


@dataclass
class OperatorConfig:
    # the policy that plays the operator: a run or checkpoint directory, or `scripted` (training
    # only: the env's scripted expert for ManiSkill Pick/Push/StackCube, pd_ee_delta_pos, which
    # reads privileged state); None: no operator
    policy: Optional[str] = None
    threshold: float = 0.5  # take over when the policy's action is farther than this from the operator's...
    patience: int = 3  # ... for this many steps (a robot's ticks) in a row
    release: int = 10  # hand back after this many steps of agreement...
    max_takeover: int = 0  # ... or after driving this many steps (0: no limit)
