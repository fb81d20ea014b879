"""Link profiles (configs/links/*.yaml): per collective kind a latency and a bus bandwidth.

    prof = load("configs/links/h200-nvlink4.yaml")
    prof.price_ms("all_reduce", 2.6e9, 8)      # ms for one all-reduce of a 2.6 GB tensor over 8 ranks

Bytes follow nccl-tests' "size" (all_gather: output, reduce_scatter: input, all_reduce/broadcast: the
tensor, all_to_all: the send buffer) and its busbw convention: time = latency + size x factor / busbw,
the factor being what each rank's link carries per byte of size (nccl-tests' PERFORMANCE.md).
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

LINKS_DIR = Path(__file__).resolve().parents[2] / "configs" / "links"


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw / algbw for a group of n ranks."""
    if n <= 1:
        return 0.0
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "all_to_all": (n - 1) / n, "broadcast": 1.0, "send": 1.0, "recv": 1.0}[kind]


@dataclass
class KindLink:
    latency_us: float
    busbw_gbps: float
    source: str = ""


@dataclass
class LinkProfile:
    name: str
    kinds: dict[str, KindLink]
    description: str = ""
    measured: bool = False
    extra: dict = field(default_factory=dict)  # how it was measured (device, backend, world, sizes)

    def price_ms(self, kind: str, nbytes: float, n: int) -> float:
        """Time of one collective of nccl-tests size nbytes over n ranks; nothing moves on one rank."""
        if n <= 1:
            return 0.0
        k = self.kinds.get(kind) or self.kinds.get({"recv": "send", "send": "recv"}.get(kind, ""))
        if k is None:
            raise KeyError(f"link profile {self.name!r} has no {kind!r}")
        return k.latency_us / 1e3 + nbytes * bus_factor(kind, n) / (k.busbw_gbps * 1e9) * 1e3

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "measured": self.measured, **self.extra,
                "kinds": {k: {"latency_us": v.latency_us, "busbw_gbps": v.busbw_gbps, "source": v.source}
                          for k, v in self.kinds.items()}}


def from_dict(d: dict) -> LinkProfile:
    kinds = d.get("kinds")
    if not isinstance(kinds, dict) or not kinds:
        raise ValueError("a link profile needs `kinds`: {kind: {latency_us, busbw_gbps, source}}")
    out = {}
    for kind, v in kinds.items():
        bus_factor(kind, 2)  # a KeyError names an unknown kind
        lat, bw = float(v["latency_us"]), float(v["busbw_gbps"])
        if not (lat >= 0 and bw > 0):
            raise ValueError(f"{kind}: need latency_us >= 0 and busbw_gbps > 0, got {lat}, {bw}")
        out[kind] = KindLink(lat, bw, str(v.get("source", "")))
    extra = {k: v for k, v in d.items() if k not in ("name", "description", "measured", "kinds")}
    return LinkProfile(str(d.get("name", "unnamed")), out, str(d.get("description", "")), bool(d.get("measured")),
                       extra)


def flat(gbps: float) -> LinkProfile:
    """Every kind at one bus bandwidth and no latency: the old `--link-gbps` estimate, for comparison."""
    return LinkProfile(f"flat-{gbps:g}GBps", {k: KindLink(0.0, gbps, "flat rate (--link-gbps)") for k in
                       ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv")})


def load(path_or_name: str | Path) -> LinkProfile:
    """A YAML file, or the name of one in configs/links/ ("h200-nvlink4")."""
    p = Path(path_or_name)
    if not p.exists() and (LINKS_DIR / f"{path_or_name}.yaml").exists():
        p = LINKS_DIR / f"{path_or_name}.yaml"
    return from_dict(yaml.safe_load(p.read_text()))


def load_any(spec: str) -> "LinkProfile | dict[int, LinkProfile]":
    """One profile, or with {W} in the path one per group size: {W: profile} for every file that matches."""
    if "{W}" not in spec:
        return load(spec)
    pat = re.compile(re.escape(Path(spec).name).replace(re.escape("{W}"), r"(\d+)") + "$")
    found = {int(m.group(1)): load(p) for p in Path(spec).parent.glob(Path(spec).name.replace("{W}", "*"))
             if (m := pat.match(p.name))}
    if not found:
        raise ValueError(f"no file matches {spec}")
    return found


def for_world(link: "LinkProfile | dict[int, LinkProfile] | None", W: int) -> LinkProfile | None:
    """The profile for a group of W ranks: the one measured at W, else at the nearest W."""
    if not isinstance(link, dict):
        return link
    return link.get(W) or link[min(link, key=lambda w: (abs(w - W), w))]


def name_of(link) -> str:
    if isinstance(link, dict):
        return ", ".join(f"{p.name} (W={w})" for w, p in sorted(link.items()))
    return link.name


def save(prof: LinkProfile, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(prof.to_dict(), sort_keys=False, width=120))
    return path


def fit(sizes: list[float], times_ms: list[float], kind: str, n: int) -> tuple[float, float]:
    """time = a + b x bus bytes, least squares on relative error (1 KB and 1 GB weigh alike).

    Returns (latency_us, busbw_gbps)."""
    xs = [s * bus_factor(kind, n) for s in sizes]
    w = [1 / max(y, 1e-9) ** 2 for y in times_ms]
    sw, sx, sy = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * y for wi, y in zip(w, times_ms))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, times_ms))
    det = sw * sxx - sx * sx
    b = (sw * sxy - sx * sy) / det if det else 0.0
    a = (sy - b * sx) / sw
    if b <= 0:  # latency bound everywhere: the bandwidth is at least what the largest message saw
        b, a = max(times_ms[-1], 1e-9) / max(xs[-1], 1.0), 0.0
    if a < 0:  # bandwidth bound everywhere: refit the slope through the origin
        a, b = 0.0, sum(wi * x * y for wi, x, y in zip(w, xs, times_ms)) / sxx
    return a * 1e3, 1 / b / 1e6  # ms -> us; bytes per ms -> GB/s
