#!/usr/bin/env python3
"""train's progress lines reach a pipe or a file as they are printed, not when a 4 KiB block buffer
fills or the program ends (trainers run under nohup, tee and batch schedulers).

    python3 test_train_line_buffered.py TRAIN

Runs a long training (a progress line every few ms) with stdout a pipe, then a file, and watches the
output: when a progress line first shows, train must still run and fewer than 4096 bytes must have come.
With a block-buffered stdout nothing would show until 4096 bytes had been written (glibc's block for a
pipe or a file), so the first look that finds a progress line would find at least 4096 bytes.
"""
import os
import subprocess
import sys
import tempfile
import time

BLOCK = 4096
DEADLINE_S = 120  # for the first progress line, on a loaded machine
# 1000 steps an epoch, a progress line (~80 bytes) every 10: an epoch prints more than a block, so the
# flush at an epoch's end cannot pass for line buffering.
ARGS = ["--cpu-towers", "--generated", "30000", "--batch-size", "30", "--towers", "1", "--epochs", "100", "--log-every", "10"]


def first_progress(train, stdout, read_so_far):
    """Starts train with `stdout`; polls read_so_far() until it holds a progress line; returns what it
    held then and whether train was still running."""
    process = subprocess.Popen([train] + ARGS, stdout=stdout, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            running = process.poll() is None  # before the read: a line read next was out while train ran
            seen = read_so_far()
            if b"\nstep 10/" in seen or not running or time.monotonic() > deadline:
                return seen, running
            time.sleep(0.005)
    finally:
        process.kill()
        process.wait()


def check(kind, seen, running):
    if b"\nstep 10/" not in seen:
        sys.exit(f"{kind}: no progress line within {DEADLINE_S} s; got {len(seen)} bytes:\n{seen.decode(errors='replace')}")
    if not running:
        sys.exit(f"{kind}: the first progress line showed only when train had ended")
    if len(seen) >= BLOCK:
        sys.exit(f"{kind}: the first progress line came with {len(seen)} bytes: a block buffer, not lines")
    print(f"{kind}: the first progress line came after {len(seen)} bytes, train still running")


def main():
    train = sys.argv[1]
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    received = bytearray()

    def read_pipe():
        try:
            while chunk := os.read(read_end, 65536):
                received.extend(chunk)
        except BlockingIOError:
            pass
        return bytes(received)

    try:
        seen, running = first_progress(train, write_end, read_pipe)
    finally:
        os.close(write_end)
        os.close(read_end)
    check("pipe", seen, running)

    with tempfile.NamedTemporaryFile() as file:
        seen, running = first_progress(train, file, lambda: open(file.name, "rb").read())
    check("file", seen, running)


if __name__ == "__main__":
    main()
