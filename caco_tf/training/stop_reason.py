"""Why a run stopped itself: the health monitor's verdict (``callbacks.HealthMonitor`` sets
``model.stop_reason``), which the checkpoints heed (nothing more is saved) and the run's end
turns into its error and advice (``pretrain``)."""

import dataclasses

KINDS = ("divergence", "collapse")  # a NaN or infinite loss; a collapse (stop_on_collapse)


@dataclasses.dataclass(frozen=True)
class StopReason:
    """``kind``: one of ``KINDS``; ``message``: what happened and where, in words."""

    kind: str
    message: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"a stop reason's kind is one of {', '.join(KINDS)}, "
                             f"got {self.kind!r}")

    def __str__(self):
        return self.message
