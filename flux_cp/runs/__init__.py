"""Runs on disk: output folders, summary.json (the results contract) and its throughput, failures and exit codes,
sweeps."""
