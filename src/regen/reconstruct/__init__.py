"""Token-exact training ids for every answer: the prompt through the target tokenizer's own chat
template (or its publisher's encoder), the completion as that template writes the finished
answer (rendered.py) or, for the few families it cannot show, their grammar (families.py), or
the server's exact ids where it returned them (target.py). Every rebuild passes a self-check
(check.py); `regen audit` checks the result against billed usage."""

from regen.reconstruct.families import FAMILIES, Answer, Family, family
from regen.reconstruct.target import (
    ReconstructError,
    Sample,
    Target,
    TargetSpec,
    sim_template,
    spec_from_store,
)

__all__ = [
    "FAMILIES",
    "Answer",
    "Family",
    "ReconstructError",
    "Sample",
    "Target",
    "TargetSpec",
    "family",
    "sim_template",
    "spec_from_store",
]
