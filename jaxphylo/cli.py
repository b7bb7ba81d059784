"""The `jaxphylo` command line."""

from __future__ import annotations

import argparse
import sys
from importlib import resources

from ._errors import JaxphyloError


def _example_paths():
    root = resources.files("jaxphylo").joinpath("examples")
    return str(root.joinpath("example.fasta")), str(root.joinpath("example.nwk"))


EXAMPLE_MODEL = "HKY{4.0}+F{0.3,0.2,0.2,0.3}+G4{0.5}"


def _loglik(args) -> None:
    import time

    import jaxphylo as jp

    if args.example:
        alignment_path, tree_path = _example_paths()
        model_string = args.model or EXAMPLE_MODEL
    else:
        if not (args.alignment and args.tree and args.model):
            raise JaxphyloError("loglik needs ALIGNMENT TREE --model STRING (or --example)")
        alignment_path, tree_path, model_string = args.alignment, args.tree, args.model
    alignment = jp.read_alignment(alignment_path, data_type=args.data_type, genetic_code=args.genetic_code)
    tree = jp.read_tree(tree_path)
    model = jp.parse_model(model_string, alignment=alignment)
    start = time.perf_counter()
    value = float(jp.log_likelihood(alignment, tree, model, precision=args.precision))
    elapsed = time.perf_counter() - start
    if args.example or args.verbose:
        patterns = alignment.site_patterns().num_patterns
        print(f"# {alignment_path}: {len(alignment.taxa)} taxa, {alignment.num_sites} sites, "
              f"{patterns} patterns; model {model_string}; {args.precision}; {elapsed:.2f} s", file=sys.stderr)
    print(f"{value:.6f}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxphylo", description="Differentiable phylogenetics in JAX.")
    commands = parser.add_subparsers(dest="command", required=True)
    loglik = commands.add_parser("loglik", help="print the log-likelihood of an alignment on a fixed tree")
    loglik.add_argument("alignment", nargs="?", help="FASTA, PHYLIP or NEXUS alignment")
    loglik.add_argument("tree", nargs="?", help="Newick or NEXUS tree with branch lengths")
    loglik.add_argument("--model", "-m", help="model string in IQ-TREE syntax, e.g. 'GTR+F+G4{0.5}'")
    loglik.add_argument("--precision", choices=("float64", "float32"), default="float64")
    loglik.add_argument("--data-type", choices=("dna", "protein", "codon"), default=None,
                        help="default: DNA or protein, guessed from the characters")
    loglik.add_argument("--genetic-code", type=int, default=1, help="NCBI table number for codons (default 1)")
    loglik.add_argument("--example", action="store_true", help="use the built-in example data set")
    loglik.add_argument("--verbose", "-v", action="store_true", help="print data sizes and timing to stderr")
    loglik.set_defaults(run=_loglik)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except JaxphyloError as err:
        print(f"jaxphylo: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jaxphylo: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
