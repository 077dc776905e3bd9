"""Scripted-expert demonstrations for ManiSkill tasks as a LeRobotDataset v3 (the same as
`embodied demos`); see configs/demos.yaml.

    python tools/demos.py env=maniskill_pickcube episodes=50 dataset=data/pickcube-demos"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from embodied.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["demos", *sys.argv[1:]]))
