import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import jaxphylo as jp

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


def iqtree_log_likelihood(alignment_path, tree_path, model: str, workdir: Path, data_type=None) -> float:
    """IQ-TREE 2's log-likelihood with the tree, branch lengths and all model values fixed."""
    require("iqtree2")
    prefix = workdir / "iq"
    command = ["iqtree2", "-s", str(alignment_path), "-te", str(tree_path), "-blfix", "-m", model,
               "-pre", str(prefix), "-redo", "-quiet", "-nt", "1", "-seed", "1", "-keep-ident"]
    if data_type:
        command += ["-st", data_type]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    for line in (prefix.with_suffix(".iqtree")).read_text().splitlines():
        if line.startswith("Log-likelihood of the tree:"):
            return float(line.split(":")[1].split()[0])
    raise AssertionError("IQ-TREE printed no log-likelihood")


def write_fasta(alignment, path: Path) -> Path:
    with open(path, "w") as handle:
        for name, sequence in zip(alignment.taxa, alignment.sequences):
            handle.write(f">{name}\n{sequence}\n")
    return path


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
