"""Where a step's MFU goes (issue 39): each profiled GPU run's model FLOPs against its kernels by part. The GEMMs' and
attention's achieved share of the dense peak, the optimizer and the rest in ms, and the heaviest kernels of each, so
that the gap to an MFU target is named by kernel, not guessed. Read from summary.json (`throughput.efficiency`, written
by runs/throughput.py from `--profile`'s breakdown; `profile.top_kernels_ms`, by measure/profiling.py)."""

from .tables import md_table

TOP = 3  # kernels named per part in report.md (report.json keeps what the summary holds)


def efficiency(runs) -> list[dict]:
    """One row per profiled GPU run: its median step, MFU, the parts' ms and share of peak, their heaviest kernels."""
    rows = []
    for r in runs:
        t, prof = r.d.get("throughput") or {}, r.d.get("profile") or {}
        eff, bd = t.get("efficiency"), prof.get("breakdown_ms")
        if not eff or not bd or prof.get("device") != "cuda":
            continue
        rows.append({
            "run": r.name, "path": str(r.path), "W": r.W, "samples_per_step": t.get("samples_per_step"),
            "step_ms": t.get("step_ms"), "mfu": t.get("throughput/device/mfu"), "peak": t.get("peak_source"),
            "profiled_step_ms": bd.get("step"), "gemm": eff.get("gemm"), "attention": eff.get("attention"),
            "optimizer_ms": bd.get("optimizer"), "other_ms": bd.get("other"), "idle_ms": bd.get("idle"),
            "comm_ms": (bd.get("comm_attention") or 0.0) + (bd.get("comm_grad") or 0.0),
            "top_kernels_ms": prof.get("top_kernels_ms") or {}})
    return rows


def _part(p: dict | None) -> str:
    if not p or p.get("ms") is None:
        return "-"
    share = f", {p['of_peak']:.0%} of peak" if p.get("of_peak") is not None else ""
    return f"{p['ms']:.1f} ms{share}"


def _ms(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _kernels(top: list) -> str:
    return "; ".join(f"{name[:60]} {ms:.2f} ms" for name, ms in top[:TOP]) or "-"


def efficiency_md(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    out = ["## Where the MFU goes (profiled runs)", "",
           "Model FLOPs (3 x forward, counted from the shapes) at the run's median step against the dense bf16 peak; "
           "each part's kernels over the profiled steps (ms a step), the GEMMs' and attention's achieved share of the "
           "peak; the optimizer and the rest are memory bound, in ms. Their heaviest kernels below name the gap.", ""]
    hdr = ["run", "W", "samples", "step ms", "MFU", "GEMM", "attention", "optimizer / other / idle ms"]
    out += [md_table(hdr, [[r["run"], str(r["W"]), str(r["samples_per_step"] or "-"), _ms(r["step_ms"]),
                            "-" if r["mfu"] is None else f"{r['mfu']:.0%}", _part(r["gemm"]), _part(r["attention"]),
                            f"{_ms(r['optimizer_ms'])} / {_ms(r['other_ms'])} / {_ms(r['idle_ms'])}"]
                           for r in rows]), ""]
    for r in rows:
        top = r["top_kernels_ms"]
        if top:
            out.append(f"- `{r['run']}`: attention: {_kernels(top.get('attention', []))}; other: "
                       f"{_kernels(top.get('other', []))}")
    return out + [""]
