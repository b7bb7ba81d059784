"""Runs: blocks saved as they finish, resume, outputs, and the `sample` command."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import arviz as az
import dendropy
import numpy as np
import pytest

import jaxphylo as jp
from jaxphylo.inference import Analysis, prepare
from jaxphylo.runtime import BlockRun, load_checkpoint
from jaxphylo.inference.nuts import run_nuts
from numpyro.infer.util import log_density

from conftest import sigterm_at_random_moment

EXAMPLE = ("jaxphylo/examples/example.fasta", "jaxphylo/examples/example.nwk")


@pytest.fixture(scope="module")
def example():
    alignment, tree = jp.read_alignment(EXAMPLE[0]), jp.read_tree(EXAMPLE[1])
    return prepare(alignment, tree, Analysis("HKY+G4"))


def run(prepared, out, samples, resume=False, settings=None):
    return run_nuts(prepared.model, prepared.data, prepared.init, out, settings=settings or {"analysis": "HKY+G4"},
                    chains=1, warmup=40, samples=samples, block=10, seed=3, resume=resume, progress=False,
                    method="vectorized", log=lambda _: None)


def test_resumed_run_equals_an_uninterrupted_one(example, tmp_path):
    whole = run(example, tmp_path / "whole", 20)
    run(example, tmp_path / "parts", 10)
    first_block = (tmp_path / "parts" / "blocks" / "block_00000.npz").read_bytes()
    resumed = run(example, tmp_path / "parts", 20, resume=True)
    assert (tmp_path / "parts" / "blocks" / "block_00000.npz").read_bytes() == first_block
    assert resumed.num_draws == 20
    for name, values in whole.samples.items():
        np.testing.assert_array_equal(resumed.samples[name], values)
    np.testing.assert_allclose(resumed.stats["likelihood"], whole.stats["likelihood"])
    first = {k: v[0, 0] for k, v in whole.samples.items()}
    joint, _ = log_density(example.model, (example.data,), {}, first)
    assert whole.stats["posterior"][0, 0] == pytest.approx(float(joint), rel=1e-12)
    expected = float(jp.inference.PhyloCTMC(
        example.tree.with_branch_lengths(np.append(first["branch_lengths"], 0.0)),
        jp.models.Model(jp.models.HKY85(first["kappa"], first["frequencies"]),
                        jp.models.DiscreteGamma(first["gamma_shape"], 4)),
    ).log_prob(example.data))
    assert whole.stats["likelihood"][0, 0] == pytest.approx(expected, rel=1e-12)


def test_run_directory_errors(example, tmp_path):
    run(example, tmp_path / "a", 10)
    with pytest.raises(jp.InputError, match="already holds a run; continue it with --resume"):
        run(example, tmp_path / "a", 10)
    with pytest.raises(jp.InputError, match="holds a different analysis: analysis was 'HKY\\+G4' there"):
        run(example, tmp_path / "a", 10, resume=True, settings={"analysis": "GTR+G4"})
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("mine")
    with pytest.raises(jp.InputError, match="nothing to resume"):
        run(example, tmp_path / "b", 10, resume=True)


def cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "jaxphylo.cli", *args], capture_output=True, text=True, **kwargs)


def uncached() -> dict:
    """The environment without the tests' compilation cache (conftest): loading and writing its entries
    adds to a process's peak memory, which the dry-run test compares with an estimate."""
    return {**{k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}, "JAXPHYLO_CACHE_DIR": "off"}


SAMPLE_ARGS = ["sample", "--example", "--chains", "2", "--warmup", "60", "--samples", "20", "--block", "10",
               "--no-progress"]
RUN_FILES = ("run.json", "checkpoint.pkl", "blocks/block_00000.npz", "blocks/block_00001.npz", "posterior.nc",
             "chain1.log", "chain2.log", "chain1.trees", "chain2.trees", "summary.tsv", "summary.png")


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """An uninterrupted `sample` run of the example: the reference for interrupted ones."""
    out = tmp_path_factory.mktemp("whole") / "run"
    result = cli(*SAMPLE_ARGS, "--out", str(out), timeout=900, env=uncached())
    assert result.returncode == 0, result.stderr
    return out, result


