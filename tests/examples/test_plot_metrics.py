"""examples/plot_metrics.py on a hand-made --metrics CSV: the rows it reads, and the PNG it writes (the
plot is skipped, exit 77, where matplotlib is missing)."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
import plot_metrics  # noqa: E402

CSV = """step,epoch,loss,examples_per_second,ms_per_step,test_accuracy
5,1,2.42921,1454.74,27.4962,
10,1,1.82401,1663.89,24.0401,
10,1,,,,84.17
15,2,0.7315,704.4,56.79,
20,2,0.1789,1190.9,33.59,
20,2,,,,100
"""


def main():
    with tempfile.TemporaryDirectory() as work:
        source = os.path.join(work, "run.csv")
        with open(source, "w") as handle:
            handle.write(CSV)
        progress, epochs = plot_metrics.read(source)
        assert progress == ([5, 10, 15, 20], [2.42921, 1.82401, 0.7315, 0.1789]), progress
        assert epochs == ([10, 20], [84.17, 100.0]), epochs
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib missing: the rows were checked, the plot is skipped")
            return 77
        subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "examples", "plot_metrics.py"), source], check=True)
        png = os.path.join(work, "run.png")
        with open(png, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return 0


if __name__ == "__main__":
    sys.exit(main())
