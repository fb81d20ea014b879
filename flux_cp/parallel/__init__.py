"""Parallelism applied to the model from outside it: CP strategies (cp.py: torch's ring, allgather-kv, Ulysses;
tp.py: tensor + sequence parallelism), the --cp registry, Ulysses' overlap, the (dp, cp) mesh and weight sync,
ZeRO-2, and torch's fake process group for simulated ranks."""
