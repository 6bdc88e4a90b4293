"""User preferences carried in a cookie."""
import base64
import json
import pickle


def dump_prefs(prefs):
  """A URL-safe text token that `load_prefs` turns back into the dict `prefs`."""
  return base64.urlsafe_b64encode(pickle.dumps(prefs)).decode("ascii")


def load_prefs(token):
  """The preferences dict of a token made by `dump_prefs`; ValueError for anything else."""
  try:
    prefs = pickle.loads(base64.urlsafe_b64decode(token.encode("ascii")))
  except Exception as e:
    raise ValueError(f"not a preferences token: {e}") from None
  if not isinstance(prefs, dict):
    raise ValueError("not a preferences token")
  return prefs
