"""Multi-turn environments for agents (UserRL's gym protocol, arXiv 2509.19736): the protocol, batching and user
simulators (`base`) and the gyms: `function` (find a hidden arithmetic rule), `telepathy` (twenty questions),
`turtle` (lateral-thinking puzzles)."""
from jaxlab.envs import base, function, telepathy, turtle
from jaxlab.envs.base import CHOICES, EnvBatch, Episode, Turn, lm_user, parse_call, run, verdict
from jaxlab.envs.function import FunctionGym
from jaxlab.envs.telepathy import TelepathyGym
from jaxlab.envs.turtle import TurtleGym

__all__ = ["base", "function", "telepathy", "turtle", "CHOICES", "EnvBatch", "Episode", "Turn", "lm_user",
           "parse_call", "run", "verdict", "FunctionGym", "TelepathyGym", "TurtleGym"]
