"""ModelFinder: candidates as IQ-TREE 2 lists them (`_candidates`), fitted in batches (`_batch_fit`), ranked
by an information criterion (`_criteria`), per alignment or per part of a partition scheme (`_select`)."""

from ._candidates import (
    Candidate as Candidate,
    default_candidates as default_candidates,
    fit_free_rate_sequences as fit_free_rate_sequences,
    parse_candidate as parse_candidate,
)
from ._batch_fit import gamma_category_means as gamma_category_means
from ._criteria import CRITERIA as CRITERIA, akaike_weights as akaike_weights, information_criteria as information_criteria
from ._select import (
    ModelFit as ModelFit,
    ModelSelection as ModelSelection,
    best_scheme_nexus as best_scheme_nexus,
    bionj_start as bionj_start,
    select_model as select_model,
    select_part_models as select_part_models,
)