def test_sample_command_writes_every_output(whole_run, tmp_path):
    out, result = whole_run
    assert "kappa" in result.stdout and "R-hat" in result.stdout
    for name in ("posterior.nc", "chain1.log", "chain2.log", "chain1.trees", "summary.tsv", "summary.png"):
        assert (out / name).stat().st_size > 0, name
    trees = dendropy.TreeList.get(path=str(out / "chain1.trees"), schema="nexus")
    assert len(trees) == 20 and len(trees[0].leaf_nodes()) == 16
    log = np.genfromtxt(out / "chain1.log", names=True, delimiter="\t")
    assert log.shape == (20,) and "posterior" in log.dtype.names and "tree_length" in log.dtype.names
    np.testing.assert_allclose(log["posterior"], log["likelihood"] + log["prior"])
    # The NetCDF read back by whichever ArviZ pip gave (0.2x InferenceData or 1.x DataTree): the
    # same draws as the Tracer log, and ArviZ's own diagnostics run on it.
    data = az.from_netcdf(out / "posterior.nc")
    assert data.posterior["kappa"].shape == (2, 20)
    assert data.posterior["branch_lengths"].shape[:2] == (2, 20)
    np.testing.assert_allclose(np.asarray(data.posterior["kappa"])[0], log["kappa"], rtol=1e-9)  # the log keeps 10 digits
    np.testing.assert_allclose(np.asarray(data.log_likelihood["alignment"])[0], log["likelihood"], rtol=1e-9)  # the log keeps 10 digits
    assert np.asarray(data.sample_stats["diverging"]).dtype == bool
    summary = az.summary(data, var_names=["kappa"])
    assert abs(float(summary.loc["kappa", "mean"]) - float(np.asarray(data.posterior["kappa"]).mean())) < 0.01
    again = cli("sample", "--example", "--model", "GTR+G4", "--out", str(out), "--resume", "--no-progress")
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "different analysis" in again.stderr
    assert "Traceback" not in again.stderr


