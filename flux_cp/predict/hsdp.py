"""HSDP on paper: a job of n nodes x 8 GPUs priced from one simulated rank of an FSDP run at W = 8.

    tiers = two_tier("h200-nvlink4", "ib-ndr")
    plans = plan(summary, summary["comm"]["ledger"], tiers, nodes=(2, 4, 8))   # one NodePlan per n
    plans[0].hsdp.step_ms, plans[0].fsdp.step_ms, plans[0].saved_ms

HSDP (shard inside a node of 8, replicate across nodes): each rank runs the W = 8 rank's step unchanged (the same
all-gathers and reduce-scatters, priced on the intra-node profile and placed as step_model places them), and
all-reduces its 1/8 of the gradients (each reduce-scatter's output: its input bytes / 8, the ledger's bytes being
in the reduce dtype) over the n ranks that hold the same shard, on the inter-node profile. torch's FSDP2 issues
that all-reduce once the reduce-scatter is done, on a stream of its own (all_reduce_stream: NVLink and the NIC are
different links), and the compute waits for it at the end of the backward; so the all-reduces are a second
communication stream whose stall is what is left after the backward's compute. Assumptions, each for simplicity:
- the two streams' stalls add: an intra-node stall later in the backward would give the all-reduces more time to
  hide, so HSDP's step is an upper bound (it never flatters HSDP against FSDP);
- an all-reduce starts where its reduce-scatter ends on the compute timeline (a blocking one's issue, an
  asynchronous one's issue + its price: the intra-node stream free then);
- every node does the same work on its own samples (n x the global batch): tokens/s and MFU per GPU are the rank's.
Plain FSDP over all 8n ranks, for comparison: every all-gather and reduce-scatter of FSDP spans nodes, so it is
priced on the inter-node profile at group size 8n (a ring across nodes runs at its slowest link); the context-
parallel collectives of its CP group stay inside a node. A collective's tier is read from its group size
(`TwoTier`: more ranks than a node holds spans nodes), so n = 1 is the W = 8 prediction itself.
FSDP's collectives are the ledger's all-gathers and reduce-scatters: a CP that issues those too (allgather-kv,
tp, the ring's all-gather rotation) is refused (check_run), not guessed apart.
Cross-node bytes: nccl-tests' size of every collective that spans nodes, per rank and step (all-reduce: the
tensor; all-gather: its output; reduce-scatter: its input).
"""

from dataclasses import asdict, dataclass

from flux_cp.predict import links
from flux_cp.predict.step_model import fsdp_ahead, predict_ledger

NODE = 8  # GPUs per node (HGX/DGX H100, H200): the W of the FSDP run priced
FSDP_KINDS = ("all_gather", "reduce_scatter")


@dataclass
class TwoTier:
    """A link profile for a job of several nodes: groups of at most `node` ranks inside a node, larger ones across."""

    intra: links.LinkProfile
    inter: links.LinkProfile
    node: int = NODE

    @property
    def name(self) -> str:
        return f"{self.intra.name} + {self.inter.name}"

    def price_ms(self, kind: str, nbytes: float, n: int) -> float:
        return (self.inter if n > self.node else self.intra).price_ms(kind, nbytes, n)


def two_tier(intra: str = "h200-nvlink4", inter: str = "ib-ndr") -> TwoTier:
    """Two profiles by name (configs/links/NAME.yaml) or path."""
    return TwoTier(links.load(intra), links.load(inter))


@dataclass
class Priced:
    step_ms: float
    exposed_comm_ms: float
    tokens_per_s_per_gpu: float | None
    mfu: float | None
    cross_node_bytes: float  # per rank and step


@dataclass
class NodePlan:
    nodes: int
    world: int
    hsdp: Priced
    fsdp: Priced  # plain FSDP sharded over all 8n ranks

    @property
    def saved_ms(self) -> float:
        return self.fsdp.step_ms - self.hsdp.step_ms

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "world": self.world, "hsdp": asdict(self.hsdp), "fsdp": asdict(self.fsdp),
                "saved_ms": self.saved_ms}


def check_run(d: dict) -> None:
    """ValueError naming the setting and the fix where d is not a simulated FSDP rank at W = 8 with a ledger."""
    if d.get("weights") != "fsdp":
        raise ValueError(f"--weights {d.get('weights')}: HSDP is priced from an FSDP run (rerun with --weights fsdp "
                         f"--simulate-world {NODE})")
    if d.get("world_size") != NODE or int(d.get("num_nodes") or 1) != 1:
        raise ValueError(f"W={d.get('world_size')}: HSDP is priced from FSDP at W={NODE}, one node (rerun with "
                         f"--simulate-world {NODE})")
    if not (d.get("collectives") == "fake" or d.get("simulate")):
        raise ValueError(f"a real W={NODE} run: its steps already hold its collectives (rerun with --simulate-world "
                         f"{NODE}, a simulated rank)")
    run = (d.get("config") or {}).get("run") or {}
    if d.get("cp") in ("allgather-kv", "tp") or (d.get("cp") == "torch" and run.get("rotate", "allgather")
                                                  == "allgather"):
        raise ValueError(f"--cp {d.get('cp')}: its all-gathers and reduce-scatters are not told apart from FSDP's in "
                         "the ledger (price an FSDP run with --cp none --cp-degree 1, --cp ulysses, or --cp torch "
                         "--rotate alltoall)")
    if not ((d.get("comm") or {}).get("ledger")):
        raise ValueError("summary.json has no comm.ledger (rerun to completion with --regions-every 1, so that its "
                         "measured steps record their collectives)")
    if not ((d.get("metrics") or {}).get("step_ms") or {}).get("median"):
        raise ValueError("summary.json has no metrics.step_ms (rerun to completion: no measured step)")


