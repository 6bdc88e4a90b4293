"""GiG's LLM agents (experiments/gig/README.md): an LLM planner choosing among lettered valid actions, the worlds it
plays (the kitchen of `experiments.gig.cooking`, TextWorld cooking games of `experiments.gig.textworld`) and one episode
of each method: the LLM alone, the LLM over the lookahead's allowed actions, and GiG (memory retrieval, loop
guard, lookahead, then the LLM).
"""
from __future__ import annotations

import string
from typing import Sequence

import jax
import jax.numpy as jnp
import jraph
import numpy as np

from experiments._shared.chat_models import chat_ids
from experiments.gig.planner import THRESHOLD, LoopDetector, Memory, Option, lookahead, state_key
from experiments.gig import cooking
from experiments.gig import textworld
from jaxlab.models import gnn
from jaxlab.models import transformer as tfm

LABELS = string.ascii_uppercase
METHODS = ("llm", "llm_lookahead", "gig", "planner")


def choice_fn(mcfg: tfm.Config, label_ids: Sequence[int]):
  """`ChoiceLLM`'s jitted forward: (params, tokens [1, W], mask [1, W], last) -> the label tokens' logits at `last`."""
  labels = jnp.asarray(label_ids, jnp.int32)
  return jax.jit(lambda p, t, m, last: tfm.forward(p, t, mcfg, attention_mask_BT=m).logits[0, last, labels])


def likelihood_fn(mcfg: tfm.Config):
  """`LikelihoodLLM`'s jitted scorer: (params, prompt [1, W], mask [1, W], options [B, L], their mask) -> [B] mean
  token log-probabilities."""
  return jax.jit(lambda p, t, m, o, om: LikelihoodLLM._scores(p, t, m, o, om, mcfg))


class ChoiceLLM:
  """The LLM planner's decision: one forward over the chat prompt (task, state, notes, the actions lettered A, B,
  ...) and the action whose letter has the highest next-token logit. `calls` and `tokens` (prompt tokens) add up.
  Called as `llm(prompt, options)`; returns the chosen index."""

  def __init__(self, mcfg: tfm.Config, params, tok, bucket: int = 64):
    ids = [tok.encode(c) for c in LABELS]
    if any(len(i) != 1 for i in ids):
      raise ValueError(f"ChoiceLLM: the tokenizer must encode each letter of {LABELS} as one token")
    self.params, self.tok, self.bucket, self.calls, self.tokens = params, tok, bucket, 0, 0
    self.fn = choice_fn(mcfg, [i[0] for i in ids])

  def __call__(self, text: str, options: Sequence[str]) -> int:
    ids = chat_ids(self.tok, text)
    toks = np.zeros((1, gnn.round_up(len(ids), self.bucket)), np.int32)
    mask = np.zeros_like(toks)
    toks[0, :len(ids)], mask[0, :len(ids)] = ids, 1
    self.calls, self.tokens = self.calls + 1, self.tokens + len(ids)
    return int(np.argmax(np.asarray(self.fn(self.params, toks, mask, len(ids) - 1))[:len(options)]))


