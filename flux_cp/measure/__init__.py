"""Instruments: timing regions inside the step, the communication ledger, kernel breakdowns from profiler traces,
and an emulated slower host."""
