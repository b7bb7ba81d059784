"""Newick and NEXUS tree text, written directly: the samplers write thousands of trees, too many to pass
through DendroPy one by one (`write_tree`, for users' files, does).

Tips are written as NEXUS translate numbers (1-based, in taxon order) or as names, quoted where Newick
needs it; every branch may carry a `[&...]` note (or a support label) before its length.
"""

from __future__ import annotations

import numpy as np

from ..tree import Topology


def quoted(name: str) -> str:
    """A taxon name as Newick and NEXUS read it back: bare when it is safe, else in single quotes."""
    return name if all(c.isalnum() or c in "_.-" for c in name) else "'" + name.replace("'", "''") + "'"


def newick_string(topology: Topology, lengths: np.ndarray, notes: list[str] | None = None, root_note: str = "",
                  names: bool = False) -> str:
    """Newick of `topology` with `lengths[node]` on every branch and `notes[node]` (text) before each length;
    tips as translate numbers, or with `names` as their quoted names."""
    children = topology.children
    text = [""] * topology.num_nodes
    for node in range(topology.num_nodes):  # children precede parents
        if node < topology.num_tips:
            label = quoted(topology.taxa[node]) if names else str(node + 1)
        else:
            label = "(" + ",".join(text[c] for c in children[node]) + ")"
        if node == topology.root:
            text[node] = label + root_note
        else:
            text[node] = f"{label}{notes[node] if notes else ''}:{lengths[node]:.10g}"
    return text[topology.root] + ";"


def nexus_trees_header(taxa) -> str:
    """`#NEXUS` and the start of a trees block with its translate table (tree lines and `End;` follow)."""
    translate = ",\n".join(f"\t\t{i + 1} {quoted(name)}" for i, name in enumerate(taxa))
    return "\n".join(["#NEXUS", "", "Begin trees;", "\tTranslate", translate, "\t\t;"]) + "\n"