class LikelihoodLLM:
  """The LLM planner's decision by scoring: each action's text as the assistant's reply to the chat prompt, by its
  mean token log-probability; the prompt is prefilled once and its KV cache shared by every action. `calls` and
  `tokens` (prompt plus action tokens) add up. Called as `llm(prompt, options)`; returns the chosen index."""

  def __init__(self, mcfg: tfm.Config, params, tok, bucket: int = 64):
    self.params, self.tok, self.bucket, self.calls, self.tokens = params, tok, bucket, 0, 0
    self.fn = likelihood_fn(mcfg)

  @staticmethod
  def _scores(params, toks_1W, mask_1W, opt_BL, opt_mask_BL, mcfg):
    b, n = opt_BL.shape
    cache = tfm.init_cache(mcfg, 1, toks_1W.shape[1] + n)
    out = tfm.forward(params, toks_1W, mcfg, attention_mask_BT=mask_1W, cache=cache)
    first_V = jax.nn.log_softmax(out.logits[0, -1].astype(jnp.float32))
    tiled = {"k": jnp.repeat(out.cache["k"], b, 1), "v": jnp.repeat(out.cache["v"], b, 1),
             "pos": jnp.repeat(out.cache["pos"], b, 0), "index": out.cache["index"]}
    logp_BLV = jax.nn.log_softmax(tfm.forward(params, opt_BL, mcfg, attention_mask_BT=opt_mask_BL,
                                              cache=tiled).logits.astype(jnp.float32), -1)
    rest_BL = jnp.take_along_axis(logp_BLV[:, :-1], opt_BL[:, 1:, None], -1)[..., 0]
    tok_BL = jnp.concatenate([first_V[opt_BL[:, :1]], rest_BL], axis=1) * opt_mask_BL
    return tok_BL.sum(1) / jnp.maximum(opt_mask_BL.sum(1), 1)

  def scores(self, text: str, options: Sequence[str]) -> np.ndarray:
    """Mean token log-probability of each option's text after the chat prompt of `text`."""
    ids = chat_ids(self.tok, text)
    width = gnn.round_up(len(ids), self.bucket)
    toks, mask = np.zeros((1, width), np.int32), np.zeros((1, width), np.int32)
    toks[0, width - len(ids):], mask[0, width - len(ids):] = ids, 1  # left-padded: the last position is real
    opts = [self.tok.encode(o) for o in options]
    length = gnn.round_up(max(len(o) for o in opts), 8)
    o_toks = np.zeros((gnn.round_up(len(opts), 8), length), np.int32)
    o_mask = np.zeros_like(o_toks)
    for i, o in enumerate(opts):
      o_toks[i, :len(o)], o_mask[i, :len(o)] = o, 1
    self.calls, self.tokens = self.calls + 1, self.tokens + len(ids) + sum(len(o) for o in opts)
    return np.asarray(self.fn(self.params, toks, mask, o_toks, o_mask))[:len(opts)]

  def __call__(self, text: str, options: Sequence[str]) -> int:
    return int(np.argmax(self.scores(text, options)))


def decision_prompt(task: str, state_text: str, options: Sequence[str], notes: Sequence[str] = ()) -> str:
  """The planner's prompt: the task, the state in words, notes (recent actions, loop warning, ruled-out
  actions), the lettered valid actions."""
  lines = [task, "", state_text, *notes, "Valid actions:", *(f"{LABELS[i]}. {o}" for i, o in enumerate(options)),
           "Reply with the letter of the best next action."]
  return "\n".join(lines)


class Kitchen:
  """A kitchen problem as the agents see it: states are `cooking.State`s, stepped by the symbolic transitions."""

  def __init__(self, problem: cooking.Problem):
    self.problem = problem
    self.task = cooking.task_text(problem).split(" Act with")[0]

  def reset(self):
    return self.problem.init

  def actions(self, state) -> list[str]:
    return [a.text for a in cooking.valid_actions(self.problem, state)]

  def lookahead(self, state, depth: int) -> list[Option]:
    return lookahead(self.problem, state, depth)

  def step(self, state, action: str):
    return cooking.step(self.problem, state, cooking.parse_action(self.problem, state, action))

  def success(self, state) -> bool:
    return cooking.success(self.problem, state)

  def failed(self, state) -> bool:
    return False

  def key(self, state):
    return state_key(self.problem, state)

  def graph(self, state) -> jraph.GraphsTuple:
    return cooking.scene_graph(self.problem, state)

  def describe(self, state) -> str:
    return cooking.describe(self.problem, state)

  def project(self, state, action: str) -> str:
    """The one-step projection T(s, a) in words: the lines of the state's description that `action` changes."""
    before = self.describe(state).split("\n")
    after = self.describe(self.step(state, action)).split("\n")
    return "; ".join(b.rstrip(".") for a, b in zip(before, after) if a != b) or "no change"


class TextGame:
  """A TextWorld cooking game as the agents see it: the state is the env itself (stepped in place); lookahead is
  one action deep on the game's logic (an action that loses the game is ruled out, one that wins is marked)."""

  def __init__(self, env: textworld.TextWorldCooking, seed: int):
    self.env, self.seed = env, seed

  def reset(self):
    self.env.reset(self.seed)
    self.task = self.env.task().split(" Act with")[0]
    return self.env

  def actions(self, state) -> list[str]:
    return state.valid_actions()

  def lookahead(self, state, depth: int) -> list[Option]:
    del depth  # one action deep: the game's logic engine is too slow to copy for more
    out = state.outcomes()
    return [Option(a, "it loses the game" if out[a] == "lost" else None, 1 if out[a] == "won" else None)
            for a in state.valid_actions()]

  def step(self, state, action: str):
    state.step(action)
    return state

  def success(self, state) -> bool:
    return bool(state.state["won"])

  def failed(self, state) -> bool:
    return bool(state.state["lost"])

  def key(self, state):
    return textworld.key(state.facts)

  def graph(self, state) -> jraph.GraphsTuple:
    return textworld.scene_graph(state.facts)

  def describe(self, state) -> str:
    return textworld.describe(state.facts)

  def project(self, state, action: str) -> str:
    """No projection: the game's engine is too slow to copy per action (the lookahead marks wins and losses)."""
    del state, action
    return ""


