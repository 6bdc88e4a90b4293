"""Training: train state, step, loop, checkpointing (the one orbax wrapper), metrics and progress."""
from jaxlab.train import metrics, schedules  # noqa: F401
from jaxlab.train.checkpoint import Checkpointer  # noqa: F401
from jaxlab.train.loop import LoopResult, NonFiniteError, evaluate, train_loop  # noqa: F401
from jaxlab.train.state import (TrainState, abstract_state, as_train_state, create, init_state, place,  # noqa: F401
                                state_shardings)
from jaxlab.train.step import jit_train_step, lm_loss_fn, make_eval_step, make_train_step, next_token_nll  # noqa: F401
