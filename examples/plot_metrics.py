#!/usr/bin/env python3
"""Plots a training run's --metrics CSV (examples/train.cpp): loss against step, and test accuracy per
epoch on a second axis, into one PNG. Needs matplotlib (Debian: python3-matplotlib).

    python3 examples/plot_metrics.py METRICS.csv [OUT.png]      (default OUT: METRICS.png)
"""
import csv
import os
import sys


def read(path):
    """(steps, losses) of the progress rows and (steps, accuracies) of the epoch rows."""
    progress, epochs = ([], []), ([], [])
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row["loss"]:
                progress[0].append(int(row["step"]))
                progress[1].append(float(row["loss"]))
            if row["test_accuracy"]:
                epochs[0].append(int(row["step"]))
                epochs[1].append(float(row["test_accuracy"]))
    return progress, epochs


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    source = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.splitext(source)[0] + ".png"
    progress, epochs = read(source)
    if not progress[0] and not epochs[0]:
        sys.exit(f"plot_metrics.py: no rows in {source}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, loss_axis = plt.subplots(figsize=(8, 4.5))
    loss_axis.plot(progress[0], progress[1], color="tab:blue", label="training loss (mean over the log interval)")
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("loss")
    accuracy_axis = loss_axis.twinx()
    accuracy_axis.plot(epochs[0], epochs[1], "o-", color="tab:orange", label="test accuracy (end of epoch)")
    accuracy_axis.set_ylabel("test accuracy, %")
    fig.legend(loc="upper center", ncol=2, fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"plot_metrics.py: wrote {out}")


if __name__ == "__main__":
    main()
