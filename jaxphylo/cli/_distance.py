"""`jaxphylo distance`: all-pairs distances of an alignment, as a PHYLIP matrix."""

from __future__ import annotations

import sys


def add_command(commands) -> None:
    distance = commands.add_parser("distance", help="all-pairs distances, written as a PHYLIP matrix")
    distance.add_argument("alignment")
    distance.add_argument("--method", help="DNA: p, jc69 (default), k2p, tn93, logdet; protein: p, poisson (default)")
    distance.add_argument("--saturated", type=float, default=float("inf"),
                          help="value for saturated pairs (default inf)")
    distance.add_argument("--data-type", choices=("dna", "protein"), default=None)
    distance.add_argument("--out", "-o", required=True, help="output PHYLIP distance file")
    distance.set_defaults(run=run)


def run(args) -> None:
    import jaxphylo as jp

    alignment = jp.read_alignment(args.alignment, data_type=args.data_type)
    matrix = jp.distances(alignment, args.method, saturated=args.saturated)
    jp.io.write_distance_matrix(matrix, alignment.taxa, args.out)
    print(f"# {len(alignment.taxa)} taxa, {args.method or 'default'} distances -> {args.out}", file=sys.stderr)
