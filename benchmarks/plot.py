#!/usr/bin/env python3
"""Turns the benchmarks' JSON into PNGs (needs matplotlib: Debian's python3-matplotlib).

    python3 benchmarks/plot.py RESULTS_DIR

reads RESULTS_DIR/gpu_benchmark.json (towerpipe on GPU towers), and where present
RESULTS_DIR/host_benchmark.json and RESULTS_DIR/anchors.json (the PyTorch peers measured in the same
run by the anchors' torch_anchor_bench.py), and writes into RESULTS_DIR:
  time_vs_parameters.png   median ms per step against parameters, one line per backend and tower
                           count, with the floor measured in the same run (flat sweep, Adam);
  ratio_to_floor.png       ratio to the floor per backend for ResNet-50 and BERT-base (Adam, flat and
                           per_variable), beside the PyTorch peers' ratios;
  overlap.png              the host benchmark's overlap rows: a step's compute alone, serial and
                           overlapped per configuration, with the share of the reduction hidden.
"""
import os
import sys

import matplotlib

from bench_results import PEERS, anchor_rows, benchmark_rows, load, peer_ms

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def time_vs_parameters(rows, out):
    sweep = [r for r in rows if r["model"].startswith("sweep_") and r["optimizer"] == "adam"]
    if not sweep:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for backend in sorted({r["backend"] for r in sweep}):
        for towers in sorted({r["towers"] for r in sweep}):
            line = sorted((r["parameters"], r["ms"], r["floor_ms"]) for r in sweep
                          if r["backend"] == backend and r["towers"] == towers)
            if not line:
                continue
            xs = [p for p, _, _ in line]
            ax.plot(xs, [ms for _, ms, _ in line], marker="o", label=f"{backend}, N={towers:g}")
            if backend == "device0":
                ax.plot(xs, [f for _, _, f in line], linestyle="--", color="gray", linewidth=1,
                        label=f"floor, N={towers:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters (float32, one flat variable)")
    ax.set_ylabel("ms per average+apply+broadcast (Adam)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return True


def ratio_to_floor(rows, anchors, out):
    models = [m for m in ("resnet50", "bert_base") if any(r["model"] == m for r in rows)]
    if not models:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5), squeeze=False)
    for ax, model in zip(axes[0], models):
        bars = {}
        for r in rows:
            if r["model"] == model and r["optimizer"] == "adam":
                label = f"{r['backend']}/{r['layout']}" + (" (CPU towers)" if r["exec"] == "host" else "")
                bars[(label, int(r["towers"]))] = r["ratio_to_floor"]
        for a in anchor_rows(anchors):
            if a.get("model") != model:
                continue
            for peer in PEERS:
                if peer_ms(a, peer) is not None:
                    bars[(f"torch:{peer}", int(a["towers"]))] = peer_ms(a, peer) / a["floor_ms"]
        labels = sorted({k[0] for k in bars})
        towers = sorted({k[1] for k in bars})
        width = 0.8 / max(len(towers), 1)
        for j, n in enumerate(towers):
            xs = [i + j * width for i in range(len(labels))]
            ax.bar(xs, [bars.get((label, n), 0) for label in labels], width=width, label=f"N={n}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))])
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_ylabel("time / memory-bandwidth floor (Adam)")
        ax.set_title(model)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return True


def overlap(rows, out):
    models = [m for m in ("resnet50", "bert_base") if any(r["model"] == m for r in rows)]
    if not models:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(9 * len(models), 5), squeeze=False)
    width = 0.27
    for ax, model in zip(axes[0], models):
        mine = sorted((r for r in rows if r["model"] == model), key=lambda r: (r["backend"], r["towers"], -r["compute_ratio"]))
        for j, (key, label) in enumerate((("compute_ms", "compute alone"), ("serial_ms", "serial: compute, then reduce"),
                                          ("overlapped_ms", "overlapped"))):
            ax.bar([i + (j - 1) * width for i in range(len(mine))], [r[key] for r in mine], width=width, label=label)
        for i, r in enumerate(mine):
            ax.annotate(f"hidden {100 * r['hidden_fraction']:.0f}%", (i, max(r["serial_ms"], r["overlapped_ms"])),
                        ha="center", va="bottom", fontsize=7, xytext=(0, 3), textcoords="offset points")
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels([f"{r['backend']}\nN={r['towers']:g}, {r['compute_ratio']:g}x" for r in mine], fontsize=7)
        ax.set_ylabel("ms per step (median)")
        ax.set_title(f"{model}: reduce::host beside a synthetic backward pass (compute = ratio x the reduction)",
                     fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return True


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    anchors = load(directory, "anchors.json")
    rows = benchmark_rows(directory)
    if not rows:
        sys.exit(f"plot.py: no benchmark JSON in {directory}")
    overlap_rows = [r for r in rows if r.get("kind") == "overlap"]
    rows = [r for r in rows if r.get("kind") != "overlap"]
    made = [name for name, ok in (
        ("time_vs_parameters.png", time_vs_parameters(rows, os.path.join(directory, "time_vs_parameters.png"))),
        ("ratio_to_floor.png", ratio_to_floor(rows, anchors, os.path.join(directory, "ratio_to_floor.png"))),
        ("overlap.png", overlap(overlap_rows, os.path.join(directory, "overlap.png"))),
    ) if ok]
    print("plot.py: wrote " + ", ".join(made) if made else "plot.py: nothing to plot")


if __name__ == "__main__":
    main()