def readme_slurm_script(tmp_path) -> Path:
    """The README's Slurm script, running the example through this Python, with a stand-in `scontrol`."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    script = re.search(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", readme, re.S).group(1)
    command = "jaxphylo sample aln.fasta tree.nwk -m GTR+G4 --out run"
    assert command in script
    script = script.replace(command, f"{sys.executable} -m jaxphylo.cli " + " ".join(SAMPLE_ARGS) + " --out run")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scontrol").write_text('#!/bin/sh\necho "$@" >> requeued\n')
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    (tmp_path / "job.sh").write_text(script)
    return tmp_path / "job.sh"


def test_sigterm_at_a_random_moment_saves_requeues_and_resumes_to_the_same_bytes(whole_run, tmp_path):
    """The README's Slurm script sent SIGTERM anywhere (start-up, warmup, sampling): the run exits 75 within
    30 s and requeues; the requeued job resumes and ends with the bytes of an uninterrupted run."""
    reference, _ = whole_run
    job = readme_slurm_script(tmp_path)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", SLURM_JOB_ID="42",
               PYTHONPATH=str(Path(__file__).parents[1]))
    _, delay = sigterm_at_random_moment(["bash", str(job)], 2.0, 25.0, cwd=tmp_path, env=env)
    assert (tmp_path / "requeued").read_text().strip() == "requeue 42"
    again = subprocess.run(["bash", str(job)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr
    assert "resuming" in again.stderr
    for name in RUN_FILES:
        assert (tmp_path / "run" / name).read_bytes() == (reference / name).read_bytes(), \
            f"{name} (SIGTERM at {delay:.1f} s)"


def test_damaged_checkpoint_is_refused_in_one_line(whole_run, tmp_path):
    reference, _ = whole_run
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    content = (reference / "checkpoint.pkl").read_bytes()
    cut = int(np.random.default_rng().integers(1, len(content)))
    (out / "checkpoint.pkl").write_bytes(content[:cut])
    result = cli(*SAMPLE_ARGS, "--out", str(out), "--resume", "--samples", "30")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "checkpoint" in result.stderr and "Traceback" not in result.stderr
    flipped = bytearray(content)
    flipped[-10] ^= 0xFF
    (out / "checkpoint.pkl").write_bytes(bytes(flipped))
    with pytest.raises(jp.InputError, match="corrupted checkpoint"):
        load_checkpoint(out / "checkpoint.pkl", {})
    settings = json.loads((reference / "run.json").read_text())
    settings.pop("samples")
    assert BlockRun(reference / "checkpoint.pkl", settings).open(True)["position"] == 80  # the undamaged one loads
    with pytest.raises(jp.InputError, match="different analysis: seed was"):
        BlockRun(reference / "checkpoint.pkl", dict(settings, seed=1)).open(True)


def test_sample_command_on_a_dated_time_tree(tmp_path):
    """Tip dates from a TSV, strict clock, coalescent: rate-annotated NEXUS trees and time-tree outputs."""
    import jax.numpy as jnp

    from jaxphylo.inference import branch_durations, ratios_to_heights, time_tree

    rng = np.random.default_rng(3)
    taxa = [f"s{i}" for i in range(8)]
    topology = jp.random_topology_tree(taxa, seed=3).topology
    dates = 2020 - rng.uniform(0, 20, len(taxa))
    time = time_tree(topology, dates.max() - dates)
    heights = ratios_to_heights(time, jnp.asarray(15.0), jnp.full(time.num_internal - 1, 0.5))
    durations = branch_durations(time, heights)
    alignment = jp.simulate(jp.Tree(0.01 * durations, topology), jp.parse_model("HKY{3}+FQ"), 400, seed=4)
    (tmp_path / "aln.fasta").write_text("".join(f">{t}\n{s}\n" for t, s in zip(alignment.taxa, alignment.sequences)))
    jp.write_tree(jp.Tree(durations, topology), tmp_path / "tree.nwk")
    (tmp_path / "dates.tsv").write_text("taxon\tdate\n" + "".join(f"{t}\t{d}\n" for t, d in zip(taxa, dates)))
    out = tmp_path / "run"
    base = ["sample", str(tmp_path / "aln.fasta"), str(tmp_path / "tree.nwk"), "--model", "HKY+FQ",
            "--clock", "strict"]
    result = cli(*base, "--dates", str(tmp_path / "dates.tsv"), "--chains", "1", "--warmup", "50",
                 "--samples", "10", "--block", "10", "--out", str(out), "--no-progress", timeout=900)
    assert result.returncode == 0, result.stderr
    assert "clock_rate" in result.stdout and "root_height" in result.stdout
    trees = dendropy.TreeList.get(path=str(out / "chain1.trees"), schema="nexus")
    assert len(trees) == 10 and trees[0].is_rooted
    assert all(e.annotations.get_value("rate") is not None for e in trees[0].postorder_node_iter() if e.parent_node)
    (tmp_path / "extra.tsv").write_text("".join(f"{t}\t{d}\n" for t, d in zip(taxa + ["ghost"], list(dates) + [2000])))
    bad = cli(*base, "--dates", str(tmp_path / "extra.tsv"), "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "'ghost' has a date but is not in the tree" in bad.stderr
    assert "Traceback" not in bad.stderr


def _gib(text: str, pattern: str) -> float:
    import re

    value, unit = re.search(pattern + r"\s*([0-9.]+) (GiB|MiB)", text).groups()
    return float(value) * (1 if unit == "GiB" else 1 / 1024)


def test_dry_run_memory_is_within_20_percent_of_the_run(whole_run):
    """`--dry-run` compiles the sampler on shapes and prints its memory; the real run reports its peak."""
    _, result = whole_run
    dry = cli(*SAMPLE_ARGS, "--out", "unused-dry-run", "--dry-run", timeout=900, env=uncached())
    assert dry.returncode == 0, dry.stderr
    for words in ("16 taxa", "600 sites", "307 patterns", "4 states", "4 rate categories", "partials",
                  "transition matrices", "free of", "one likelihood-and-gradient"):
        assert words in dry.stderr, words
    estimate = _gib(dry.stderr, r"\(outside XLA\) =")
    measured = _gib(result.stderr, r"peak memory while sampling:")
    assert abs(estimate - measured) <= 0.2 * measured, (estimate, measured)
    assert not os.path.exists("unused-dry-run")


def test_a_run_too_large_for_memory_stops_before_allocating(tmp_path):
    # A fresh parent process, so that its children's peak memory is this run's alone.
    command = [sys.executable, "-m", "jaxphylo.cli", *SAMPLE_ARGS, "--chains", "1000000", "--out", str(tmp_path / "big")]
    parent = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
              "sys.stderr.write(r.stderr); print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    result = subprocess.run([sys.executable, "-c", parent, *command], capture_output=True, text=True, timeout=900)
    code, peak_kib = map(int, result.stdout.split())
    assert code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "this run needs about" in result.stderr and "is free" in result.stderr and "--precision float32" in result.stderr
    assert peak_kib < 4 * 2**20, peak_kib  # never near the 100+ GiB it would need
    assert not (tmp_path / "big").exists()
