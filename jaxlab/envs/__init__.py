"""Multi-turn environments for agents (UserRL's gym protocol, arXiv 2509.19736): the protocol, batching and user
simulators (`base`) and the gyms: `function` (find a hidden arithmetic rule), `telepathy` (twenty questions),
`turtle` (lateral-thinking puzzles), `cooking` (a Robotouille-like kitchen, synchronous or asynchronous, with
PDDL export and scene graphs: GiG's environment), `textworld` (TextWorld's cooking games on its logic engine, with
fact graphs: GiG's text-game environment)."""
from jaxlab.envs import base, cooking, function, telepathy, textworld, turtle
from jaxlab.envs.base import CHOICES, EnvBatch, Episode, Turn, lm_user, parse_call, run, verdict
from jaxlab.envs.cooking import CookingEnv
from jaxlab.envs.function import FunctionGym
from jaxlab.envs.telepathy import TelepathyGym
from jaxlab.envs.textworld import TextWorldCooking
from jaxlab.envs.turtle import TurtleGym

__all__ = ["base", "cooking", "function", "telepathy", "textworld", "turtle", "CHOICES", "EnvBatch", "Episode", "Turn",
           "lm_user", "parse_call", "run", "verdict", "CookingEnv", "FunctionGym", "TelepathyGym", "TextWorldCooking",
           "TurtleGym"]
