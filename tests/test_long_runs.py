"""Shared long-run mechanics: durations, stop requests, checkpoint files, out-of-memory and non-finite errors."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import jaxphylo as jp
from jaxphylo import cli
from jaxphylo.runtime import StopRequests, block_size, load_checkpoint, parse_duration, save_checkpoint, write_npz


def test_durations_in_every_spelling():
    assert parse_duration("23h") == 82800 and parse_duration("1h30m") == 5400 and parse_duration("90") == 90
    assert parse_duration("36:00:00") == 129600 and parse_duration("2d") == 172800 and parse_duration("1:30") == 90
    with pytest.raises(jp.InputError, match="--max-time 'soon'"):
        parse_duration("soon")


def test_signals_and_budgets_raise_the_flag():
    with StopRequests() as stop:
        assert stop.reason is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.reason == "received SIGUSR1"
    with StopRequests(0.0) as stop:
        assert "--max-time" in stop.reason
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored
    # A process started in the background by a shell without job control inherits SIGINT ignored (Python
    # then installs no handler of its own): start from Python's handler whatever the start was.
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:  # a finished long run (the CLI's) ignores a SIGTERM that arrives while it exits; an interrupted one not
        with StopRequests(ignore_after=True):
            pass
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(RuntimeError), StopRequests(ignore_after=True):
            raise RuntimeError("interrupted")
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # what it found, restored
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, found)


def test_checkpoints_are_atomic_checksummed_and_tied_to_settings(tmp_path):
    path = tmp_path / "c.pkl"
    save_checkpoint(path, {"x": np.arange(5)}, {"seed": 1})
    assert not (tmp_path / "c.pkl.tmp").exists()
    np.testing.assert_array_equal(load_checkpoint(path, {"seed": 1})["x"], np.arange(5))
    with pytest.raises(jp.InputError, match="different analysis: seed was 1 there, 2 now"):
        load_checkpoint(path, {"seed": 2})
    save_checkpoint(path, {"x": 1}, {"search": {"radius": 6, "model": "HKY+G4"}})
    with pytest.raises(jp.InputError, match="search.model was 'HKY\\+G4' there, 'GTR' now"):
        load_checkpoint(path, {"search": {"radius": 6, "model": "GTR"}})
    content = path.read_bytes()
    for cut in (3, len(content) // 2, len(content) - 1):
        path.write_bytes(content[:cut])
        with pytest.raises(jp.InputError, match="truncated|not a jaxphylo checkpoint"):
            load_checkpoint(path, {"seed": 1})


def test_npz_blocks_are_byte_identical_for_equal_arrays(tmp_path):
    arrays = {"a": np.linspace(0, 1, 7), "b": np.eye(3, dtype=np.int32)}
    for name in ("one", "two"):
        with open(tmp_path / name, "wb") as handle:
            write_npz(handle, arrays)
    assert (tmp_path / "one").read_bytes() == (tmp_path / "two").read_bytes()
    loaded = np.load(tmp_path / "one")
    np.testing.assert_array_equal(loaded["b"], arrays["b"])


def test_blocks_start_with_one_sample_and_double():
    """The first samples of a run reach its files after one sample's generations; blocks then double up to
    the settings' block, and the last one ends at the total. A function of the samples done alone: a run
    resumed after any block continues with the same blocks."""
    sizes, done = [], 0
    while done < 130:
        sizes.append(block_size(done, 130, 50))
        done += sizes[-1]
    assert sizes == [1, 1, 2, 4, 8, 16, 32, 50, 16]
    assert block_size(5, 6, 50) == 1 and block_size(6, 6, 50) == 0 and block_size(0, 3, 1) == 1


def test_xla_out_of_memory_becomes_one_line(monkeypatch, capsys):
    def exhausted(args):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 96.00GiB.\nmore detail")

    monkeypatch.setattr(cli._loglik, "run", exhausted)  # the loglik command's run
    assert cli.main(["loglik", "--example"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "out of memory" in error and "--dry-run" in error


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "jaxphylo.cli", *args], capture_output=True, text=True,
                          timeout=900)


def test_non_finite_likelihood_names_its_cause(tmp_path):
    from jaxphylo.likelihood import check_start, pattern_data

    result = run_cli("loglik", "--example", "-m", "HKY{4}+F{0.5,0.5,0,0}")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "site pattern 1 has log-likelihood nan" in result.stderr
    alignment = jp.read_alignment("jaxphylo/examples/example.fasta")
    tree = jp.read_tree("jaxphylo/examples/example.nwk")
    data, model = pattern_data(alignment, tree), jp.parse_model("HKY{4}+G4{0.5}", alignment)
    assert np.isfinite(check_start(data, tree, model))
    import equinox as eqx
    import jax.numpy as jnp

    bad = eqx.tree_at(lambda m: m.substitution.kappa, model, jnp.asarray(-1.0))
    with pytest.raises(jp.ModelError, match="substitution.kappa = -1 is negative"):
        check_start(data, tree, bad)
    lengths = jnp.asarray(tree.branch_lengths).at[2].set(jnp.inf)
    with pytest.raises(jp.ModelError, match="branch length above taxon .* = inf"):
        check_start(data, tree.with_branch_lengths(lengths), model)
    sampled = run_cli("sample", "--example", "-m", "HKY+F{0.5,0.5,0,0}+G4", "--chains", "1", "--warmup", "5",
                      "--samples", "5", "--out", str(tmp_path / "run"), "--no-progress")
    assert sampled.returncode == 2 and "Traceback" not in sampled.stderr, sampled.stderr
    assert "starting log-likelihood is nan: site pattern" in sampled.stderr.splitlines()[-1]


def test_non_finite_proposals_are_rejected_as_divergent_and_never_saved(tmp_path):
    """A log density that is -inf beyond x = 1 (as an underflowing likelihood would be): NUTS rejects those
    proposals as divergent transitions; every saved draw is inside, with a finite log density."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from jaxphylo.inference.nuts import run_nuts

    def model(data):
        x = numpyro.sample("x", dist.Normal(0.0, 1.0))
        numpyro.factor("wall", jnp.where(x < 1.0, 0.0, -jnp.inf) + 0 * data)

    draws = run_nuts(model, jnp.zeros(()), {"x": jnp.asarray(0.0)}, tmp_path / "run", settings={}, chains=1,
                     warmup=100, samples=400, block=400, seed=0, progress=False, log=lambda _: None)
    assert np.all(draws.samples["x"] < 1.0) and np.all(np.isfinite(draws.stats["posterior"]))
    assert draws.stats["diverging"].sum() > 0
