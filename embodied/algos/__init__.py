"""RL algorithms, one file each. Each exposes `update(trajectory, progress) -> metrics` and
`state_dict()/load_state_dict()` for checkpoints."""
