#!/usr/bin/env python3
"""The main job's peer: the same MLP (784-256-128-10, ReLU, softmax cross-entropy) trained by PyTorch on
the CPU, the same way `examples/train` trains it on 2 host towers — batch 128, Adam (lr 0.001), the
Fashion-MNIST images scaled to [0, 1], a fresh shuffle each epoch, the last partial batch dropped — on
`--threads` intra-op threads (2: the towers' count). Its examples/s counts what train's does: the
training steps of each epoch with the batch gathered, not the test evaluation.

    python3 torch_mlp.py [--data DIR] [--epochs N] [--threads N] [--adam default|foreach|fused]

Prints one line per epoch and a last line
    final: test accuracy A% after N epochs; R examples/sec (torch VERSION, adam MODE, T threads)
"""
import argparse
import gzip
import os
import struct
import time

import torch


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, count = struct.unpack(">II", data[:8])
    if magic == 2051:  # images: count, rows, columns, then bytes
        rows, columns = struct.unpack(">II", data[8:16])
        pixels = torch.frombuffer(bytearray(data[16:]), dtype=torch.uint8)
        return pixels.view(count, rows * columns).float() / 255.0
    if magic == 2049:  # labels
        return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).long()
    raise ValueError(f"{path}: not an IDX file of images or labels")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--adam", choices=("default", "foreach", "fused"), default="default")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_x = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    train_y = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    test_x = read_idx(os.path.join(args.data, "t10k-images-idx3-ubyte.gz"))
    test_y = read_idx(os.path.join(args.data, "t10k-labels-idx1-ubyte.gz"))

    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    mode = {} if args.adam == "default" else {args.adam: True}
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, **mode)
    loss_fn = torch.nn.CrossEntropyLoss()
    steps = train_x.shape[0] // args.batch_size
    total_seconds = 0.0
    accuracy = 0.0
    for epoch in range(args.epochs):
        order = torch.randperm(train_x.shape[0])
        start = time.perf_counter()
        for b in range(steps):
            index = order[b * args.batch_size:(b + 1) * args.batch_size]
            images, labels = train_x[index], train_y[index]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - start
        total_seconds += seconds
        with torch.no_grad():
            accuracy = 100.0 * (model(test_x).argmax(1) == test_y).float().mean().item()
        print(f"epoch {epoch + 1}/{args.epochs}: test accuracy {accuracy:.2f}%, "
              f"{steps * args.batch_size / seconds:.1f} examples/sec", flush=True)
    print(f"final: test accuracy {accuracy:.2f}% after {args.epochs} epochs; "
          f"{args.epochs * steps * args.batch_size / total_seconds:.1f} examples/sec "
          f"(torch {torch.__version__}, adam {args.adam}, {args.threads} threads)", flush=True)


if __name__ == "__main__":
    main()
