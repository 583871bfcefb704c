"""Reading the benchmark results: towerpipe's JSON files and the PyTorch anchors' anchors.json (written by
torch_anchor_bench.py from the shared anchors), shared by plot.py and table.py."""
import json
import os

# The anchors' methods, as torch_anchor_bench.py names them (each a [median, min, max] ms list).
PEERS = ["tf_tower", "torch_foreach", "torch_fused", "flat_fused", "cupy_fused1", "host_ps"]


def load(directory, name):
    """The JSON document DIRECTORY/NAME, or None when there is none."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def benchmark_rows(directory):
    """Every row of gpu_benchmark.json and host_benchmark.json in DIRECTORY."""
    rows = []
    for name in ("gpu_benchmark.json", "host_benchmark.json"):
        rows += (load(directory, name) or {}).get("rows", [])
    return rows


def anchor_rows(anchors):
    """The per-(model, towers) rows of an anchors.json document (or of its bare list form)."""
    if anchors is None:
        return []
    return anchors.get("results", []) if isinstance(anchors, dict) else list(anchors)


def peer_ms(anchor, peer):
    """A peer's median ms in an anchor row, or None where it was not measured."""
    value = anchor.get(peer)
    return value[0] if isinstance(value, list) and value else None
