"""Time mutual information with a shuffling null at the sizes of Waechter et al. (2012).

    python benchmarks/coevolution.py [--shuffles N] [--out DIR]

Calmodulin-size: 753 protein sequences x 264 columns, 2-point; ribozyme-size:
140 nucleotide sequences x 71 columns, 3-point. Random sequences (time does
not depend on the values). Their GTX 480: 1.03 min and 0.445 min for 10,000
shuffles; targets on the H100: under 10 s and under 5 s.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jaxphylo as jp
from _common import device_record, random_alignment, save, time_call

CASES = [("calmodulin", 753, 264, "protein", 2, 61.8), ("ribozyme", 140, 71, "dna", 3, 26.7)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shuffles", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    record = device_record("coevolution")
    print(f"device: {record['device']}; jax {record['jax']}; {args.shuffles} shuffles")
    print(f"{'case':>11} {'seqs':>5} {'cols':>5} {'order':>5} {'first s':>8} {'median s':>9} {'paper GTX 480 s':>15}")
    for name, sequences, columns, alphabet, order, paper in CASES:
        alignment = random_alignment(sequences, columns, alphabet)
        first, median = time_call(
            lambda: jp.coevolution.mutual_information(alignment, order=order, shuffles=args.shuffles).mi,
            args.repeats)
        row = {"case": name, "sequences": sequences, "columns": columns, "order": order,
               "shuffles": args.shuffles, "first_s": first, "median_s": median, "paper_gtx480_s": paper}
        record["rows"].append(row)
        print(f"{name:>11} {sequences:>5} {columns:>5} {order:>5} {first:>8.2f} {median:>9.2f} {paper:>15.1f}", flush=True)
    save(record, args.out, "coevolution")


if __name__ == "__main__":
    main()
