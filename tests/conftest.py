import itertools
import os
import shutil
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _stops import StopAfter as StopAfter  # the tests import it from here


def _compilation_cache_dir() -> Path:
    """A persistent XLA cache for this test run and this xdist worker (no two processes write it at once)."""
    import tempfile

    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return Path(tempfile.gettempdir()) / f"jaxphylo-tests-xla-cache-{run[:12]}-{worker}"


# Most of the suite's time is XLA compiling (single-threaded); many tests compile the very same programs again:
# a CLI run in a subprocess after the same search in-process, a run resumed after SIGTERM, a jitted function
# traced twice with arguments differing only in weak types. Executables compiled from the same HLO are taken from
# jaxphylo's persistent cache, here in a folder of this run's own (never the user's cache folder), for this process
# and (through the environment) the subprocesses it starts; results are the same as recompiling. Set before
# jaxphylo is imported, which turns the cache on. JAXPHYLO_TEST_XLA_CACHE=0 turns it off; a cache the caller
# configured in JAX (JAX_COMPILATION_CACHE_DIR) is kept, and then jaxphylo leaves it alone.
if os.environ.get("JAXPHYLO_TEST_XLA_CACHE", "1") == "0":
    os.environ["JAXPHYLO_CACHE_DIR"] = "off"
else:
    os.environ["JAXPHYLO_CACHE_DIR"] = str(_compilation_cache_dir())

import jaxphylo as jp  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def dataset(name: str) -> Path:
    """A real data set from ../shared/data, or skip when this checkout has none."""
    folder = DATA / name
    if not folder.is_dir():
        pytest.skip(f"real data {folder} not present (a fresh checkout has no ../shared)")
    return folder


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed; .ci/run must install it")
        pytest.skip(f"{tool} not installed")
    return path


def iqtree_log_likelihood(alignment_path, tree_path, model: str, workdir: Path, data_type=None, options=()) -> float:
    """IQ-TREE 2's log-likelihood with the tree, branch lengths and all model values fixed (`options`: more flags,
    e.g. `--gamma-median`)."""
    require("iqtree2")
    prefix = workdir / "iq"
    command = ["iqtree2", "-s", str(alignment_path), "-te", str(tree_path), "-blfix", "-m", model,
               "-pre", str(prefix), "-redo", "-quiet", "-nt", "1", "-seed", "1", "-keep-ident"]
    if data_type:
        command += ["-st", data_type]
    subprocess.run(command + list(options), check=True, capture_output=True, timeout=600)
    for line in (prefix.with_suffix(".iqtree")).read_text().splitlines():
        if line.startswith("Log-likelihood of the tree:"):
            return float(line.split(":")[1].split()[0])
    raise AssertionError("IQ-TREE printed no log-likelihood")


def sigterm_at_random_moment(command, low: float, high: float, **popen) -> tuple[str, float]:
    """Start `command`, send SIGTERM after a uniform `[low, high]` s, and check the clean stop every long command
    owes: exit 75 within 30 s, a `--resume` hint, no traceback. Returns (stderr, the delay); skips the test when
    the run finished first."""
    import signal
    import time

    delay = float(np.random.default_rng().uniform(low, high))
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)
    time.sleep(delay)
    sent = time.time()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=600)
    waited = time.time() - sent
    if process.returncode == 0:
        pytest.skip(f"the run finished before SIGTERM at {delay:.1f} s")
    if process.returncode == -signal.SIGTERM and not stderr:
        # Python was still importing JAX (slow on a loaded machine): no handler yet, nothing started or written.
        pytest.skip(f"SIGTERM at {delay:.1f} s came during interpreter start-up, before any handler")
    assert process.returncode == 75, stderr
    assert waited < 30, f"stopped {waited:.1f} s after SIGTERM (sent at {delay:.1f} s)"
    assert "--resume" in stderr and "Traceback" not in stderr
    return stderr, delay


def dated_simulation(num_taxa: int, root_age: float, rate: float, num_sites: int, seed: int):
    """Tips dated over 20 years (tip 0 the latest), a random topology with its root `root_age` years back, and a
    JC alignment at `rate` substitutions per site per year: `(alignment, tree in years, tip heights, time tree)`."""
    from jaxphylo.inference import branch_durations, ratios_to_heights, time_tree

    rng = np.random.default_rng(seed)
    taxa = [f"t{i}" for i in range(num_taxa)]
    topology = jp.random_topology_tree(taxa, seed=seed).topology
    tips = np.round(rng.uniform(0, 20, len(taxa)), 2)
    tips[0] = 0.0
    time = time_tree(topology, tips)
    heights = ratios_to_heights(time, jnp.asarray(root_age - time.anchors[-1]),
                                jnp.asarray(rng.uniform(0.3, 0.7, time.num_internal - 1)))
    tree = jp.Tree(branch_durations(time, heights), topology)
    alignment = jp.simulate(jp.Tree(rate * tree.branch_lengths, topology), jp.parse_model("JC"), num_sites,
                            seed=seed + 1)
    return alignment, tree, tips, time


def write_fasta(alignment, path: Path) -> Path:
    with open(path, "w") as handle:
        for name, sequence in zip(alignment.taxa, alignment.sequences):
            handle.write(f">{name}\n{sequence}\n")
    return path


