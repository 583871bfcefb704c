#!/usr/bin/env python3
"""The main job against PyTorch on the same CPU, measured in one run: `examples/train` (the MLP on 2 host
towers, its defaults, under the OPENBLAS_CORETYPE examples/run.sh would choose) and `torch_mlp.py` (the same MLP, batch, optimizer and data on 2 threads) in turns,
`--rounds` times, so that a change in the machine's load reaches both alike. Prints each run's examples/s,
the medians, and train's median over each PyTorch mode's; writes every figure as JSON (--out).

    python3 benchmarks/peers/main_job_vs_torch.py --train build/default/examples/train \\
        --python VENV/bin/python [--epochs 3] [--rounds 5] [--adam fused,default] [--out FILE]

PyTorch is not a dependency of the project: --python names an interpreter that has it.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FINAL = re.compile(r"final: test accuracy ([0-9.]+)% after [0-9]+ epochs; ([0-9.]+) examples/sec")


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def run(command, env=None):
    """Runs one training; its accuracy, examples/s and whole output."""
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    match = FINAL.search(out)
    if not match:
        raise RuntimeError(f"{' '.join(command)}: no 'final:' line in its output:\n{out}")
    return float(match.group(1)), float(match.group(2)), out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True, help="the training program (build/default/examples/train)")
    parser.add_argument("--python", default=sys.executable, help="an interpreter that has torch")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--adam", default="fused,default", help="PyTorch's Adam modes to run (comma-separated)")
    parser.add_argument("--train-args", default="", help="more arguments for train (space-separated)")
    parser.add_argument("--out", default="", help="write the figures as JSON here")
    args = parser.parse_args()

    train_command = [args.train, "--epochs", str(args.epochs)] + args.train_args.split()
    train_env = dict(os.environ)
    if not train_env.get("OPENBLAS_CORETYPE"):  # as examples/run.sh does
        core = subprocess.run([args.train, "--openblas-core"], check=True, capture_output=True, text=True).stdout.strip()
        if core:
            train_env["OPENBLAS_CORETYPE"] = core
            print(f"OPENBLAS_CORETYPE={core} for train, as examples/run.sh sets it")
    modes = args.adam.split(",")
    figures = {"train": []} | {f"torch {m}": [] for m in modes}
    accuracy = {}
    blas = torch_version = ""
    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for r in range(args.rounds):
        acc, rate, out = run(train_command, train_env)
        figures["train"].append(rate)
        accuracy["train"] = acc
        blas = next((line[len("blas: "):] for line in out.splitlines() if line.startswith("blas: ")), "not printed")
        print(f"round {r + 1}: train {rate:.0f} examples/s ({acc:.2f}%)", end="", flush=True)
        for m in modes:
            acc, rate, out = run([args.python, os.path.join(HERE, "torch_mlp.py"), "--epochs", str(args.epochs),
                                  "--threads", "2", "--adam", m])
            figures[f"torch {m}"].append(rate)
            accuracy[f"torch {m}"] = acc
            torch_version = re.search(r"\(torch ([^,]+),", out).group(1)
            print(f", torch {m} {rate:.0f} ({acc:.2f}%)", end="", flush=True)
        print()
    medians = {name: statistics.median(rates) for name, rates in figures.items()}
    print(f"\nCPU: {cpu_model()}, {os.cpu_count()} logical CPUs; load average {load:.2f} at the start ({started})")
    print(f"train: blas {blas}; torch {torch_version}, 2 threads")
    print(f"MLP 784-256-128-10, batch 128, Adam lr 0.001, {args.epochs} epochs a run, {args.rounds} rounds (medians):")
    for name, value in medians.items():
        print(f"  {name:16s} {value:9.0f} examples/s  (runs: {', '.join(f'{x:.0f}' for x in figures[name])})")
    for m in modes:
        print(f"  train / torch {m}: {medians['train'] / medians[f'torch {m}']:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "load_average_at_start": load, "started": started,
                       "blas": blas, "torch": torch_version, "epochs": args.epochs, "rounds": args.rounds,
                       "examples_per_second": figures, "medians": medians, "test_accuracy": accuracy}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
