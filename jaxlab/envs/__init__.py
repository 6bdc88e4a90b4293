"""Multi-turn environments for agents (UserRL's gym protocol, arXiv 2509.19736): the protocol, batching and user
simulators (`base`). The gyms live with the papers that play them: `experiments.bao` (function, telepathy,
turtle) and `experiments.gig` (cooking, textworld)."""
from jaxlab.envs import base
from jaxlab.envs.base import CHOICES, EnvBatch, Episode, Turn, lm_user, parse_call, run, verdict

__all__ = ["base", "CHOICES", "EnvBatch", "Episode", "Turn", "lm_user", "parse_call", "run", "verdict"]
