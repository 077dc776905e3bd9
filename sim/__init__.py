"""Simulator adapters behind the batched env interface (`embodied.core.env.BatchedEnv`)."""
