"""Time all-pairs distances (and Biopython's where it can keep up).

    python benchmarks/distances.py [--sizes 1000x10000 20000x10000] [--out DIR]

Random DNA (the time does not depend on the values), JC69 and LogDet. The
floor is the matrix product's arithmetic: `N^2 L 16 x 2` flops for the 4x4
divergence counts, over the device's dense bfloat16 (GPU) or float32 rate;
it is reported as flops per second achieved rather than guessed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax

import jaxphylo as jp
from _common import device_record, random_alignment, save, time_call


def biopython_seconds(alignment) -> float:
    from Bio.Align import MultipleSeqAlignment
    from Bio.Phylo.TreeConstruction import DistanceCalculator
    from Bio.Seq import Seq
    from Bio.SeqRecord import SeqRecord

    records = MultipleSeqAlignment([SeqRecord(Seq(s), id=t) for t, s in zip(alignment.taxa, alignment.sequences)])
    start = time.perf_counter()
    DistanceCalculator("identity").get_distance(records)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=["1000x10000", "20000x10000"])
    parser.add_argument("--biopython", default="200x1000", help="size for the Biopython comparison")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    record = device_record("distances")
    print(f"device: {record['device']}; jax {record['jax']}")
    print(f"{'taxa':>7} {'sites':>7} {'method':>7} {'first s':>8} {'median s':>9} {'TFLOP/s':>8}  Biopython s")
    for size in [args.biopython] + args.sizes:
        taxa, sites = (int(x) for x in size.split("x"))
        alignment = random_alignment(taxa, sites, "dna")
        alignment.encoded()
        bio = biopython_seconds(alignment) if size == args.biopython else None
        for method in ("jc69", "logdet"):
            first, median = time_call(lambda: jp.distances(alignment, method, saturated=10.0), args.repeats)
            rate = taxa * taxa * sites * 16 * 2 / median / 1e12
            row = {"taxa": taxa, "sites": sites, "method": method, "first_s": first, "median_s": median,
                   "tflops": rate, "biopython_identity_s": bio}
            record["rows"].append(row)
            print(f"{taxa:>7} {sites:>7} {method:>7} {first:>8.2f} {median:>9.3f} {rate:>8.1f}  "
                  f"{'' if bio is None else f'{bio:.2f}'}", flush=True)
    save(record, args.out, "distances")


if __name__ == "__main__":
    main()
