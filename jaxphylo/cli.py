"""The `jaxphylo` command line."""

from __future__ import annotations

import argparse
import hashlib
import sys
from contextlib import nullcontext

from ._cli_dated import add_free_topology_options, run_free_topology, wants_free_topology
from ._cli_env import add_env_command, add_mesh_options, mesh_choice
from ._cli_mcmc import add_mcmc_command
from ._cli_models import add_models_command
from .runtime import EXIT_INTERRUPTED, Interrupted, NEVER, StopRequests, parse_duration
from ._errors import JaxphyloError


def _example_paths():
    from ._examples import example_paths

    return example_paths()


EXAMPLE_MODEL = "HKY{4.0}+F{0.3,0.2,0.2,0.3}+G4{0.5}"


def _loglik(args) -> None:
    import time

    import numpy as np

    import jaxphylo as jp
    from jaxphylo.likelihood._finite import require_finite

    if args.example:
        alignment_path, tree_path = _example_paths()
        model_string = args.model or EXAMPLE_MODEL
    else:
        if not (args.alignment and args.tree and (args.model or partition_choice(args))):
            raise JaxphyloError("loglik needs ALIGNMENT TREE --model STRING (or -p/-q/-Q FILE naming every part's "
                                "model, or --example)")
        alignment_path, tree_path, model_string = args.alignment, args.tree, args.model
    alignment = jp.read_alignment(alignment_path, data_type=args.data_type, genetic_code=args.genetic_code)
    tree = jp.read_tree(tree_path)
    model = _loglik_model(jp, args, alignment, model_string)
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


def _loglik_model(jp, args, alignment, model_string):
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


LINKS = {"p": "proportional", "q": "equal", "Q": "unlinked"}


def add_partition_options(parser, unlinked: str = "partitions with unlinked branch lengths (each part its own)"):
    """IQ-TREE's -p, -q and -Q FILE on a command (`unlinked`: what -Q means there)."""
    parser.add_argument("-p", metavar="FILE", help="partitions (NEXUS sets/charpartition or RAxML-style), a model "
                                                   "each: linked branch lengths times a rate per part")
    parser.add_argument("-q", metavar="FILE", help="partitions with linked, equal branch lengths")
    parser.add_argument("-Q", metavar="FILE", help=unlinked)


def partition_choice(args) -> tuple[str, str] | None:
    """`(partition file, link)` of -p/-q/-Q, or None."""
    flags = [(getattr(args, flag), LINKS[flag]) for flag in LINKS if getattr(args, flag, None)]
    if len(flags) > 1:
        raise JaxphyloError("give one of -p, -q and -Q")
    return flags[0] if flags else None


def partitioned_model_of(args, alignment, default_model: str | None, rates=None, scheme=None):
    """The partitioned model of -p/-q/-Q: the file's models, `default_model` (-m; None without it) for parts
    without one."""
    import jaxphylo as jp

    path, link = partition_choice(args)
    scheme = scheme or jp.read_partitions(path)
    require_part_models(scheme, default_model)
    return jp.partitioned_model(scheme, alignment, default_model=default_model, link=link, rates=rates)


def require_part_models(scheme, default_model: str | None) -> None:
    """Without -m every part of the partition file must name its model (as in IQ-TREE's `charpartition mine =
    HKY+G4:gene1, ...`): else a one-line error naming the first part without one and its line."""
    if default_model is not None:
        return
    for k, (name, model) in enumerate(zip(scheme.names, scheme.models)):
        if model is None:
            raise JaxphyloError(f"{scheme._where(k)}: part {name!r} names no model; give -m MODEL (the model of "
                                "the parts that name none) or name its model in the file")


def model_or_partitions(args, command: str, default: str | None = None) -> str | None:
    """-m, else `default`; without either, -p/-q/-Q FILE must name every part's model (checked when it is read)."""
    model = args.model or default
    if model is None and partition_choice(args) is None:
        raise JaxphyloError(f"{command} needs --model MODEL (or -p/-q/-Q FILE naming every part's model)")
    return model


SAMPLE_MODEL = "HKY+G4"  # sample's model without -m (with -p/-q/-Q FILE: none, the file names every part's)


