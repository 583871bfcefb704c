"""benchmarks/table.py on hand-made rows: which rows it keeps, the speed-ups over the peers and the
verdict on each target, against values worked out by hand below."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
import table  # noqa: E402


def row(backend, layout, towers, ms, floor_ms, model="resnet50", optimizer="adam", exec_space="cuda"):
    return {"backend": backend, "exec": exec_space, "model": model, "optimizer": optimizer, "layout": layout,
            "towers": towers, "ms": ms, "floor_ms": floor_ms, "ratio_to_floor": ms / floor_ms}


ANCHORS = {"results": [{"model": "resnet50", "towers": 2, "floor_ms": 0.217, "tf_tower": [12.7, 12.0, 13.0],
                        "torch_fused": [0.854, 0.8, 0.9], "host_ps": [101.0, 99.0, 104.0]}]}


class table_test(unittest.TestCase):
    def setUp(self):
        rows = [
            row("device0", "flat", 2, 0.220, 0.217),          # 1.0138x floor: meets 1.05
            row("p2p_tree", "per_variable", 2, 0.300, 0.217),  # 1.3825x floor: misses 1.10
            row("host", "flat", 2, 10.0, 8.0),                 # 1.25x its floor: meets 1.5
            row("device0", "flat", 1, 0.150, 0.140),           # N = 1: no targets
            row("device0", "flat", 2, 0.5, 0.4, optimizer="sgd"),       # not Adam: left out
            row("host", "flat", 2, 15.0, 14.0, exec_space="host"),      # CPU towers: left out
            row("device0", "flat", 2, 4.0, 3.9, model="sweep_16M"),     # sweep: left out
        ]
        self.entries = {(e["backend"], e["towers"]): e for e in table.compare(rows, ANCHORS)}

    def test_keeps_gpu_tower_adam_rows_of_the_models(self):
        self.assertEqual(sorted(self.entries), [("device0", 1), ("device0", 2), ("host", 2), ("p2p_tree", 2)])

    def test_speedups_are_peer_time_over_ours(self):
        device0 = self.entries[("device0", 2)]
        self.assertAlmostEqual(device0["speedups"]["torch_fused"], 0.854 / 0.220)  # 3.88
        self.assertAlmostEqual(device0["speedups"]["tf_tower"], 12.7 / 0.220)      # 57.7
        self.assertAlmostEqual(self.entries[("host", 2)]["speedups"]["host_ps"], 10.1)
        self.assertEqual(self.entries[("device0", 1)]["speedups"], {})  # no anchor row for N = 1

    def test_targets_come_from_the_floor(self):
        verdicts = lambda key: [(c.what, c.met) for c in self.entries[key]["checks"]]
        bounds = lambda key: [round(c.bound, 3) for c in self.entries[key]["checks"]]
        # device0, flat: 1.05; torch fused 0.854 / (1.05 * 0.217) = 3.748, op-by-op 12.7 / 0.22785 = 55.738.
        self.assertEqual(verdicts(("device0", 2)), [("floor", True), ("torch fused", True), ("op-by-op", True)])
        self.assertEqual(bounds(("device0", 2)), [1.05, 3.748, 55.738])
        # p2p_tree, per_variable, N = 2: 1.10 * (40 - 4) / (16 + 20) = 1.10; 0.854 / 0.2387 = 3.578 > 2.85.
        self.assertEqual(verdicts(("p2p_tree", 2)), [("floor", False), ("torch fused", False), ("op-by-op", False)])
        self.assertEqual(bounds(("p2p_tree", 2)), [1.1, 3.578, 53.205])
        # reduce::host: 1.5; CPU PS 101 / (1.5 * 8.0) = 8.417 < 10.1.
        self.assertEqual(verdicts(("host", 2)), [("floor", True), ("CPU PS", True)])
        self.assertEqual(bounds(("host", 2)), [1.5, 8.417])
        self.assertEqual(verdicts(("device0", 1)), [])

    def test_p2p_tree_bound_scales_with_its_bytes_on_one_device(self):
        # N = 8: (160 - 12) / (64 + 20) = 1.7619; flat: 1.05 * 1.7619 = 1.85.
        self.assertAlmostEqual(table.floor_bound(row("p2p_tree", "flat", 8, 1.0, 1.0)), 1.05 * 148 / 84)
        self.assertAlmostEqual(table.floor_bound(row("device0 checked", "flat", 8, 1.0, 1.0)), 1.05)

    def test_markdown_has_a_line_per_entry(self):
        text = table.markdown(table.compare([row("device0", "flat", 2, 0.220, 0.217)], ANCHORS))
        lines = text.splitlines()
        self.assertEqual(len(lines), 3)
        # 0.854 / 0.22 = 3.88, 12.7 / 0.22 = 57.73, 101 / 0.22 = 459.09
        self.assertIn("| ResNet-50 | 2 | device0 | flat | 0.220 | 0.217 | 1.01 | 3.9x | 57.7x | 459.1x |", lines[2])
        self.assertIn("floor <= 1.05x: met (1.01x)", lines[2])


if __name__ == "__main__":
    unittest.main()
