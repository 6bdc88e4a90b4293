"""Training: train state, step, loop, checkpointing (the one orbax wrapper), metrics and progress."""
from jaxlab.train import metrics, schedules
from jaxlab.train.checkpoint import Checkpointer
from jaxlab.train.loop import LoopResult, NonFiniteError, evaluate, train_loop
from jaxlab.train.state import (TrainState, abstract_state, as_train_state, create, init_state, place,
                                state_shardings)
from jaxlab.train.step import jit_train_step, lm_loss_fn, make_eval_step, make_train_step, next_token_nll
