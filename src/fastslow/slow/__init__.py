"""The slow loop: CISPO reinforcement learning on the weights, conditioned on a pool of contexts.

Built on TRL's `GRPOTrainer` (`loss_type="cispo"`); our loop owns the steps so that a cycle of
T steps resumes exactly from the previous one. See `trainer.py` for how the pool enters TRL and
`loop.py` for what a cycle reads and writes.
"""

from fastslow.slow.config import SlowConfig
from fastslow.slow.divergence import kl_and_entropy
from fastslow.slow.loop import CycleResult, read_state, run_cycle
from fastslow.slow.trainer import expand_rows

__all__ = ["CycleResult", "SlowConfig", "expand_rows", "kl_and_entropy", "read_state", "run_cycle"]
