"""Predict a simulated rank's step with the ledger of a twin run that issues the same collectives.

    python scripts/predict_with_twin_ledger.py RUN/summary.json TWIN/summary.json [--link h200-nvlink4]

For runs whose own ledger is incomplete or absent (--ledger false; the --step-graph runs of 2026-12-04, whose
ledger missed the collectives issued from the autograd thread during the capture): the twin (same model, strategy,
weights mode and W, eager) recorded every collective with its place in the step; its records are rescaled to the
run's median step (flux_cp.predict.predict_ledger, step_ms=) and priced with the link profile, as the report prices
a run's own ledger. Prints one line of JSON: the run's step, the predicted step with its bounds (everything
overlapped .. nothing overlapped), the priced and exposed ms by kind, and the twin's collectives per step.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from flux_cp import links  # noqa: E402
from flux_cp.predict import predict_ledger  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="summary.json of the run to predict")
    p.add_argument("twin", type=Path, help="summary.json of the twin whose ledger is used")
    p.add_argument("--link", default="h200-nvlink4", help="link profile: a configs/links name or a YAML")
    a = p.parse_args()
    run, twin = (json.loads(x.read_text()) for x in (a.run, a.twin))
    same = ("cp", "weights", "world_size")
    if any(run.get(k) != twin.get(k) for k in same):
        sys.exit(f"predict_with_twin_ledger.py: the twin differs in {[k for k in same if run.get(k) != twin.get(k)]}")
    step = run["metrics"]["step_ms"]["median"]
    pred = predict_ledger(twin["comm"]["ledger"], links.load(a.link), step_ms=step)
    print(json.dumps({
        "run": str(a.run), "twin": str(a.twin), "link": a.link, "step_ms": round(step, 3),
        "predicted_ms": round(pred.predicted_ms, 3), "lower_ms": round(pred.lower_ms, 3),
        "upper_ms": round(pred.upper_ms, 3),
        "priced_ms": {k: round(v, 3) for k, v in pred.priced_ms_by_kind.items()},
        "exposed_ms": {k: round(v, 3) for k, v in pred.exposed_ms_by_kind.items()},
        "twin_per_step": {k: {"count": v["count"], "mb": round(v["bytes"] / 1e6, 1)}
                          for k, v in twin["comm"]["per_step"].items()},
    }))


if __name__ == "__main__":
    main()
