"""The planner: for a model, a sequence length, a global batch and W GPUs, every plan (dp x cp of W, the strategy
within a group, how the weights are synced, eager or compiled under a step graph), pruned where it cannot divide or
fit, run as a simulated rank, priced, and ranked in tokens/s a GPU and MFU against plain data parallelism
(scripts/plan.py)."""
