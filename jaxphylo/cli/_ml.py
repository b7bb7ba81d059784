"""`jaxphylo ml`: maximum likelihood: model fit or selection, tree search, branch supports."""

from __future__ import annotations

import sys

from .._errors import JaxphyloError
from ._common import (
    add_data_options, add_mesh_options, add_partition_options, mesh_choice, model_or_partitions, partition_choice,
    partitioned_model_of,
)


def add_command(commands) -> None:
    ml = commands.add_parser("ml", help="maximum-likelihood tree: model fit, NNI/SPR search, branch support")
    ml.add_argument("alignment", help="FASTA, PHYLIP or NEXUS alignment")
    ml.add_argument("--model", "-m",
                    help="model string in IQ-TREE syntax, e.g. GTR+G4; MFP: select by BIC, then search; MF: select "
                         "only. With -p/-q/-Q: the model of the parts that name none (not needed when all do)")
    ml.add_argument("--tree", "-t", help="start tree (Newick/NEXUS; default: BIONJ)")
    ml.add_argument("-te", metavar="TREE", help="fit the model and branch lengths on this topology, no search "
                                                "(IQ-TREE's -te)")
    add_partition_options(ml, "partitions with unlinked branch lengths (each part its own; PREFIX.parttrees)")
    ml.add_argument("--ninit", "--starts", dest="starts", type=int, default=100,
                    help="start trees: BIONJ and randomised stepwise-addition parsimony trees (IQ-TREE's -ninit)")
    ml.add_argument("--ntop", type=int, default=20, help="best starts NNI-climbed to seed the candidate set "
                                                          "(IQ-TREE's -ntop)")
    ml.add_argument("--fast", action="store_true", help="one start (BIONJ), NNI and SPR at radius 5 while it gains, "
                                                        "no perturbation (RAxML-NG's --fast, FastTree's regime)")
    ml.add_argument("--bootstrap", "-b", type=int, default=0, help="non-parametric bootstrap replicates")
    ml.add_argument("--alrt", type=int, default=0, help="SH-aLRT RELL replicates (IQ-TREE: 1000)")
    ml.add_argument("-B", "--ufboot", type=int, default=0,
                    help="ultrafast bootstrap replicates (IQ-TREE's -B; at least 1000): RELL over the trees the "
                         "search meets; the search goes on until the supports settle; PREFIX.ufboot")
    ml.add_argument("--bnni", "-bnni", action="store_true",
                    help="with -B: NNI-climb every replicate's tree on its own resampled sites (UFBoot2's -bnni, "
                         "against model violations)")
    ml.add_argument("-nstep", type=int, default=100, help="with -B: perturbed trees between checks of the supports")
    ml.add_argument("-nm", type=int, default=1000, help="with -B: perturbed trees at most while supports settle")
    ml.add_argument("-bcor", type=float, default=0.99, help="with -B: the correlation of two checks' supports that "
                                                            "ends the search")
    ml.add_argument("-beps", type=float, default=0.5, help="with -B: RELL log L closer than this tie")
    ml.add_argument("--patience", type=int, default=100, help="perturbed trees without improvement before stopping")
    ml.add_argument("--batch", type=int, default=0,
                    help="trees perturbed and climbed together per round (0: chosen from the device and its memory)")
    ml.add_argument("--radius", type=int, default=5, help="first SPR regraft radius, widened by 5 while it gains "
                                                          "(0: NNI only)")
    ml.add_argument("--seed", type=int, default=0)
    ml.add_argument("--out", "-o", "--prefix", dest="out", help="output prefix (default: the alignment's name)")
    add_data_options(ml)
    ml.add_argument("--resume", action="store_true", help="continue the search saved in PREFIX.ckpt")
    ml.add_argument("--redo", action="store_true", help="ignore and replace a saved search with this prefix")
    ml.add_argument("--dry-run", action="store_true",
                    help="print the data sizes, memory per device and the time of one evaluation; then exit")
    ml.add_argument("--max-time", help="stop, saved, after this long (e.g. 23h); SIGTERM, SIGINT, SIGUSR1 too")
    add_mesh_options(ml, "every visible device, the search's trees and bootstrap replicates over batch")
    ml.set_defaults(run=run)


