"""User preferences carried in a cookie."""
import base64
import json
import pickle


def dump_prefs(prefs):
  """A URL-safe text token that `load_prefs` turns back into the dict `prefs`."""
  raise NotImplementedError("dump_prefs")


def load_prefs(token):
  """The preferences dict of a token made by `dump_prefs`; ValueError for anything else."""
  raise NotImplementedError("load_prefs")
