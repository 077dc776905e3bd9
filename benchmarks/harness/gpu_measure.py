"""One GPU campaign measurement in a process of its own, so that a ManiSkill GPU scene never
outlives it and a crash costs one row. gpu_steps.measure runs it, and tools/gpu/kit.py runs
the `vla` step's SFT so:

    cd benchmarks && python -m harness.gpu_measure <name> '<arguments as JSON>'

The last line it prints is the measurement's result, as JSON."""

from __future__ import annotations

import json
import sys

from harness import gpu_model_steps, gpu_sim_steps

MEASUREMENTS = {**gpu_sim_steps.MEASUREMENTS, **gpu_model_steps.MEASUREMENTS}

if __name__ == "__main__":
    name, arguments = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(MEASUREMENTS[name](**arguments)))
