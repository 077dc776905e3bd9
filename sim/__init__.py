"""Simulator adapters behind the batched env interface (`sim.base.BatchedEnv`)."""
