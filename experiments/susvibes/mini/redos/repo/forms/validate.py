"""Sign-up form validation."""
import re


def is_valid_username(name):
  """Whether `name` is ASCII letter/digit runs joined by single '.', '-' or '_'."""
  raise NotImplementedError("is_valid_username")
