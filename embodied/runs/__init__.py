"""A run on disk: its folder and metric log (`folders`), its checkpoints (`checkpoint`) and its
policy loaded again (`loading`)."""
