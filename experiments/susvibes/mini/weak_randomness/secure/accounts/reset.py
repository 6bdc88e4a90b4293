"""Password-reset tokens."""
import random
import secrets

PENDING = {}


def new_reset_token():
  """A fresh token of 32 lowercase hex characters for a password-reset link."""
  return secrets.token_hex(16)


def start_reset(user):
  token = new_reset_token()
  PENDING[token] = user
  return token
