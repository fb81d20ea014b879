"""Runs on disk: output folders, summary.json (the results contract), failures and exit codes, sweeps."""