def _sample(args) -> None:
    import dataclasses
    import os

    if args.chains > 1 and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        import numpyro  # before JAX starts its CPU backend: one CPU device per chain

        numpyro.set_host_device_count(min(args.chains, os.cpu_count() or 1))
    import jaxphylo as jp
    from jaxphylo.inference import Analysis, prepare
    from jaxphylo.inference._outputs import write_outputs
    from jaxphylo.likelihood import plan
    from jaxphylo.likelihood._finite import check_start
    from jaxphylo.inference._runner import chunk_program, progress_printer, run_nuts
    from jaxphylo._sharding import place_data

    if not args.example and not args.alignment:
        raise JaxphyloError("sample needs ALIGNMENT [TREE] (or --example)")
    if wants_free_topology(args):
        run_free_topology(args)
        return
    if args.example:
        alignment_path, tree_path = _example_paths()
    else:
        alignment_path, tree_path = args.alignment, args.tree
    partitions, link = partition_choice(args) or (None, "proportional")
    model_string = model_or_partitions(args, "sample", None if partitions else SAMPLE_MODEL)
    if partitions:
        require_part_models(jp.read_partitions(partitions), model_string)
    analysis = Analysis(model=model_string, clock=args.clock, tree_prior=args.tree_prior,
                        branch_rate=args.branch_rate, priors=args.priors, precision=args.precision,
                        partitions=partitions, link=link)
    alignment = jp.read_alignment(alignment_path, data_type=args.data_type, genetic_code=args.genetic_code)
    tree = jp.read_tree(tree_path)
    tip_dates, dates_digest = None, None
    if args.dates or args.dates_in_names:
        if not args.clock:
            raise JaxphyloError("tip dates need a clock: add --clock strict or --clock relaxed")
        tip_dates = jp.io.read_tip_dates(args.dates) if args.dates else jp.io.tip_dates_from_names(tree.taxa)
        dates_digest = tip_dates.digest()
    prepared = prepare(alignment, tree, analysis, tip_dates)
    mesh = mesh_choice(args, 1, alignment.site_patterns().num_patterns, default=False)
    if mesh is not None and mesh.shape["batch"] > 1:
        raise JaxphyloError(f"sample splits the patterns over devices (--mesh patterns=N), not its chains: "
                            f"batch={mesh.shape['batch']} would repeat the same work")
    if mesh is not None:  # the patterns over the devices; the chains vectorized (pmap would split them instead)
        prepared = dataclasses.replace(prepared, data=place_data(prepared.data, mesh))
        print(f"# devices: mesh batch={mesh.shape['batch']} x patterns={mesh.shape['patterns']}", file=sys.stderr)
    model = prepared.substitution
    plan(prepared.data, prepared.tree, model, args.precision,
         args.chains, args.dry_run, alignment.num_sites, log=lambda text: print(text, file=sys.stderr),
         program=chunk_program(prepared.model, prepared.data, prepared.init, args.chains, args.warmup))
    if args.dry_run:
        return
    settings = {"alignment": _digest(alignment_path), "tree": _digest(tree_path), "dates": dates_digest,
                "analysis": analysis.as_dict(), "partitions": partitions and _digest(partitions)}
    log = progress_printer()
    start_check = lambda: check_start(prepared.data, prepared.tree, model, args.precision)  # noqa: E731
    draws = run_nuts(prepared.model, prepared.data, prepared.init, args.out, settings=settings,
                     chains=args.chains, warmup=args.warmup, samples=args.samples, block=args.block,
                     seed=args.seed, resume=args.resume, progress=not args.no_progress, log=log, stop=args.stop,
                     check_start=start_check, method="vectorized" if (args.mesh or args.devices) else None)
    text = write_outputs(args.out, draws, prepared.tree.topology, prepared.time)
    print(text)
    divergent = int(draws.stats["diverging"].sum())
    log(f"# {divergent} divergent transitions of {draws.stats['diverging'].size} (non-finite or diverging "
        f"proposals: rejected, the chain stayed put)")
    log(f"# {args.out}: posterior.nc (ArviZ), chain*.log (Tracer), chain*.trees (NEXUS), summary.tsv, summary.png")


