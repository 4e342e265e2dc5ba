"""``aggbench audit``: other trainers' loss modes (TRL, verl, OpenRLHF, SkyRL) as per-token weights.

``modes`` holds each library's modes written from its source; ``core`` applies one to a batch and
names the aggbench rule it equals.
"""

from aggbench.audit.core import AuditReport, Equivalent, audit, micro_slices, mode_weights, rule_weights
from aggbench.audit.modes import SETTING, VERSIONS, Mode, get_mode, libraries, mode_names, register_mode

__all__ = [
    "SETTING",
    "VERSIONS",
    "AuditReport",
    "Equivalent",
    "Mode",
    "audit",
    "get_mode",
    "libraries",
    "micro_slices",
    "mode_names",
    "mode_weights",
    "register_mode",
    "rule_weights",
]
