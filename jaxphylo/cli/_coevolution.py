"""`jaxphylo coevolution`: mutual information between alignment columns, with a shuffling null."""

from __future__ import annotations

import sys


def add_command(commands) -> None:
    coevolution = commands.add_parser("coevolution", help="mutual information between columns, with a shuffling null")
    coevolution.add_argument("alignment")
    coevolution.add_argument("--order", type=int, choices=(2, 3), default=2)
    coevolution.add_argument("--shuffles", type=int, default=1000)
    coevolution.add_argument("--seed", type=int, default=0)
    coevolution.add_argument("--base", type=float, default=None, help="logarithm base (default e; 2 for bits)")
    coevolution.add_argument("--data-type", choices=("dna", "protein"), default=None)
    coevolution.add_argument("--out", "-o", required=True, help="output prefix: PREFIX.tsv and PREFIX.png")
    coevolution.set_defaults(run=run)


def run(args) -> None:
    import numpy as np

    import jaxphylo as jp

    alignment = jp.read_alignment(args.alignment, data_type=args.data_type)
    result = jp.coevolution.mutual_information(alignment, order=args.order, shuffles=args.shuffles,
                                               seed=args.seed, base=args.base, progress=True)
    length = result.mi.shape[0]
    columns = [c for c in np.ndindex(*result.mi.shape) if list(c) == sorted(set(c))]  # i < j (< k)
    names = ["i", "j", "k"][: args.order]
    with open(f"{args.out}.tsv", "w") as handle:
        handle.write("\t".join(names + ["mi", "null_mean", "null_std", "zscore", "percentile"]
                               + (["apc"] if args.order == 2 else [])) + "\n")
        for c in columns:
            values = [result.mi[c], result.null_mean[c], result.null_std[c], result.zscore[c], result.percentile[c]]
            values += [result.apc[c]] if args.order == 2 else []
            handle.write("\t".join([str(x + 1) for x in c] + [f"{v:.8g}" for v in values]) + "\n")
    _heatmap(result, length, f"{args.out}.png")
    print(f"# {length} columns, {args.order}-point MI, {args.shuffles} shuffles -> {args.out}.tsv, {args.out}.png",
          file=sys.stderr)


def _heatmap(result, length, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    z = result.zscore if result.zscore.ndim == 2 else np.max(result.zscore, axis=2)
    figure, axis = plt.subplots(figsize=(6, 5))
    image = axis.imshow(np.where(np.eye(length, dtype=bool), np.nan, z), cmap="viridis", origin="lower")
    axis.set_xlabel("column")
    axis.set_ylabel("column")
    axis.set_title("MI z-score against shuffled columns" + (" (max over k)" if result.zscore.ndim == 3 else ""))
    figure.colorbar(image, ax=axis)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
