#!/usr/bin/env python3
"""Prints a results folder's benchmark table (Markdown) from one run's JSON, with each target of the benchmark
issue checked against the figures of that run.

    python3 benchmarks/table.py RESULTS_DIR

reads RESULTS_DIR/gpu_benchmark.json (towerpipe with GPU towers) and RESULTS_DIR/anchors.json (the
PyTorch peers of the same run). One line per (variables, N, backend, layout), Adam only (the peers run
Adam): median ms, the floor, the ratio to it, and how many times faster than the peers:
  torch fused    torch.optim.Adam(fused=True) after _foreach averaging ("torch_fused")
  op-by-op       the tutorial's per-variable stack + mean + Adam on GPU:0 ("tf_tower")
  CPU PS         the tutorial as written: parameter server on the CPU ("host_ps")
Targets (N = 2, 4, 8) come from the floor measured in the same run, never from a fixed speed-up: a
device backend at most 1.05x its floor with layout flat and 1.10x with per_variable (p2p_tree: that bound
times the bytes the tree moves on one device against device0's, (20N - 4 ceil(log2 N)) / (8N + 20) for
Adam, since the benchmark's floor counts device0's bytes); reduce::host at most 1.5x its floor. Against
each peer the target is the speed-up that meeting the bound gives: peer ms / (bound x floor ms) — so a
peer that itself runs near the floor (BERT-base's torch fused, 2.2x) asks for less than one far from it.
"""
import math
import sys

from bench_results import anchor_rows, benchmark_rows, load, peer_ms

MODELS = ("resnet50", "bert_base")
MODEL_NAMES = {"resnet50": "ResNet-50", "bert_base": "BERT-base"}
TARGET_TOWERS = (2, 4, 8)
DEVICE_RATIO = {"flat": 1.05, "per_variable": 1.10}
DEVICE_PEERS = ("torch_fused", "tf_tower")
HOST_RATIO = 1.5
HOST_PEERS = ("host_ps",)
PEER_NAMES = {"torch_fused": "torch fused", "tf_tower": "op-by-op", "host_ps": "CPU PS"}


class check:
    """One target: `value` must be at most (or at least) `bound`."""

    def __init__(self, what, value, bound, at_most):
        self.what, self.value, self.bound, self.at_most = what, value, bound, at_most

    @property
    def met(self):
        return self.value <= self.bound if self.at_most else self.value >= self.bound

    def text(self):
        sign = "<=" if self.at_most else ">="
        return f"{self.what} {sign} {self.bound:.3g}x: {'met' if self.met else 'MISSED'} ({self.value:.2f}x)"


def p2p_bytes_over_device0(towers):
    """Adam on one device: the tree's bytes per parameter over device0's (reduce/p2p_tree/reducer.hpp's count)."""
    rounds = math.ceil(math.log2(towers)) if towers > 1 else 0
    return (20 * towers - 4 * rounds) / (8 * towers + 20)


def floor_bound(row):
    """The most x floor a row may take, or None where no target applies."""
    backend = row["backend"].split()[0]  # "device0 checked", "device0 bf16": their floors count their bytes
    if backend == "host":
        return HOST_RATIO
    bound = DEVICE_RATIO.get(row["layout"])
    if bound is not None and backend == "p2p_tree":
        bound *= p2p_bytes_over_device0(int(row["towers"]))
    return bound


def compare(rows, anchors):
    """Table entries for the GPU-tower Adam rows of the listed models, with speed-ups and target checks."""
    peers = {(a["model"], int(a["towers"])): a for a in anchor_rows(anchors)}
    entries = []
    for r in rows:
        if r["exec"] != "cuda" or r["optimizer"] != "adam" or r["model"] not in MODELS:
            continue
        towers = int(r["towers"])
        anchor = peers.get((r["model"], towers), {})
        speedups = {}
        for peer in PEER_NAMES:
            ms = peer_ms(anchor, peer)
            if ms is not None:
                speedups[peer] = ms / r["ms"]
        checks = []
        bound = floor_bound(r)
        if towers in TARGET_TOWERS and bound is not None:
            checks.append(check("floor", r["ratio_to_floor"], bound, at_most=True))
            for peer in HOST_PEERS if r["backend"] == "host" else DEVICE_PEERS:
                if peer in speedups:
                    least = peer_ms(anchor, peer) / (bound * r["floor_ms"])
                    checks.append(check(PEER_NAMES[peer], speedups[peer], least, at_most=False))
        entries.append({"model": r["model"], "towers": towers, "backend": r["backend"], "layout": r["layout"],
                        "ms": r["ms"], "floor_ms": r["floor_ms"], "ratio": r["ratio_to_floor"],
                        "speedups": speedups, "checks": checks})
    order = {m: i for i, m in enumerate(MODELS)}
    entries.sort(key=lambda e: (order[e["model"]], e["towers"], e["backend"], e["layout"]))
    return entries


def markdown(entries):
    lines = ["| variables | N | backend | layout | ms | floor ms | x floor | "
             + " | ".join(f"vs {name}" for name in PEER_NAMES.values()) + " | targets |",
             "|---|---|---|---|---|---|---|" + "---|" * len(PEER_NAMES) + "---|"]
    for e in entries:
        faster = [f"{e['speedups'][p]:.1f}x" if p in e["speedups"] else "–" for p in PEER_NAMES]
        targets = "; ".join(c.text() for c in e["checks"]) or "–"
        lines.append(f"| {MODEL_NAMES[e['model']]} | {e['towers']} | {e['backend']} | {e['layout']} | {e['ms']:.3f} | "
                     f"{e['floor_ms']:.3f} | {e['ratio']:.2f} | " + " | ".join(faster) + f" | {targets} |")
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    entries = compare(benchmark_rows(sys.argv[1]), load(sys.argv[1], "anchors.json"))
    if not entries:
        sys.exit(f"table.py: no GPU-tower Adam rows in {sys.argv[1]}/gpu_benchmark.json")
    print(markdown(entries))
    checks = [c for e in entries for c in e["checks"]]
    print(f"\ntargets met: {sum(c.met for c in checks)} of {len(checks)}")


if __name__ == "__main__":
    main()
