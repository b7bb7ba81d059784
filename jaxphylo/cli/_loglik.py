"""`jaxphylo loglik`: the log-likelihood of an alignment on a fixed tree."""

from __future__ import annotations

import sys

from .._errors import JaxphyloError
from ._common import EXAMPLE_MODEL, add_data_options, add_partition_options, example_paths, partition_choice, partitioned_model_of


def add_command(commands) -> None:
    loglik = commands.add_parser("loglik", help="print the log-likelihood of an alignment on a fixed tree")
    loglik.add_argument("alignment", nargs="?", help="FASTA, PHYLIP or NEXUS alignment")
    loglik.add_argument("tree", nargs="?", help="Newick or NEXUS tree with branch lengths")
    loglik.add_argument("--model", "-m", help="model string in IQ-TREE syntax, e.g. 'GTR+F+G4{0.5}'; with -p/-q/-Q: "
                                              "the model of the parts that name none (not needed when all do)")
    add_data_options(loglik)
    loglik.add_argument("--example", action="store_true", help="use the built-in example data set")
    loglik.add_argument("--verbose", "-v", action="store_true", help="print data sizes and timing to stderr")
    add_partition_options(loglik, "partitions with unlinked branch lengths (here: the tree's in each)")
    loglik.add_argument("--part-rates", help="with -p: the parts' rates, e.g. 0.5,0.3,2.2 (scaled to a site-weighted "
                                             "mean of 1; default all 1)")
    loglik.set_defaults(run=run)


def run(args) -> None:
    import time

    import numpy as np

    import jaxphylo as jp
    from jaxphylo.likelihood import require_finite

    if args.example:
        alignment_path, tree_path = example_paths()
        model_string = args.model or EXAMPLE_MODEL
    else:
        if not (args.alignment and args.tree and (args.model or partition_choice(args))):
            raise JaxphyloError("loglik needs ALIGNMENT TREE --model STRING (or -p/-q/-Q FILE naming every part's "
                                "model, or --example)")
        alignment_path, tree_path, model_string = args.alignment, args.tree, args.model
    alignment = jp.read_alignment(alignment_path, data_type=args.data_type, genetic_code=args.genetic_code)
    tree = jp.read_tree(tree_path)
    model = _model(jp, args, alignment, model_string)
    start = time.perf_counter()
    value = float(jp.log_likelihood(alignment, tree, model, precision=args.precision))
    elapsed = time.perf_counter() - start
    if not np.isfinite(value) and not isinstance(model, jp.PartitionedModel):
        per_pattern = jp.pattern_log_likelihoods(alignment, tree, model, precision=args.precision)
        require_finite(value, model=model, tree=tree, per_pattern=per_pattern)
    if isinstance(model, jp.PartitionedModel):
        parts = jp.partitioned_log_likelihoods(alignment, tree, model, precision=args.precision)
        require_finite(value, model=model, tree=tree, where="partitioned log-likelihood")
        for name, part in zip(model.names, np.asarray(parts)):
            print(f"# part {name}: {part:.6f}", file=sys.stderr)
    if args.example or args.verbose:
        patterns = alignment.site_patterns().num_patterns
        shown = model_string or ", ".join(f"{m}:{n}" for m, n in zip(model.model_strings, model.names))
        print(f"# {alignment_path}: {len(alignment.taxa)} taxa, {alignment.num_sites} sites, "
              f"{patterns} patterns; model {shown}; {args.precision}; {elapsed:.2f} s", file=sys.stderr)
    print(f"{value:.6f}")


def _model(jp, args, alignment, model_string):
    """The model string's model, or with -p/-q/-Q FILE a partitioned one (the string, or None without -m: parts
    without a model)."""
    if partition_choice(args) is None:
        return jp.parse_model(model_string, alignment=alignment)
    rates = None
    if args.part_rates:
        try:
            rates = [float(x) for x in args.part_rates.split(",")]
        except ValueError:
            raise JaxphyloError(f"--part-rates {args.part_rates!r}: write numbers separated by commas") from None
    return partitioned_model_of(args, alignment, model_string, rates)
