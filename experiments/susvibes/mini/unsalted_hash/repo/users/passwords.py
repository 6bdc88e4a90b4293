"""Password storage for the user table."""
import hashlib
import hmac
import os


def hash_password(password):
  """The text stored in place of `password`."""
  raise NotImplementedError("hash_password")


def check_password(password, stored):
  """Whether `password` matches the stored text made by `hash_password`."""
  raise NotImplementedError("check_password")
