"""The adaptive draft length (``DraftPolicy``: ``new_sequence``, ``choose``, ``observe``) and its cost model."""

from .cost import CostModel, MachineSpeed
from .policy import CONFIDENCE_CUT, DraftPolicy, Outcome, SequenceDraft

__all__ = ["CONFIDENCE_CUT", "CostModel", "DraftPolicy", "MachineSpeed", "Outcome", "SequenceDraft"]