def run(args) -> None:
    import json
    import time
    from pathlib import Path

    import jax
    import numpy as np

    import jaxphylo as jp
    from jaxphylo import ml
    from jaxphylo.runtime import is_local, peak_memory_text, run_mesh

    prefix = args.out or args.alignment
    alignment = jp.read_alignment(args.alignment, data_type=args.data_type, genetic_code=args.genetic_code)
    partitions = partition_choice(args)
    model_string = model_or_partitions(args, "ml")
    if args.tree and args.te:
        raise JaxphyloError("give --tree (a start for the search) or -te (a fixed topology), not both")
    fixed = jp.read_tree(args.te) if args.te else None
    start = jp.read_tree(args.tree) if args.tree else fixed
    if args.bootstrap and fixed is not None:
        raise JaxphyloError("--bootstrap searches a tree per replicate; it does not combine with -te")
    if args.ufboot and fixed is not None:
        raise JaxphyloError("-B samples the trees a search meets; it does not combine with -te")
    if args.bnni and not args.ufboot:
        raise JaxphyloError("--bnni refines ultrafast bootstrap trees: give -B too")
    ufboot = ml.UFBootSettings(args.ufboot, args.bnni, args.nstep, args.nm, args.bcor, args.beps) if args.ufboot \
        else 0
    selecting = _selecting(model_string)
    model = partitioned_model_of(args, alignment, model_string) if partitions and not selecting else model_string
    # Bad input fails here, before any output (with MF/MFP only the start tree can be checked yet).
    ml.check_inputs(alignment, None if selecting else model, start)
    options = dict(patience=args.patience, batch=args.batch, radius=args.radius, starts=args.starts, top=args.ntop)
    settings = ml.SearchSettings.fast() if args.fast else ml.SearchSettings(**options)
    if args.dry_run:
        _dry_run(alignment, start, model, args, settings)
        return
    if args.redo:
        for stale in (f"{prefix}.ckpt", f"{prefix}.boot.ckpt"):
            Path(stale).unlink(missing_ok=True)
    ml.search_checkpoint(f"{prefix}.ckpt").check(args.resume)  # before the log of a saved run is overwritten
    # The log holds what the run found, never how long it took, so that a rerun or a resumed run writes the same
    # bytes; times and memory go to stderr only. A resumed search replays its saved rounds into the new log.
    log_file = open(f"{prefix}.log", "w")

    def log(text, aside=""):
        print(text + aside, file=sys.stderr, flush=True)
        log_file.write(text + "\n")
        log_file.flush()

    log(f"# jaxphylo ml {args.alignment}: {len(alignment.taxa)} taxa, {alignment.num_sites} sites, "
        f"{alignment.site_patterns().num_patterns} patterns; model {model_string or 'per part: ' + partitions[0]}")
    if selecting:  # IQ-TREE's -m MF (select only) and -m MFP (select, then search with the winner)
        model = _select(alignment, start, partitions, args, model_string, prefix, log)
        if model is None:
            log_file.close()
            return
    began = time.perf_counter()
    trees, num_patterns = 2 * max(settings.batch, settings.top), alignment.site_patterns().num_patterns
    mesh = mesh_choice(args, trees, num_patterns)
    search_mesh = mesh
    if mesh is not None:
        log(f"# devices: mesh batch={mesh.shape['batch']} x patterns={mesh.shape['patterns']}")
        if not is_local(mesh):  # a process per GPU: each runs the search on its own devices (the
            # same search, one seed); the bootstrap's replicates go over every process's devices, apart
            search_mesh = run_mesh(jax.local_devices(), trees=trees, num_patterns=num_patterns)
    if fixed is not None:  # IQ-TREE's -te: model and branch lengths on this topology, no search
        result = ml.fit(alignment, fixed, model, precision=args.precision)
        log(f"# fitted on the topology of {args.te}: {result.iterations} iterations")
    else:
        def progress(r, best, candidates, trees, seconds):
            aside = "" if seconds is None else f"\t{seconds:.1f} s\t{trees / max(seconds, 1e-9):.1f} trees/s"
            log(f"round {r}\tbest log L {best:.4f}\tcandidates {candidates}\ttrees {trees}", aside)

        result = ml.search(alignment, model, start, seed=args.seed, settings=settings, precision=args.precision,
                           checkpoint=f"{prefix}.ckpt", resume=args.resume, stop=args.stop, mesh=search_mesh,
                           progress=progress, ufboot=ufboot)
    labelled, supports = [], {}
    if args.alrt:
        log(f"# SH-aLRT with {args.alrt} RELL replicates")
        supports["sh_alrt"] = ml.sh_alrt(alignment, result, replicates=args.alrt, seed=args.seed)
        labelled.append(ml.with_supports(result.tree, supports["sh_alrt"]))
    if args.bootstrap:
        log(f"# {args.bootstrap} bootstrap replicates")
        supports["bootstrap"], _ = ml.bootstrap(alignment, result, replicates=args.bootstrap, seed=args.seed,
                                                settings=settings, precision=args.precision,
                                                checkpoint=f"{prefix}.boot.ckpt", stop=args.stop, mesh=mesh)
        labelled.append(ml.with_supports(result.tree, supports["bootstrap"]))
    if args.ufboot:  # IQ-TREE's order of labels: SH-aLRT/UFBoot
        supports["ufboot"] = result.ufboot
        labelled.append(ml.with_supports(result.tree, result.ufboot))
    tree = jp.tree.combine_labels(result.tree, *labelled) if labelled else result.tree
    jp.write_tree(tree, f"{prefix}.treefile")
    outputs = f"{prefix}.treefile, {prefix}.json, {prefix}.log"
    if args.ufboot:  # every replicate's tree, one Newick a line (IQ-TREE's -wbt)
        with open(f"{prefix}.ufboot", "w") as handle:
            for replicate in result.ufboot_trees:
                handle.write(jp.io.to_dendropy(replicate).as_string(schema="newick", unquoted_underscores=True,
                                                                    preserve_spaces=True, suppress_rooting=True))
        outputs += f", {prefix}.ufboot"
    if isinstance(result.model, jp.PartitionedModel) and result.model.branch_lengths is not None:
        with open(f"{prefix}.parttrees", "w") as handle:  # IQ-TREE's -Q output: every part's tree, in order
            for lengths in np.asarray(result.model.branch_lengths):
                tree = jp.io.to_dendropy(result.tree.with_branch_lengths(lengths))
                handle.write(tree.as_string(schema="newick", unquoted_underscores=True, preserve_spaces=True))
        outputs += f", {prefix}.parttrees"
    summary = {
        "log_likelihood": result.log_likelihood, "model": result.model_string, "parameters": result.parameters,
        "tree": open(f"{prefix}.treefile").read().strip(), "search_rounds": result.search_rounds,
        "support_labels": "/".join({"sh_alrt": "SH-aLRT", "bootstrap": "bootstrap", "ufboot": "UFBoot"}[k]
                                   for k in supports) or None,
        "settings": {"seed": args.seed, "precision": args.precision, "fast": args.fast,
                     **{k: v for k, v in vars(settings).items() if k != "max_seconds"}},
    }
    with open(f"{prefix}.json", "w") as handle:
        json.dump(summary, handle, indent=1)
    log(f"# log L {result.log_likelihood:.4f}; {result.model_string}",
        f"; {time.perf_counter() - began:.1f} s; peak memory {peak_memory_text()}")
    log(f"# {outputs}")
    log_file.close()
    print(f"{result.log_likelihood:.6f}")


