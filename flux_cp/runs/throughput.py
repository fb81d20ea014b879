"""What a train summary's step does and how fast: work a step (samples, tokens, model FLOPs), throughput and MFU at a
step time (Lightning's ThroughputMonitor names), and the figure runs are ranked by (a simulated rank's with its
collectives priced).

    t = throughput_of(summary)                # at its median step; throughput_of(summary, step_ms=...) at another
    r = ranked_throughput(summary, ledger)    # summary.json `ranked`, wandb's ranked/...
"""

from pathlib import Path


def work_of(d: dict) -> dict:
    """What a train summary's step does, for throughput: ranks, samples (the global batch), tokens a sample, one
    sample's forward FLOPs (and by part), the device's dense bf16 peak."""
    from flux_cp.config import DataConfig, ModelConfig
    from flux_cp.measure.flops import lora_train_flops, model_flops, peak_flops

    cfg = d["config"]
    model, data = ModelConfig(**cfg["model"]), DataConfig(**cfg["data"])
    peak, peak_source = peak_flops(d.get("env", {}).get("device"), cfg["run"].get("precision", "bf16-true"))
    f = model_flops(model, data)
    run = cfg["run"]
    train, parts = None, {k: 3.0 * f[k] for k in ("gemm", "attention")}  # a sample's training FLOPs by part
    if run.get("lora_rank"):  # frozen base: LoRA's own training FLOPs, not 3 x forward
        lf = lora_train_flops(model, data, run.get("lora_targets", "attention"), run["lora_rank"])
        train, parts = lf["total"], {"gemm": lf["gemm"] + lf["adapters"], "attention": lf["attention"]}
    return {"world": d.get("world_size", 1), "samples": d.get("dp", 1) * data.batch_size, "seq_len": data.seq_len,
            "fwd_flops": f["total"], "fwd_parts": f, "train_flops": train, "train_parts": parts, "peak": peak,
            "peak_source": peak_source}


def throughput_of(d: dict, step_ms: float | None = None) -> dict:
    """A train summary's work per step and, at its median step (or `step_ms`: a predicted one), tokens/s, samples/s
    (the job's and a GPU's), TFLOP/s a GPU and MFU. A simulated rank's step is its own compute, collectives unpriced:
    `basis` says so (the report prices them)."""
    from flux_cp.measure.flops import throughput

    work = work_of(d)
    if step_ms is None:
        step_ms = ((d.get("metrics") or {}).get("step_ms") or {}).get("median")
    out = throughput(step_ms, **{k: work[k] for k in ("world", "samples", "seq_len", "fwd_flops", "peak",
                                                       "train_flops")})
    basis = "a simulated rank's compute, collectives not priced" if d.get("collectives") == "fake" else "measured"
    peak, samples, world = work["peak"], work["samples"], work["world"]
    out |= {"peak_flops": peak, "peak_source": work["peak_source"], "basis": basis, "step_ms": step_ms}
    factor = (d.get("checkpointing") or {}).get("hardware_flops_factor", 1.0)  # recompute: not in MFU's numerator
    out["hardware_flops_per_step"] = out["model_flops_per_step"] * factor
    if step_ms:
        out["hardware_tflops_per_gpu"] = out["hardware_flops_per_step"] / (step_ms / 1e3) / world / 1e12
    bd = (d.get("profile") or {}).get("breakdown_ms")
    if bd:  # --profile: each part's kernel time a step against its model FLOPs (training's): where MFU is lost
        parts = {}
        for part in ("gemm", "attention"):
            ms = bd.get(part)
            flops = work["train_parts"][part] * samples / world  # a rank's share
            parts[part] = {"ms": ms, "tflops": flops / (ms / 1e3) / 1e12 if ms else None}
            if peak and ms:
                parts[part]["of_peak"] = flops / (ms / 1e3) / peak
        rest = [v for k, v in bd.items() if k not in ("gemm", "attention", "busy", "step", "idle")]
        parts["rest_ms"] = sum(v for v in rest if isinstance(v, (int, float)))  # elementwise, optimizer, comm
        parts["idle_ms"] = bd.get("idle")
        out["efficiency"] = parts
    return out


PREDICT_LINK = "h200-nvlink4"  # the report's default profile (scripts/report.py --link): NVLink4, H100 SXM's and H200's


def ranked_throughput(d: dict, ledger: list[dict] | None, link: "str | object | None" = PREDICT_LINK) -> dict:
    """What runs are ranked by (wandb's bar plots, `ranked/...`): a real run's measured throughput; a simulated GPU
    rank's at its step with the collectives it recorded priced on `link` and placed on its timeline
    (predict.step_model, as the report prices a run of its own); else its compute alone (a CPU rank: no profile),
    which `basis` says. Keys: step_ms, exposed_comm_ms, link (the profile, where priced), tokens_per_s_per_gpu, mfu,
    basis."""
    step = ((d.get("metrics") or {}).get("step_ms") or {}).get("median")
    out = {"step_ms": step, "exposed_comm_ms": 0.0, "link": None, "basis": "measured"}
    if d.get("collectives") == "fake" or d.get("simulate"):
        on_gpu = not str((d.get("env") or {}).get("device", "cpu")).startswith("cpu")
        out["basis"] = "a simulated rank's compute, collectives not priced"
        if on_gpu and ledger and link is not None and step:
            from flux_cp.predict import links
            from flux_cp.predict.step_model import fsdp_ahead, predict_ledger

            prof = links.load(link) if isinstance(link, (str, Path)) else link
            pred = predict_ledger(ledger, prof, step_ms=step, fsdp_ahead=fsdp_ahead(d))
            if pred is not None:
                out |= {"step_ms": pred.predicted_ms, "exposed_comm_ms": pred.exposed_ms, "link": prof.name,
                        "basis": f"a simulated rank, its collectives priced with {prof.name}"}
    t = throughput_of(d, step_ms=out["step_ms"]) if out["step_ms"] else {}
    return out | {"tokens_per_s_per_gpu": t.get("throughput/device/items_per_sec"),
                  "mfu": t.get("throughput/device/mfu")}
