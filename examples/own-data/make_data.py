"""Write this example's own dataset: three interleaved spirals as a CSV (x, y, label).

    python examples/own-data/make_data.py            # -> examples/own-data/data/spirals.csv
    python examples/own-data/make_data.py --out DIR  # -> DIR/spirals.csv

A stand-in for a team's own data: a small file with a header, a `label` column and float
features, the layout trainhub.data.mounted reads as `csv` (docs/data.md).
"""

import argparse
import csv
import math
import random
from pathlib import Path

POINTS_PER_CLASS = 300
CLASSES = 3
NOISE = 0.08


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    args = parser.parse_args()
    rng = random.Random(0)  # the same file every time: pushing it again stores nothing
    target = args.out / "spirals.csv"
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["x", "y", "label"])
        for label in range(CLASSES):
            for i in range(POINTS_PER_CLASS):
                r = i / POINTS_PER_CLASS
                angle = 4.0 * r + label * 2 * math.pi / CLASSES + rng.gauss(0, NOISE)
                writer.writerow([f"{r * math.sin(angle):.5f}", f"{r * math.cos(angle):.5f}", label])
    print(f"wrote {target} ({CLASSES * POINTS_PER_CLASS} rows)")


if __name__ == "__main__":
    main()