# The files that take longest (a full run's `--durations`), started first: with two workers taking a file at a
# time, a long file left for last would run alone at the end.
LONGEST_FIRST = ("test_sharding.py", "test_mc3.py", "test_ml.py", "test_partitioned_inference.py",
                 "test_notebooks.py", "test_sampling.py")


def pytest_sessionfinish(session):
    if os.environ.get("JAXPHYLO_CACHE_DIR") == str(_compilation_cache_dir()):
        shutil.rmtree(_compilation_cache_dir(), ignore_errors=True)


def pytest_collection_modifyitems(items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable: order within a file kept


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop each test module's compiled programs when it ends.

    XLA's CPU JIT maps memory for every compiled program; the whole suite in one
    process grew past 14,000 maps a third of the way through and crashed inside a
    compilation (Linux allows 65,530 per process).
    """
    yield
    jax.clear_caches()


@pytest.fixture(autouse=True)
def _restore_xla_flags():
    """In-process CLI runs with several chains set XLA_FLAGS (`numpyro.set_host_device_count`): harmless to this
    process, whose JAX has started, but inherited by the subprocesses of later tests in the same worker (their
    device count, hence their default mesh, would change). Restore it after every test."""
    before = os.environ.get("XLA_FLAGS")
    yield
    if before is None:
        os.environ.pop("XLA_FLAGS", None)
    else:
        os.environ["XLA_FLAGS"] = before


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def internal_state_terms(alignment, tree, model):
    """Yield `(state of every internal node, w_r * P(data, states | category r) per pattern)` for every
    assignment of internal states and every category: brute force, independent of the peeling code."""
    topo = tree.topology
    transition = np.asarray(model.transition_matrices(tree.branch_lengths))
    _, weights = (np.asarray(x) for x in model.rate_categories())
    pi = np.asarray(model.frequencies)
    patterns = alignment.site_patterns()
    tips = patterns.tip_partials()[[patterns.taxa.index(t) for t in topo.taxa]]
    internal = range(topo.num_tips, topo.num_nodes)
    for c, w in enumerate(weights):
        for states in itertools.product(range(len(pi)), repeat=len(internal)):
            state = dict(zip(internal, states))
            term = w * pi[state[topo.root]] * np.ones(patterns.num_patterns)
            for node, up in enumerate(topo.parent):
                if up >= 0:
                    row = transition[node, c, state[up]]
                    term = term * (tips[node] @ row if node < topo.num_tips else row[state[node]])
            yield state, term


def check_spr_scores(alignment, model, data, trees, lengths, radius: int, log_l):
    """Every pruning's best regraft of `trees[0]`, built as a tree with its three fitted branches, has the log L
    that `spr_scores` gave it (`log_l(parents, lengths)` evaluates a batch of kernel trees)."""
    from jaxphylo.tree import phase_widths
    from jaxphylo.ml import regrafted_tree, spr_scores

    n = len(alignment.taxa)
    scores = jax.jit(spr_scores, static_argnums=(5, 6, 7))(trees.parents[0], lengths[0], model, data, data.weights,
                                                           phase_widths(n), jnp.float64, radius)
    gains = np.asarray(scores.gains)
    assert gains.shape == (3 * (n - 1),) and np.isfinite(gains).sum() > n  # the root's three are never valid
    built = [regrafted_tree(np.asarray(trees.parents[0]), np.asarray(lengths[0]), scores.nodes[j], scores.lengths[j])
             for j in np.flatnonzero(np.isfinite(gains))]
    parents, new_lengths = (jnp.asarray(np.stack(x)) for x in zip(*built))
    np.testing.assert_allclose(log_l(parents, new_lengths) - log_l(trees.parents, lengths)[0],
                               gains[np.isfinite(gains)], atol=1e-8)
    return scores


def six_dated_tips(tmp_path: Path, sites: int):
    """Six tips sampled from 1999 to 2015 (the latest dated only to its year, written to `tmp_path/dates.tsv`), a
    time tree on them and a JC alignment of `sites` simulated on it: `(alignment, tree, tip dates)`."""
    from jaxphylo.inference import branch_durations, ratios_to_heights, time_tree

    taxa = [f"s{i}" for i in range(6)]
    topology = jp.random_topology_tree(taxa, seed=5).topology
    dates = np.array([2015.5, 2010.25, 2004.75, 2008.5, 1999.0, 2001.5])
    time = time_tree(topology, dates.max() - dates)
    heights = ratios_to_heights(time, jnp.asarray(10.0), jnp.full(time.num_internal - 1, 0.5))
    tree = jp.Tree(branch_durations(time, heights), topology)
    alignment = jp.simulate(jp.Tree(0.01 * tree.branch_lengths, topology), jp.parse_model("JC"), sites, seed=1)
    (tmp_path / "dates.tsv").write_text("taxon\tdate\n" + "".join(f"{t}\t{d}\n" for t, d in zip(taxa, dates))
                                        .replace("2015.5", "2015"))
    return alignment, tree, jp.io.read_tip_dates(tmp_path / "dates.tsv")
