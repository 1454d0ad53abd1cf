"""fastslow: Fast-Slow Training (FST) for LLMs.

Slow weights (model parameters) learn by RL from scalar reward; fast weights (a pool of textual
contexts) learn by GEPA reflective prompt evolution from rollouts' text and feedback.
"""

__version__ = "0.1.0"