RETRIEVALS = ("prompt", "execute")


def play_agent(world, method: str, llm, *, depth: int, max_steps: int, memory: Memory | None = None, embed=None,
               gparams=None, threshold: float = THRESHOLD, retrieval: str = "prompt") -> dict:
  """One episode of `method` in `world` (a Kitchen or a TextGame): "llm" chooses among all valid actions;
  "llm_lookahead" among those the lookahead does not rule out, each shown with its one-step projection
  ("action -> what changes", `world.project`) and annotated with the actions to the goal when within the depth
  (one left is taken without a call); "gig" as llm_lookahead, and a state whose nearest remembered state is within
  `threshold` puts the remembered action into the prompt (`retrieval="prompt"`, the paper's; the step counts as
  "memory" when the LLM takes it) or takes it without a call (`retrieval="execute"`, an ablation); a revisited state
  adds the loop warning to the prompt and offers only the actions not yet tried from it (while any are left).
  Returns the outcome, the counts, and the scene graphs and actions of the episode."""
  if method not in METHODS[:3]:
    raise ValueError(f"play_agent: method must be one of {METHODS[:3]}, found {method!r}")
  if retrieval not in RETRIEVALS:
    raise ValueError(f"play_agent: retrieval must be one of {RETRIEVALS}, found {retrieval!r}")
  state = world.reset()
  graphs, actions, sources, loops = [world.graph(state)], [], [], LoopDetector()
  calls, tokens = llm.calls, llm.tokens
  for t in range(max_steps):
    if world.success(state) or world.failed(state):
      break
    notes = [f"Your last actions: {'; '.join(actions[-3:])}."] if actions else []
    chosen, suggested = None, None
    if method == "llm":
      options = labelled = world.actions(state)
    else:
      opts = world.lookahead(state, depth)
      allowed = [o for o in opts if o.rejected is None]
      options = [o.action for o in allowed]
      labelled = [o.action + (f" -> {proj}" if (proj := world.project(state, o.action)) else "")
                  + (f" (reaches the goal in {o.goal_in} actions)" if o.goal_in else "") for o in allowed]
      if method == "gig":
        key = world.key(state)
        warning = loops.visit(key, t)
        hit = memory.retrieve(embed(gparams, graphs[-1:])[0], threshold)
        if hit is not None and warning is None and hit.action in options:
          if retrieval == "execute":
            chosen, source = hit.action, "memory"
          else:
            suggested = hit.action
            notes.append(f"Memory: in a similar state of a task solved before, the next action was: {hit.action}.")
        if warning:  # the loop guard: a revisited state offers the actions not yet tried from it, if any
          fresh = set(loops.untried(key, options)) or set(options)
          options, labelled = map(list, zip(*[(o, l) for o, l in zip(options, labelled) if o in fresh]))
          notes.append(warning)
      notes += [f"Ruled out: {o.action} ({o.rejected})." for o in opts if o.rejected]
    if not options:
      break
    if chosen is None and len(options) == 1 and method != "llm":
      chosen, source = options[0], "memory" if options[0] == suggested else "only"
    if chosen is None:
      n = min(len(options), len(LABELS))
      prompt = decision_prompt(world.task, world.describe(state), labelled[:n], notes)
      chosen = options[llm(prompt, options[:n])]
      source = "memory" if chosen == suggested else "llm"
    if method == "gig":
      loops.took(key, chosen)
    sources.append(source)
    actions.append(chosen)
    state = world.step(state, chosen)
    graphs.append(world.graph(state))
  return {"success": world.success(state), "steps": len(actions), "calls": llm.calls - calls,
          "tokens": llm.tokens - tokens, "memory_share": float(np.mean([s == "memory" for s in sources])) if sources
          else 0.0, "graphs": graphs, "actions": actions}
