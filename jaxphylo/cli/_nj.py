"""`jaxphylo nj`: a neighbour-joining or BIONJ tree from an alignment or a distance matrix."""

from __future__ import annotations

import sys


def add_command(commands) -> None:
    nj = commands.add_parser("nj", help="neighbour-joining or BIONJ tree from an alignment or a distance matrix")
    nj.add_argument("input", help="alignment, or a PHYLIP distance matrix with --matrix")
    nj.add_argument("--matrix", action="store_true", help="INPUT is a PHYLIP distance matrix")
    nj.add_argument("--method", choices=("nj", "bionj"), default="bionj")
    nj.add_argument("--distance", help="distance for an alignment (as in 'jaxphylo distance')")
    nj.add_argument("--saturated", type=float, default=5.0, help="distance for saturated pairs (default 5)")
    nj.add_argument("--data-type", choices=("dna", "protein"), default=None)
    nj.add_argument("--out", "-o", required=True, help="output Newick file")
    nj.set_defaults(run=run)


def run(args) -> None:
    import jaxphylo as jp

    if args.matrix:
        matrix, taxa = jp.io.read_distance_matrix(args.input)
    else:
        alignment = jp.read_alignment(args.input, data_type=args.data_type)
        matrix, taxa = jp.distances(alignment, args.distance, saturated=args.saturated), alignment.taxa
    build = jp.bionj if args.method == "bionj" else jp.neighbor_joining
    jp.write_tree(build(matrix, taxa), args.out)
    print(f"# {args.method} tree of {len(taxa)} taxa -> {args.out}", file=sys.stderr)