def _select(alignment, start, partitions, args, model_string, prefix, log):
    """-m MF/MFP: ModelFinder (per part with -p/-q); the model to search with, or None after MF."""
    import dataclasses

    import jaxphylo as jp
    from jaxphylo import ml

    progress = lambda r: log(f"# {r.model}\tlog L {r.log_likelihood:.3f}\tBIC {r.BIC:.3f}")  # noqa: E731
    if partitions is None:
        chosen = ml.select_model(alignment, start, criterion="BIC", progress=progress)
        chosen.to_tsv(f"{prefix}.models.tsv")
        log(f"# best-fit model (BIC): {chosen.best}; table in {prefix}.models.tsv")
        if model_string.upper() == "MF":
            print(chosen.best)
            return None
        return chosen.best_model
    scheme = jp.read_partitions(partitions[0])
    selections = ml.select_part_models(alignment, scheme, start, criterion="BIC", progress=progress)
    for name, chosen in selections.items():
        chosen.to_tsv(f"{prefix}.{name}.models.tsv")
    with open(f"{prefix}.best_scheme.nex", "w") as handle:
        handle.write(ml.best_scheme_nexus(scheme, selections))
    best = ", ".join(f"{selections[name].best}:{name}" for name in scheme.names)
    log(f"# best-fit models (BIC): {best}; tables in {prefix}.PART.models.tsv, scheme in {prefix}.best_scheme.nex")
    if model_string.upper() == "MF":
        print(best)
        return None
    scheme = dataclasses.replace(scheme, models=tuple(selections[name].best_model for name in scheme.names))
    return partitioned_model_of(args, alignment, "GTR+G4", scheme=scheme)


def _selecting(model_string: str | None) -> bool:
    """-m MF or MFP: ModelFinder."""
    return model_string is not None and model_string.upper() in ("MF", "MFP")


def _dry_run(alignment, start, model, args, settings) -> None:
    """The memory and time of the search's widest evaluation (twice the batch of trees)."""
    import jaxphylo as jp
    from jaxphylo.likelihood import plan
    from jaxphylo.likelihood import pattern_data

    tree = start or jp.random_topology_tree(alignment.taxa, seed=args.seed)
    largest = "GTR+F+R10" if alignment.alphabet.num_states == 4 else "LG+F+R10"  # MF/MFP: the largest candidate
    model, _ = jp.models.resolve_model(largest if _selecting(args.model) else model, alignment)
    batch = 2 * max(settings.batch, settings.top)
    data = jp.likelihood.partitioned_data(alignment, tree, model) if isinstance(model, jp.PartitionedModel) else \
        pattern_data(alignment, tree)
    plan(data, tree, model, args.precision, batch, True, alignment.num_sites,
         log=lambda text: print(text, file=sys.stderr))
