"""Sharded against unsharded likelihoods, run in a fresh process (JAX reads XLA_FLAGS once, at start-up).

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/_sharded_check.py meshes
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python tests/_sharded_check.py distributed PORT ID
    XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_dump_to=DIR" JAXPHYLO_CPU_LIBRARY=none \
        python tests/_sharded_check.py collectives ALIGNMENT DIR

`meshes` compares, on 1x4, 2x2 and 4x1 meshes, the log-likelihood and its
gradient (branch lengths and every model leaf) of one tree and of a batch of
four trees with the unsharded functions, and prints one JSON line of the
largest absolute differences. `distributed` is one of two processes joined by
`jax.distributed` on localhost (CPU collectives: gloo), whose four devices
together hold the pattern shards; it prints the sharded and the
single-process values. `collectives` runs a bootstrap and an MC³ run with a
run per device (mesh batch 4 x patterns 1, the XLA kernels as on a GPU) and
counts, in every program XLA compiled (dumped to DIR), the collectives it
put in. `tests/test_sharding.py` runs them and asserts on them.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import numpy as np
from _stops import StopAfter

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "DS1"
MODEL = "HKY{2}+F{0.3,0.2,0.2,0.3}+I{0.1}"


def case():
    """(alignment, tree, model, name): DS1 (934 patterns) or, without it, a simulated alignment whose pattern
    count is not a multiple of 4, so that padding is exercised either way."""
    import jaxphylo as jp

    if (DATA / "alignment.fasta").exists():
        alignment, tree = jp.read_alignment(DATA / "alignment.fasta"), jp.read_tree(DATA / "tree.nwk")
        name = "DS1"
    else:
        tree = jp.random_topology_tree([f"t{i}" for i in range(12)], seed=1)
        sites = 301
        alignment = jp.simulate(tree, jp.parse_model(MODEL), sites, seed=2)
        while alignment.site_patterns().num_patterns % 4 == 0:
            sites += 1
            alignment = jp.simulate(tree, jp.parse_model(MODEL), sites, seed=2)
        name = f"simulated 12 x {sites}"
    return alignment, tree, jp.parse_model(MODEL, alignment=alignment), name


def max_difference(a, b) -> float:
    import jax

    differences = jax.tree_util.tree_map(lambda x, y: np.max(np.abs(np.asarray(x) - np.asarray(y))), a, b)
    leaves = jax.tree_util.tree_leaves(differences)
    return float(max(leaves)) if leaves else 0.0


def meshes() -> dict:
    import jax

    import jaxphylo as jp
    from jaxphylo.likelihood import batch_data_log_likelihoods, data_log_likelihood, pattern_data

    alignment, tree, model, name = case()
    data = pattern_data(alignment, tree)
    others = [jp.random_topology_tree(tree.taxa, seed=s, mean_branch_length=0.05) for s in (3, 4, 5)]
    batch = jp.TreeBatch.from_trees([tree] + others)
    batch_data = pattern_data(alignment, batch)

    def one(model, lengths, data, mesh=None):
        t = tree.with_branch_lengths(lengths)
        return data_log_likelihood(data, t, model) if mesh is None else jp.sharded_log_likelihood(data, t, model, mesh)

    def many(model, lengths, data, mesh=None):
        trees = jp.TreeBatch(batch.parents, lengths, batch.taxa)
        values = (batch_data_log_likelihoods(data, trees, model) if mesh is None
                  else jp.sharded_batch_log_likelihoods(data, trees, model, mesh))
        return values.sum(), values

    grad_one = jax.value_and_grad(one, argnums=(0, 1))
    grad_many = jax.value_and_grad(many, argnums=(0, 1), has_aux=True)
    reference_one = grad_one(model, tree.branch_lengths, data)
    (_, reference_values), reference_many = grad_many(model, batch.branch_lengths, batch_data)
    result = {"case": name, "patterns": int(data.tip_codes.shape[1]), "devices": len(jax.devices()),
              "log_likelihood": float(reference_one[0]), "meshes": {}}
    for shape in ((1, 4), (2, 2), (4, 1)):
        mesh = jp.device_mesh(batch=shape[0], patterns=shape[1])
        start = time.perf_counter()
        sharded = jp.shard_pattern_data(data, mesh)
        value, gradient = grad_one(model, tree.branch_lengths, sharded, mesh)
        (_, values), batch_gradient = grad_many(model, batch.branch_lengths,
                                                jp.shard_pattern_data(batch_data, mesh), mesh)
        result["meshes"][f"{shape[0]}x{shape[1]}"] = {
            "padded_patterns": int(sharded.tip_codes.shape[1]),
            "tree_log_likelihood": abs(float(value) - float(reference_one[0])),
            "tree_branch_lengths": max_difference(gradient[1], reference_one[1][1]),
            "tree_model": max_difference(gradient[0], reference_one[1][0]),
            "batch_log_likelihoods": max_difference(values, reference_values),
            "batch_branch_lengths": max_difference(batch_gradient[1], reference_many[1]),
            "batch_model": max_difference(batch_gradient[0], reference_many[0]),
            "seconds": round(time.perf_counter() - start, 2),
        }
    return result


def distributed(port: int, process_id: int) -> dict:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                               initialization_timeout=60)
    import jaxphylo as jp
    from jaxphylo.likelihood import data_log_likelihood, pattern_data

    alignment, tree, model, name = case()
    data = pattern_data(alignment, tree)
    mesh = jp.device_mesh()  # every device of both processes on `patterns`
    sharded = jp.shard_pattern_data(data, mesh)
    value, gradient = jax.value_and_grad(
        lambda b: jp.sharded_log_likelihood(sharded, tree.with_branch_lengths(b), model, mesh)
    )(jp.replicate(tree.branch_lengths, mesh))
    with jax.default_device(jax.local_devices()[0]):
        reference, reference_gradient = jax.value_and_grad(
            lambda b: data_log_likelihood(data, tree.with_branch_lengths(b), model))(tree.branch_lengths)
    # MC³ with a run per device of both processes (4 x 1): the runs' shares under one `shard_map` program
    # (a mesh that spans processes), against one device of this process alone.
    chains = []
    for where in (jp.device_mesh(batch=4, patterns=1), None):
        with jax.default_device(jax.local_devices()[0]):
            chains.append(jp.inference.mc3(alignment, "HKY", runs=4, chains=2, generations=40, sample_every=20,
                                           seed=5, mesh=where))
    # Bootstrap replicates in shares over both processes' devices (4 x 1), 3 replicates: process 0 climbs two,
    # process 1 one and has an empty share; the trees are exchanged once. Against one device of this process.
    fitted = jp.ml.fit(alignment, tree, model)
    with jax.default_device(jax.local_devices()[0]):
        boots = [jp.ml.bootstrap(alignment, fitted, replicates=3, seed=2, mesh=where)
                 for where in (jp.device_mesh(batch=4, patterns=1), None)]
    (split_supports, split_trees), (one_supports, one_trees) = boots
    return {"case": name, "process": jax.process_index(), "processes": jax.process_count(),
            "bootstrap_supports_equal": split_supports == one_supports,
            "bootstrap_topologies_equal": [t.topology for t in split_trees] == [t.topology for t in one_trees],
            "bootstrap_lengths": max(max_difference(a.branch_lengths, b.branch_lengths)
                                     for a, b in zip(split_trees, one_trees)),
            "global_devices": len(jax.devices()), "local_devices": len(jax.local_devices()),
            "mesh": dict(mesh.shape), "sharded": float(value), "single": float(reference),
            "gradient_difference": max_difference(gradient, reference_gradient),
            "mc3": max(max_difference(a.columns, b.columns) for a, b in zip(*(c.runs for c in chains)))}


def runs(alignment_path: str, reference: str) -> dict:
    """Bootstrap ML searches (on meshes of 2 x 2 and, in shares, 4 x 1), MC³ (4 x 1) and NUTS (the CLI's
    `sample --mesh`) on 4 devices against one device; and
    `jaxphylo mcmc --devices 1` into `reference` (what the two-process MC³ run on a 2x2 mesh must equal)."""
    import tempfile

    import arviz as az
    import jax

    import jaxphylo as jp
    from jaxphylo import cli, ml
    from jaxphylo.runtime import Interrupted

    alignment = jp.read_alignment(alignment_path)
    result = {"devices": len(jax.devices())}
    # A bootstrap is a batch of ML searches (each replicate's NNI climb with its lengths re-fitted), the
    # replicates over `batch`, their padded pattern counts over `patterns`.
    fitted = ml.fit(alignment, jp.bionj(jp.distances(alignment), alignment.taxa), "HKY")
    settings = ml.SearchSettings(batch=2)
    runs = [ml.bootstrap(alignment, fitted, replicates=2, settings=settings, mesh=mesh)
            for mesh in (None, jp.device_mesh(batch=2, patterns=2))]
    result["bootstrap"] = compared(*runs)
    # On a mesh of 4 x 1 the replicates climb in shares, one per device, each in a thread of its own; stopped
    # inside the shares' climbs (every thread reads the stop request) and resumed, they end as an unstopped
    # run does.
    mesh = jp.device_mesh(batch=4, patterns=1)
    one = ml.bootstrap(alignment, fitted, replicates=6, seed=3, settings=settings)
    shares = ml.bootstrap(alignment, fitted, replicates=6, seed=3, settings=settings, mesh=mesh)
    with tempfile.TemporaryDirectory() as folder:
        stops = 0
        # Every call reads the request once before the shares start and each share's thread once before its
        # first NNI round (a resumed climb starts a round again), five reads at least: the first three calls
        # stop, after no round, about one round, and about two; the last finishes.
        for reads in (1, 2, 3, 1000):
            try:
                resumed = ml.bootstrap(alignment, fitted, replicates=6, seed=3, settings=settings, mesh=mesh,
                                       checkpoint=f"{folder}/boot.ckpt", stop=StopAfter(reads))
            except Interrupted:
                stops += 1
    result["shares"] = {**compared(one, shares), "stops": stops, "resumed": compared(shares, resumed)}
    # MC³ with a run per device: each device runs its own (`runtime.run_shares`), drawing each chain's own
    # numbers: the chains of one device.
    chains = [jp.inference.mc3(alignment, "HKY", runs=4, chains=2, generations=60, sample_every=20, seed=4,
                               mesh=m) for m in (None, mesh)]
    result["mc3"] = max(max_difference(a.columns, b.columns) for a, b in zip(chains[0].runs, chains[1].runs))
    mcmc = ["mcmc", "--model", "HKY", "--runs", "2", "--chains", "2", "--generations", "200", "--sample-every",
            "50", "--block", "2", "--seed", "1"]  # test_sharding.MCMC; its mesh runs are the two-process ones
    assert cli.main([*mcmc, alignment_path, "-o", reference, "--devices", "1"]) == 0
    with tempfile.TemporaryDirectory() as folder:
        logs = []
        for name, devices in (("one", ["--devices", "1"]), ("four", ["--mesh", "patterns=4"])):
            out = f"{folder}/{name}"
            assert cli.main(["sample", "--example", "--model", "HKY", "--chains", "2", "--warmup", "20",
                             "--samples", "10", "--block", "10", "--out", out, "--no-progress", *devices]) == 0
            posterior = az.from_netcdf(f"{out}/posterior.nc").posterior
            logs.append({k: np.asarray(posterior[k]) for k in posterior.data_vars})
        result["nuts"] = max(float(np.max(np.abs(logs[0][k] - logs[1][k]))) for k in logs[0])
    return result


def compared(first, second) -> dict:
    """Two bootstraps `(supports, trees)`: equal supports, the largest RF distance and branch-length difference."""
    from jaxphylo import ml

    return {"supports_equal": first[0] == second[0],
            "rf": max(ml.robinson_foulds(a, b) for a, b in zip(first[1], second[1])),
            "lengths": max(max_difference(a.branch_lengths, b.branch_lengths) for a, b in zip(first[1], second[1]))}


def collectives(alignment_path: str, dump: str) -> dict:
    """Compile and run bootstraps (8 replicates, lengths fitted by L-BFGS and by Newton steps) and MC³ (4 runs x 2 chains) on a mesh of 4 x 1; then, per
    program XLA compiled, how many all-gathers, all-reduces, collective permutes and all-to-alls it holds."""
    import jax

    import jaxphylo as jp
    from jaxphylo import ml

    alignment = jp.read_alignment(alignment_path)
    mesh = jp.device_mesh(batch=4, patterns=1)
    fitted = ml.fit(alignment, jp.bionj(jp.distances(alignment), alignment.taxa), "HKY")
    for method in ("lbfgs", "newton"):  # a CPU's default and a GPU's
        ml.bootstrap(alignment, fitted, replicates=8, seed=1, settings=ml.SearchSettings(lengths_method=method),
                     mesh=mesh)
    jp.inference.mc3(alignment, "HKY", runs=4, chains=2, generations=20, sample_every=10, seed=1, mesh=mesh)
    counts, compiled = {}, set()
    for path in sorted(Path(dump).glob("*after_optimizations.txt")):
        text = path.read_text()
        module, name = path.name.split(".")[:2]
        compiled.add(name)
        found = {op: len(re.findall(rf" {op}(-start)?\(", text))
                 for op in ("all-gather", "all-reduce", "collective-permute", "all-to-all")}
        if any(found.values()):
            counts[f"{module}.{name}"] = found
    return {"devices": len(jax.devices()), "cpu_kernel": jp.likelihood.kernels.cpu_wanted(),
            "compiled": sorted(compiled), "programs": counts}


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "meshes":
        print(json.dumps(meshes()))
    elif mode == "runs":
        print(json.dumps(runs(sys.argv[2], sys.argv[3])))
    elif mode == "collectives":
        print(json.dumps(collectives(sys.argv[2], sys.argv[3])))
    elif mode == "distributed":
        print(json.dumps(distributed(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
