"""The built-in example: 16 taxa, 600 sites simulated under HKY+G4 on a known tree."""

from importlib import resources


def example_paths() -> tuple[str, str]:
    """`(alignment FASTA, tree Newick)` of the built-in example."""
    root = resources.files("jaxphylo").joinpath("examples")
    return str(root.joinpath("example.fasta")), str(root.joinpath("example.nwk"))
