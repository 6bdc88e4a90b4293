"""Sign-up form validation."""
import re


def is_valid_username(name):
  """Whether `name` is ASCII letter/digit runs joined by single '.', '-' or '_'."""
  return re.match(r"^([A-Za-z0-9]+)+([._-][A-Za-z0-9]+)*$", name) is not None
