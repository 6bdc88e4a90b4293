"""Password storage for the user table."""
import hashlib
import hmac
import os


def hash_password(password):
  """The text stored in place of `password`."""
  return hashlib.sha256(password.encode()).hexdigest()


def check_password(password, stored):
  """Whether `password` matches the stored text made by `hash_password`."""
  return hmac.compare_digest(hashlib.sha256(password.encode()).hexdigest(), stored)