def _median(preds: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """As predict_ledger picks: the median record by step (a real record, not an average)."""
    preds.sort(key=lambda p: p[0])
    return preds[(len(preds) - 1) // 2]


def _across(rec: dict, n: int) -> dict:
    """The record as a rank of plain FSDP over 8n ranks: FSDP's collectives span the nodes."""
    colls = [c | {"group_size": NODE * n} if c["kind"] in FSDP_KINDS else c for c in rec["collectives"]]
    return rec | {"collectives": colls}


def _all_reduces(rec: dict, n: int, intra: links.LinkProfile, k: float) -> list[dict]:
    """HSDP's all-reduce of each reduce-scatter's output over the n replicas, consumed at the backward's end, issued
    where that reduce-scatter ends on the compute timeline: a blocking one's issue (the compute resumes there once
    it is done), an asynchronous one's issue + its price (in the record's own ms: k = the step it is scaled to / its
    own)."""
    ph = rec.get("phases") or {}
    bwd_end = ph.get("backward_end_ms", ph.get("backward_end"))
    out = []
    for c in (c for c in rec["collectives"] if c["kind"] == "reduce_scatter"):
        at = c.get("issue_ms") or 0.0
        if c.get("async"):
            at += intra.price_ms("reduce_scatter", c["bytes"], c["group_size"]) / k
        out.append({"kind": "all_reduce", "bytes": float(c["bytes"]) / int(c["group_size"]), "group_size": n,
                    "async": True, "stream": "side", "issue_ms": at, "wait_ms": bwd_end})
    return out


def _rate(work: dict, step_ms: float) -> tuple[float | None, float | None]:
    """tokens/s and MFU a GPU at step_ms, as runs/throughput.py's throughput_of computes them (work: its figures)."""
    s = step_ms / 1e3
    tokens = work.get("tokens_per_step")
    peak, flops = work.get("peak_flops"), work.get("model_flops_per_step")
    return (tokens / s / NODE if tokens else None), (flops / s / NODE / peak if peak and flops else None)


def plan(d: dict, ledger: list[dict], tiers: TwoTier, nodes=(2, 4, 8), work: dict | None = None) -> list[NodePlan]:
    """HSDP and plain FSDP at 8n ranks for each n in nodes, from the W = 8 FSDP rank d (summary.json) and its ledger.

    work: the run's step figures (tokens_per_step, model_flops_per_step, peak_flops), as runs/throughput.py's
    throughput_of returns them; default the summary's own `throughput` block (written by it)."""
    check_run(d)
    work = work if work is not None else d.get("throughput") or {}
    step = float(d["metrics"]["step_ms"]["median"])
    ahead = fsdp_ahead(d)  # --fsdp-prefetch: how far ahead its gathers are issued
    recs = [r for r in ledger if r.get("kind") not in ("probe", "settle")] or ledger  # as predict_ledger reads it
    out = []
    for n in nodes:
        hsdp, fsdp = [], []
        for rec in recs:
            k = step / rec["step_ms"] if rec.get("step_ms") else 1.0
            inside = predict_ledger([rec], tiers.intra, step_ms=step, fsdp_ahead=ahead)
            ars = _all_reduces(rec, n, tiers.intra, k) if n > 1 else []
            tail = 0.0
            if ars:  # the cross-node all-reduces on their own stream: what they add beyond the node's step
                tail = predict_ledger([rec | {"collectives": ars}], tiers.inter, step_ms=step).exposed_ms
            hsdp.append((inside.predicted_ms + tail, inside.exposed_ms + tail, sum(c["bytes"] for c in ars)))
            p = predict_ledger([_across(rec, n)], tiers, step_ms=step, fsdp_ahead=ahead)
            spans = sum(float(c["bytes"]) for c in rec["collectives"] if c["kind"] in FSDP_KINDS) if n > 1 else 0.0
            fsdp.append((p.predicted_ms, p.exposed_ms, spans))
        priced = [Priced(s, e, *_rate(work, s), b) for s, e, b in (_median(hsdp), _median(fsdp))]
        out.append(NodePlan(n, NODE * n, *priced))
    return out
