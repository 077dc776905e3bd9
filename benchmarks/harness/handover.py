"""The offline-to-online hand-over settings that wsrl.py found on PushCube and hil.py carries to
PickCube: Cal-QL pretraining on the demos, WSRL's warm-up of the frozen policy, and the
anchored hand-over (the BC term kept for the actor, the temperature restarted low)."""

from __future__ import annotations

WARMUP = 2_000  # env steps the frozen pretrained policy collects before WSRL learns online
# WSRL: the frozen policy's warm-up, then online learning without the offline data in the critics' batches
WSRL = [f"algo.warmup_steps={WARMUP}", "algo.retain_offline=false"]
# the temperature online learning starts from: pretraining with BC leaves it far higher
ONLINE_TEMPERATURE = "algo.online_temperature=0.01"
# the hand-over wsrl.py's collapse study found: the BC term kept for the actor on the demos and
# the temperature restarted at 0.01 once online learning starts
ANCHORED = ["algo.online_bc=true", ONLINE_TEMPERATURE]


def calql_pretraining(steps: int) -> list[str]:
    """Cal-QL on the demos (alpha 5) for `steps` before online learning."""
    return [f"algo.offline_pretrain_steps={steps}", "algo.calql_alpha=5"]
