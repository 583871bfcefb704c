#!/usr/bin/env python3
"""Line coverage of the library on the host, per header, from gcovr's JSON (tests/coverage.sh makes it).

Prints every library header's executed / executable lines, then one figure: the library lines never
executed on the host = the executable lines gcov reports unexecuted in the headers a host build compiles,
plus the code lines (not blank, not comment-only) of every header no host build compiles (the CUDA-only
shells, which only nvcc compiles). Which headers a host build compiles comes from the build's dependency
lists (--deps: `ninja -t deps`): gcov lists only headers with executable lines, and a header of
declarations alone is compiled all the same. Exits 1 when that figure is above --limit.
"""
import argparse
import json
import os
import re
import sys


def code_lines(path):
    """Lines that are neither blank nor comment-only (// and /* */ comments)."""
    count, in_block = 0, False
    for line in open(path, encoding='utf-8'):
        text = line.strip()
        if in_block:
            if '*/' not in text:
                continue
            text, in_block = text.split('*/', 1)[1].strip(), False
        if text.startswith('/*') and '*/' not in text:
            in_block = True
            continue
        text = re.sub(r'/\*.*?\*/', '', text).strip()
        if text and not text.startswith('//'):
            count += 1
    return count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('json', help="gcovr --json output")
    parser.add_argument('--include', required=True, help='the include/ folder')
    parser.add_argument('--deps', required=True, help="`ninja -t deps` of the build: the headers it compiled")
    parser.add_argument('--limit', type=int, default=None)
    args = parser.parse_args()
    compiled = {os.path.realpath(line.strip()) for line in open(args.deps) if line.startswith((' ', '\t'))}
    root = os.path.realpath(os.path.join(args.include, 'towerpipe'))
    report = json.load(open(args.json))
    covered = {}  # header (relative to include/towerpipe) -> {line: executed}
    for f in report['files']:
        path = os.path.realpath(os.path.join(report.get('root', ''), f['file']))
        if not path.startswith(root + os.sep):
            continue
        lines = covered.setdefault(os.path.relpath(path, root), {})
        for line in f['lines']:
            if line.get('gcovr/noncode'):
                continue
            number = line['line_number']
            lines[number] = lines.get(number, False) or line['count'] > 0
    headers = sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names
                     if n.endswith(('.hpp', '.cuh')))
    unexecuted, never_compiled = [], []
    total_executable = total_executed = 0
    print(f"{'header':58} {'executed':>9} {'of':>6} {'lines':>6}")
    for header in headers:
        if header in covered:
            lines = covered[header]
            executed = sum(1 for hit in lines.values() if hit)
            total_executable += len(lines)
            total_executed += executed
            missing = len(lines) - executed
            print(f"{header:58} {executed:9d} {'of':>6} {len(lines):6d}" + (f"   ({missing} not run)" if missing else ""))
            if missing:
                unexecuted.append((header, missing))
        elif os.path.join(root, header) in compiled:
            print(f"{header:58} {'compiled, no executable lines':>23}")
        else:
            never_compiled.append((header, code_lines(os.path.join(root, header))))
    print()
    print(f"headers a host build compiles: {len(covered)}, {total_executed} of {total_executable} executable lines run "
          f"({100.0 * total_executed / max(total_executable, 1):.1f}%)")
    print(f"headers no host build compiles: {len(never_compiled)}")
    for header, count in sorted(never_compiled, key=lambda h: -h[1]):
        print(f"  {header:56} {count:5d} code lines")
    figure = sum(m for _, m in unexecuted) + sum(c for _, c in never_compiled)
    print(f"\nlibrary lines never executed on the host: {figure} "
          f"({sum(m for _, m in unexecuted)} unexecuted in compiled headers + {sum(c for _, c in never_compiled)} in headers no host build compiles)")
    if args.limit is not None and figure > args.limit:
        print(f"FAILED: above the limit of {args.limit}")
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
