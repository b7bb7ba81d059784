"""`jaxphylo models ALIGNMENT`: automatic model selection (IQ-TREE's ModelFinder, `-m MF`) from the command line.

Wired into `jaxphylo.cli.build_parser` by `add_models_command(commands)`; errors
are `JaxphyloError`s, which `jaxphylo.cli.main` prints as one line.
"""

from __future__ import annotations

import sys
from pathlib import Path


def add_command(subparsers) -> None:
    """Add the `models` subcommand to the `jaxphylo` parser's subparsers."""
    models = subparsers.add_parser("models", help="choose a substitution model by AIC, AICc or BIC (IQ-TREE's -m MF)")
    models.add_argument("alignment", help="FASTA, PHYLIP or NEXUS alignment (DNA or protein)")
    models.add_argument("--tree", "-t", help="fit every candidate on this topology (default: BIONJ)")
    models.add_argument("--mset", help="substitution models to test, comma-separated (IQ-TREE's -mset), e.g. HKY,TN,GTR")
    models.add_argument("--mrate", help="rate types to test, comma-separated (IQ-TREE's -mrate): E,I,G,I+G,R,I+R; "
                        "R is +R2..+R10, stopping once the criterion worsens. Given, every type is fitted for every model; "
                        "the default (IQ-TREE's AUTO: E,I,G,I+G,R) keeps after the first model only the types "
                        "within 10 of its best, as IQ-TREE does")
    models.add_argument("--candidates", help="exact models to test instead, comma-separated, e.g. HKY+G4,GTR+I+G4")
    models.add_argument("-p", "--partitions", metavar="FILE",
                        help="select a model for every part of this partition file (NEXUS sets or RAxML-style), on "
                             "one shared tree; writes PREFIX.best_scheme.nex")
    models.add_argument("--criterion", choices=("BIC", "AIC", "AICc"), default="BIC")
    models.add_argument("--out", "-o", "--prefix", dest="out", help="output prefix (default: the alignment's path)")
    models.add_argument("--data-type", choices=("dna", "protein"), default=None)
    models.add_argument("--precision", choices=("float64", "float32"), default="float64")
    models.add_argument("--quiet", action="store_true", help="no line per fitted candidate on stderr")
    models.set_defaults(run=run)


def run(args) -> None:
    """Fit the candidates, print the table (best first) and the best model; write PREFIX.models.tsv."""
    import jaxphylo as jp
    from jaxphylo.ml import select_model

    alignment = jp.read_alignment(args.alignment, data_type=args.data_type)
    tree = jp.read_tree(args.tree) if args.tree else None

    def progress(row):
        print(f"# {row.model:<18} log L {row.log_likelihood:12.3f}  df {row.df:3d}  {args.criterion} "
              f"{getattr(row, args.criterion):12.3f}", file=sys.stderr, flush=True)

    options = dict(candidates=args.candidates, criterion=args.criterion, mset=args.mset, mrate=args.mrate,
                   progress=None if args.quiet else progress, precision=args.precision)
    prefix = args.out or args.alignment
    if args.partitions:
        _run_per_part(alignment, tree, args, options, prefix)
        return
    result = select_model(alignment, tree, **options)
    path = f"{prefix}.models.tsv"
    _write(path, result.to_tsv)
    print(result.table())
    print(f"# {len(result.fits)} models fitted in {result.seconds:.1f} s; table -> {path}", file=sys.stderr)
    print(f"Best-fit model according to {result.criterion}: {result.best}")
    print(f"Fitted: {result.model_string}")


def _run_per_part(alignment, tree, args, options, prefix) -> None:
    """`-p`: a selection per part; a table each (PREFIX.PART.models.tsv) and PREFIX.best_scheme.nex."""
    import jaxphylo as jp
    from jaxphylo.ml import best_scheme_nexus, select_part_models

    scheme = jp.read_partitions(args.partitions)
    selections = select_part_models(alignment, scheme, tree, **options)
    for name, result in selections.items():
        _write(f"{prefix}.{name}.models.tsv", result.to_tsv)
        print(f"# part {name}\n{result.table()}")
    path = f"{prefix}.best_scheme.nex"
    _write(path, lambda p: Path(p).write_text(best_scheme_nexus(scheme, selections)))
    chosen = ", ".join(f"{name}: {result.best}" for name, result in selections.items())
    print(f"Best-fit models according to {args.criterion}: {chosen}")
    print(f"# scheme with the chosen models -> {path} (use it with -p)", file=sys.stderr)


def _write(path, writer) -> None:
    import jaxphylo as jp

    try:
        writer(path)
    except OSError as err:
        raise jp.JaxphyloError(f"{path}: cannot write: {err.strerror}") from None
