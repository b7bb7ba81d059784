"""`jaxphylo models ALIGNMENT`: automatic model selection (IQ-TREE's ModelFinder, `-m MF`) from the command line.

Wired into `jaxphylo.cli.build_parser` by `add_models_command(commands)`; errors
are `JaxphyloError`s, which `jaxphylo.cli.main` prints as one line.
"""

from __future__ import annotations

import sys


def add_models_command(subparsers) -> None:
    """Add the `models` subcommand to the `jaxphylo` parser's subparsers."""
    models = subparsers.add_parser("models", help="choose a substitution model by AIC, AICc or BIC (IQ-TREE's -m MF)")
    models.add_argument("alignment", help="FASTA, PHYLIP or NEXUS alignment (DNA or protein)")
    models.add_argument("--tree", "-t", help="fit every candidate on this topology (default: BIONJ)")
    models.add_argument("--mset", help="substitution models to test, comma-separated (IQ-TREE's -mset), e.g. HKY,TN,GTR")
    models.add_argument("--mrate", help="rate types to test, comma-separated (IQ-TREE's -mrate): E,I,G,I+G,R,I+R")
    models.add_argument("--candidates", help="exact models to test instead, comma-separated, e.g. HKY+G4,GTR+I+G4")
    models.add_argument("--criterion", choices=("BIC", "AIC", "AICc"), default="BIC")
    models.add_argument("--out", "-o", "--prefix", dest="out", help="output prefix (default: the alignment's path)")
    models.add_argument("--data-type", choices=("dna", "protein"), default=None)
    models.add_argument("--precision", choices=("float64", "float32"), default="float64")
    models.add_argument("--quiet", action="store_true", help="no line per fitted candidate on stderr")
    models.set_defaults(run=run_models)


def run_models(args) -> None:
    """Fit the candidates, print the table (best first) and the best model; write PREFIX.models.tsv."""
    import jaxphylo as jp
    from jaxphylo.ml import select_model

    alignment = jp.read_alignment(args.alignment, data_type=args.data_type)
    tree = jp.read_tree(args.tree) if args.tree else None

    def progress(row):
        print(f"# {row.model:<18} log L {row.log_likelihood:12.3f}  df {row.df:3d}  {args.criterion} "
              f"{getattr(row, args.criterion):12.3f}", file=sys.stderr, flush=True)

    result = select_model(alignment, tree, candidates=args.candidates, criterion=args.criterion, mset=args.mset,
                          mrate=args.mrate, progress=None if args.quiet else progress, precision=args.precision)
    prefix = args.out or args.alignment
    path = f"{prefix}.models.tsv"
    try:
        result.to_tsv(path)
    except OSError as err:
        raise jp.JaxphyloError(f"{path}: cannot write: {err.strerror}") from None
    print(result.table())
    print(f"# {len(result.fits)} models fitted in {result.seconds:.1f} s; table -> {path}", file=sys.stderr)
    print(f"Best-fit model according to {result.criterion}: {result.best}")
    print(f"Fitted: {result.model_string}")
