"""Published checkpoints in their own layouts: pi0 / pi0.5 (openpi and lerobot), SmolVLA
(lerobot) and OpenVLA / OpenVLA-OFT (Prismatic), with what their inputs and outputs need:
the camera-to-input map (`features.py`), the normalisation statistics read from the checkpoint
(`statistics.py`) and the flow-matching wrapper pi0 and SmolVLA share (`pretrained_flow.py`)."""