def _ml(args) -> None:
    import json
    import time
    from pathlib import Path

    import numpy as np

    import jaxphylo as jp
    from jaxphylo import ml
    from jaxphylo.runtime import peak_memory_text

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
    selecting = _selecting(model_string)
    model = partitioned_model_of(args, alignment, model_string) if partitions and not selecting else model_string
    # Bad input fails here, before any output (with MF/MFP only the start tree can be checked yet).
    ml.check_inputs(alignment, None if selecting else model, start)
    settings = ml.SearchSettings(patience=args.patience, batch=args.batch, radius=args.radius)
    if args.dry_run:
        _ml_dry_run(alignment, start, model, args, settings)
        return
    if args.redo:
        for stale in (f"{prefix}.ckpt", f"{prefix}.boot.ckpt"):
            Path(stale).unlink(missing_ok=True)
    ml._search.check_checkpoint(f"{prefix}.ckpt", args.resume)  # before the log of a saved run is overwritten
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
        model = _ml_select(alignment, start, partitions, args, model_string, prefix, log)
        if model is None:
            log_file.close()
            return
    began = time.perf_counter()
    mesh = mesh_choice(args, 2 * max(args.batch, args.starts), alignment.site_patterns().num_patterns)
    if mesh is not None:
        log(f"# devices: mesh batch={mesh.shape['batch']} x patterns={mesh.shape['patterns']}")
    if fixed is not None:  # IQ-TREE's -te: model and branch lengths on this topology, no search
        result = ml.fit(alignment, fixed, model, precision=args.precision)
        log(f"# fitted on the topology of {args.te}: {result.iterations} iterations")
    else:
        result = ml.search(alignment, model, start, starts=args.starts, seed=args.seed, settings=settings,
                           precision=args.precision, checkpoint=f"{prefix}.ckpt", resume=args.resume, stop=args.stop,
                           mesh=mesh,
                           progress=lambda r, best, seconds: log(f"round {r}\tbest log L {best:.4f}",
                                                                 "" if seconds is None else f"\t{seconds:.1f} s"))
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
    tree = ml._support.combine_labels(result.tree, *labelled) if labelled else result.tree
    jp.write_tree(tree, f"{prefix}.treefile")
    outputs = f"{prefix}.treefile, {prefix}.json, {prefix}.log"
    if isinstance(result.model, jp.PartitionedModel) and result.model.branch_lengths is not None:
        with open(f"{prefix}.parttrees", "w") as handle:  # IQ-TREE's -Q output: every part's tree, in order
            for lengths in np.asarray(result.model.branch_lengths):
                tree = jp.io.to_dendropy(result.tree.with_branch_lengths(lengths))
                handle.write(tree.as_string(schema="newick", unquoted_underscores=True, preserve_spaces=True))
        outputs += f", {prefix}.parttrees"
    summary = {
        "log_likelihood": result.log_likelihood, "model": result.model_string, "parameters": result.parameters,
        "tree": open(f"{prefix}.treefile").read().strip(), "search_rounds": result.search_rounds,
        "support_labels": "/".join({"sh_alrt": "SH-aLRT", "bootstrap": "bootstrap"}[k] for k in supports) or None,
        "settings": {"starts": args.starts, "seed": args.seed, "patience": args.patience, "batch": args.batch,
                     "radius": args.radius, "precision": args.precision},
    }
    with open(f"{prefix}.json", "w") as handle:
        json.dump(summary, handle, indent=1)
    log(f"# log L {result.log_likelihood:.4f}; {result.model_string}",
        f"; {time.perf_counter() - began:.1f} s; peak memory {peak_memory_text()}")
    log(f"# {outputs}")
    log_file.close()
    print(f"{result.log_likelihood:.6f}")


def _ml_select(alignment, start, partitions, args, model_string, prefix, log):
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


def _ml_dry_run(alignment, start, model, args, settings) -> None:
    """The memory and time of the search's widest evaluation (twice the batch of trees)."""
    import jaxphylo as jp
    from jaxphylo.likelihood import plan
    from jaxphylo.likelihood import pattern_data

    tree = start or jp.random_topology_tree(alignment.taxa, seed=args.seed)
    largest = "GTR+F+R10" if alignment.alphabet.num_states == 4 else "LG+F+R10"  # MF/MFP: the largest candidate
    model, _ = jp.ml._fit.resolve_model(largest if _selecting(args.model) else model, alignment)
    batch = 2 * max(args.batch, args.starts)
    data = jp.models.partitioned_data(alignment, tree, model) if isinstance(model, jp.PartitionedModel) else \
        pattern_data(alignment, tree)
    plan(data, tree, model, args.precision, batch, True, alignment.num_sites,
         log=lambda text: print(text, file=sys.stderr))


