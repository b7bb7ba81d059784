"""The command line: the example runs, bad input gives one line and a non-zero exit."""

import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "jaxphylo.cli", *args], capture_output=True, text=True, timeout=300)


def test_example_prints_the_log_likelihood():
    result = run("loglik", "--example")
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) == pytest.approx(-4652.533643, abs=1e-5)


def test_float32_example():
    result = run("loglik", "--example", "--precision", "float32")
    assert float(result.stdout) == pytest.approx(-4652.533643, rel=1e-3)


@pytest.mark.parametrize("files,model,message", [
    ((">A\nACGT\n>B\nACG\n", "((A:1,B:1):1,C:1);"), "JC", "sequences differ in length"),
    ((">A\nACGT\n>B\nACGT\n>C\nACGA\n", "((A:1,B:1):1,D:1);"), "JC", "taxon 'D' is in the tree but not"),
    ((">A\nACGT\n>B\nACGT\n>C\nACGA\n", "((A:1,B:1):1,C:1;"), "JC", "tree.nwk: line 1"),
    ((">A\nACGT\n>B\nACGT\n>C\nACGA\n", "((A:1,B:1):1,C:1);"), "GTR{1,2}", "GTR takes 5 or 6 values"),
])
def test_bad_input_is_one_line_without_traceback(tmp_path, files, model, message):
    (tmp_path / "aln.fasta").write_text(files[0])
    (tmp_path / "tree.nwk").write_text(files[1])
    result = run("loglik", str(tmp_path / "aln.fasta"), str(tmp_path / "tree.nwk"), "--model", model)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("jaxphylo: error: ")


def test_distance_nj_and_coevolution_commands(tmp_path):
    sequences = ">a\nACGTACGTAAGGCCTT\n>b\nACGTACGAAAGGCCTA\n>c\nTCGTACGAAAGCCCTA\n>d\nTCGAACGAATGCCGTA\n"
    (tmp_path / "aln.fasta").write_text(sequences)
    result = run("distance", str(tmp_path / "aln.fasta"), "--method", "k2p", "-o", str(tmp_path / "d.phy"))
    assert result.returncode == 0, result.stderr
    import jaxphylo as jp
    matrix, taxa = jp.io.read_distance_matrix(tmp_path / "d.phy")
    assert taxa == ("a", "b", "c", "d") and matrix.shape == (4, 4)
    result = run("nj", str(tmp_path / "d.phy"), "--matrix", "-o", str(tmp_path / "tree.nwk"))
    assert result.returncode == 0, result.stderr
    assert jp.read_tree(tmp_path / "tree.nwk").num_tips == 4
    result = run("coevolution", str(tmp_path / "aln.fasta"), "--shuffles", "20", "-o", str(tmp_path / "mi"))
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "mi.tsv").read_text().splitlines()
    assert lines[0].split("\t")[:3] == ["i", "j", "mi"] and len(lines) == 1 + 16 * 15 // 2
    assert (tmp_path / "mi.png").stat().st_size > 1000


def test_bad_distance_matrix_is_one_line(tmp_path):
    (tmp_path / "d.phy").write_text("3\na 0 1 x\nb 1 0 1\nc 1 1 0\n")
    result = run("nj", str(tmp_path / "d.phy"), "--matrix", "-o", str(tmp_path / "t.nwk"))
    assert result.returncode == 2 and "line 2: 'x' is not a distance" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
