"""Read an offline wandb run back: its transaction log (run-*.wandb) is a LevelDB-style record log of
wandb's own protobuf Records (wandb.proto.wandb_internal_pb2). wandb >= 0.19 reads it in Go only."""

import json
import struct
from pathlib import Path

_BLOCK = 32 * 1024  # LevelDB log blocks; a record header (crc32, length, type) never straddles one
_FULL, _LAST = 1, 4


def records(path: Path):
    # imported here: the GPU machine has no wandb, and its tests (wandb disabled) collect this module too
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", f"{path} is not a wandb transaction log"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if n == 0 and kind == 0:
            break
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (_FULL, _LAST):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec
            buf = b""


def run_info(path: Path) -> dict:
    """The run record (name, group, job type, tags, config) and the final summary of an offline run."""
    out = {"summary": {}, "config": {}}
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out |= {"name": rec.run.display_name, "group": rec.run.run_group, "job_type": rec.run.job_type,
                    "tags": list(rec.run.tags)}
            out["config"] |= {c.key: json.loads(c.value_json) for c in rec.run.config.update}
        elif kind == "config":
            out["config"] |= {c.key: json.loads(c.value_json) for c in rec.config.update}
        elif kind == "summary":
            for item in rec.summary.update:
                key = item.key or "/".join(item.nested_key)
                out["summary"][key] = json.loads(item.value_json)
    return out


def history(path: Path) -> list[dict]:
    """The run's history rows, in the order logged."""
    rows = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
    return rows