def _digest(path) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()[:16]
    except OSError as err:
        raise JaxphyloError(f"{path}: cannot read: {err.strerror}") from None


def _distance(args) -> None:
    import jaxphylo as jp

    alignment = jp.read_alignment(args.alignment, data_type=args.data_type)
    matrix = jp.distances(alignment, args.method, saturated=args.saturated)
    jp.io.write_distance_matrix(matrix, alignment.taxa, args.out)
    print(f"# {len(alignment.taxa)} taxa, {args.method or 'default'} distances -> {args.out}", file=sys.stderr)


def _nj(args) -> None:
    import jaxphylo as jp

    if args.matrix:
        matrix, taxa = jp.io.read_distance_matrix(args.input)
    else:
        alignment = jp.read_alignment(args.input, data_type=args.data_type)
        matrix, taxa = jp.distances(alignment, args.distance, saturated=args.saturated), alignment.taxa
    build = jp.bionj if args.method == "bionj" else jp.neighbor_joining
    jp.write_tree(build(matrix, taxa), args.out)
    print(f"# {args.method} tree of {len(taxa)} taxa -> {args.out}", file=sys.stderr)


def _coevolution(args) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxphylo", description="Differentiable phylogenetics in JAX.")
    parser.add_argument("--distributed", action="store_true",
                        help="one of several processes (jax.distributed: Slurm, Open MPI, or JAXPHYLO_COORDINATOR, "
                             "JAXPHYLO_NUM_PROCESSES, JAXPHYLO_PROCESS_ID); process 0 writes the outputs")
    commands = parser.add_subparsers(dest="command", required=True)
    loglik = commands.add_parser("loglik", help="print the log-likelihood of an alignment on a fixed tree")
    loglik.add_argument("alignment", nargs="?", help="FASTA, PHYLIP or NEXUS alignment")
    loglik.add_argument("tree", nargs="?", help="Newick or NEXUS tree with branch lengths")
    loglik.add_argument("--model", "-m", help="model string in IQ-TREE syntax, e.g. 'GTR+F+G4{0.5}'; with -p/-q/-Q: "
                                              "the model of the parts that name none (not needed when all do)")
    loglik.add_argument("--precision", choices=("float64", "float32"), default="float64")
    loglik.add_argument("--data-type", choices=("dna", "protein", "codon"), default=None,
                        help="default: DNA or protein, guessed from the characters")
    loglik.add_argument("--genetic-code", type=int, default=1, help="NCBI table number for codons (default 1)")
    loglik.add_argument("--example", action="store_true", help="use the built-in example data set")
    loglik.add_argument("--verbose", "-v", action="store_true", help="print data sizes and timing to stderr")
    add_partition_options(loglik, "partitions with unlinked branch lengths (here: the tree's in each)")
    loglik.add_argument("--part-rates", help="with -p: the parts' rates, e.g. 0.5,0.3,2.2 (scaled to a site-weighted "
                                             "mean of 1; default all 1)")
    loglik.set_defaults(run=_loglik)

    sample = commands.add_parser("sample", help="Bayesian inference: NUTS on a fixed topology, or a time tree with "
                                                "the topology sampled (--topology free)")
    sample.add_argument("alignment", nargs="?", help="FASTA, PHYLIP or NEXUS alignment")
    sample.add_argument("tree", nargs="?", help="Newick or NEXUS tree: the fixed topology and the starting values "
                                                "(with --topology free: the start)")
    sample.add_argument("--model", "-m", help=f"model string (default {SAMPLE_MODEL}); values in braces are fixed. "
                                               "With -p/-q/-Q: the model of the parts that name none (no default)")
    sample.add_argument("--clock", choices=("strict", "relaxed"), default=None,
                        help="a rooted time tree with this clock (default: unrooted tree, free branch lengths)")
    sample.add_argument("--dates", help="TSV: taxon<TAB>date, or a header naming date or lower/upper; decimal years "
                                        "(1999.5), ISO dates (2004-07-12), months (2004-07) or years (2004) as "
                                        "intervals (sampled); NA to estimate (needs --clock)")
    sample.add_argument("--dates-in-names", action="store_true", help="dates at the end of taxon names, e.g. A_1999.5")
    sample.add_argument("--tree-prior", help="unrooted: exponential (default), gamma-dirichlet; "
                                             "time tree: coalescent (default), skygrid, yule, birth-death "
                                             "(the last two for contemporaneous tips)")
    sample.add_argument("--branch-rate", type=float, default=10.0, help="rate of the exponential branch-length prior")
    sample.add_argument("--priors", choices=("default", "mrbayes"), default="default",
                        help="substitution-parameter priors (mrbayes: kappa/(1+kappa) ~ Beta(1,1))")
    sample.add_argument("--chains", type=int, default=4)
    sample.add_argument("--warmup", type=int, default=500)
    sample.add_argument("--samples", type=int, default=1000, help="draws per chain after warmup")
    sample.add_argument("--block", type=int, default=100, help="draws per chain between checkpoints")
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--out", "-o", default="jaxphylo-run", help="output directory (default jaxphylo-run)")
    sample.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    sample.add_argument("--dry-run", action="store_true",
                        help="print the data sizes, memory per device and the time of one evaluation; then exit")
    sample.add_argument("--max-time", help="stop, saved, after this long (e.g. 23h, 90m, 36:00:00); "
                                           "SIGTERM, SIGINT and SIGUSR1 do the same")
    sample.add_argument("--precision", choices=("float64", "float32"), default="float64")
    sample.add_argument("--data-type", choices=("dna", "protein", "codon"), default=None)
    sample.add_argument("--genetic-code", type=int, default=1)
    sample.add_argument("--no-progress", action="store_true", help="no progress bars")
    sample.add_argument("--example", action="store_true", help="the built-in example (16 taxa, 600 sites)")
    add_free_topology_options(sample)
    add_partition_options(sample, "partitions with unlinked branch lengths (each part its own; no --clock)")
    add_mesh_options(sample, "none: the chains run in parallel, one per device, or vectorized on one; with "
                             "--mesh or --devices the patterns are split over the devices instead")
    sample.set_defaults(run=_sample)

    ml = commands.add_parser("ml", help="maximum-likelihood tree: model fit, NNI/SPR search, branch support")
    ml.add_argument("alignment", help="FASTA, PHYLIP or NEXUS alignment")
    ml.add_argument("--model", "-m",
                    help="model string in IQ-TREE syntax, e.g. GTR+G4; MFP: select by BIC, then search; MF: select "
                         "only. With -p/-q/-Q: the model of the parts that name none (not needed when all do)")
    ml.add_argument("--tree", "-t", help="start tree (Newick/NEXUS; default: BIONJ)")
    ml.add_argument("-te", metavar="TREE", help="fit the model and branch lengths on this topology, no search "
                                                "(IQ-TREE's -te)")
    add_partition_options(ml, "partitions with unlinked branch lengths (each part its own; PREFIX.parttrees)")
    ml.add_argument("--starts", type=int, default=1, help="start trees (extra ones: BIONJ of resampled columns)")
    ml.add_argument("--bootstrap", "-b", type=int, default=0, help="non-parametric bootstrap replicates")
    ml.add_argument("--alrt", type=int, default=0, help="SH-aLRT RELL replicates (IQ-TREE: 1000)")
    ml.add_argument("--patience", type=int, default=100, help="perturbed trees without improvement before stopping")
    ml.add_argument("--batch", type=int, default=4, help="perturbed trees climbed together")
    ml.add_argument("--radius", type=int, default=6, help="SPR regraft radius (0: NNI only)")
    ml.add_argument("--seed", type=int, default=0)
    ml.add_argument("--out", "-o", "--prefix", dest="out", help="output prefix (default: the alignment's name)")
    ml.add_argument("--precision", choices=("float64", "float32"), default="float64")
    ml.add_argument("--data-type", choices=("dna", "protein", "codon"), default=None)
    ml.add_argument("--genetic-code", type=int, default=1)
    ml.add_argument("--resume", action="store_true", help="continue the search saved in PREFIX.ckpt")
    ml.add_argument("--redo", action="store_true", help="ignore and replace a saved search with this prefix")
    ml.add_argument("--dry-run", action="store_true",
                    help="print the data sizes, memory per device and the time of one evaluation; then exit")
    ml.add_argument("--max-time", help="stop, saved, after this long (e.g. 23h); SIGTERM, SIGINT, SIGUSR1 too")
    add_mesh_options(ml, "every visible device, the search's trees and bootstrap replicates over batch")
    ml.set_defaults(run=_ml)

    distance = commands.add_parser("distance", help="all-pairs distances, written as a PHYLIP matrix")
    distance.add_argument("alignment")
    distance.add_argument("--method", help="DNA: p, jc69 (default), k2p, tn93, logdet; protein: p, poisson (default)")
    distance.add_argument("--saturated", type=float, default=float("inf"),
                          help="value for saturated pairs (default inf)")
    distance.add_argument("--data-type", choices=("dna", "protein"), default=None)
    distance.add_argument("--out", "-o", required=True, help="output PHYLIP distance file")
    distance.set_defaults(run=_distance)

    nj = commands.add_parser("nj", help="neighbour-joining or BIONJ tree from an alignment or a distance matrix")
    nj.add_argument("input", help="alignment, or a PHYLIP distance matrix with --matrix")
    nj.add_argument("--matrix", action="store_true", help="INPUT is a PHYLIP distance matrix")
    nj.add_argument("--method", choices=("nj", "bionj"), default="bionj")
    nj.add_argument("--distance", help="distance for an alignment (as in 'jaxphylo distance')")
    nj.add_argument("--saturated", type=float, default=5.0, help="distance for saturated pairs (default 5)")
    nj.add_argument("--data-type", choices=("dna", "protein"), default=None)
    nj.add_argument("--out", "-o", required=True, help="output Newick file")
    nj.set_defaults(run=_nj)

    coevolution = commands.add_parser("coevolution", help="mutual information between columns, with a shuffling null")
    coevolution.add_argument("alignment")
    coevolution.add_argument("--order", type=int, choices=(2, 3), default=2)
    coevolution.add_argument("--shuffles", type=int, default=1000)
    coevolution.add_argument("--seed", type=int, default=0)
    coevolution.add_argument("--base", type=float, default=None, help="logarithm base (default e; 2 for bits)")
    coevolution.add_argument("--data-type", choices=("dna", "protein"), default=None)
    coevolution.add_argument("--out", "-o", required=True, help="output prefix: PREFIX.tsv and PREFIX.png")
    coevolution.set_defaults(run=_coevolution)
    add_models_command(commands)
    add_mcmc_command(commands)
    add_env_command(commands)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    errors = sys.stderr  # errors reach the user from every process; outputs come from process 0 only
    try:
        if args.distributed:
            import jax

            from .runtime import join_processes, mirror_outputs

            join_processes()
            if jax.process_index() > 0:
                mirror_outputs(args, jax.process_index())
        # Signals are caught from the start, so a kill announced during start-up or compilation
        # is answered at the first iteration, saved, instead of losing the process.
        long_run = hasattr(args, "max_time")
        # Run as the program (argv None: the process's own command line, which ends when this returns), a
        # finished run ignores a stop that arrives while the process exits; called from Python, nothing changes.
        stops = StopRequests(parse_duration(args.max_time), ignore_after=argv is None) if long_run else \
            nullcontext(NEVER)
        with stops as args.stop:
            args.run(args)
    except Interrupted as err:
        print(f"jaxphylo: stopped: {err}", file=errors)
        return EXIT_INTERRUPTED
    except JaxphyloError as err:
        print(f"jaxphylo: error: {err}", file=errors)
        return 2
    except KeyboardInterrupt:
        print("jaxphylo: interrupted", file=errors)
        return 130
    except Exception as err:  # XLA's out-of-memory error becomes one line; anything else is a bug: traceback
        from .runtime import out_of_memory_message

        if (message := out_of_memory_message(err)) is None:
            raise
        print(f"jaxphylo: error: {message}", file=errors)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
