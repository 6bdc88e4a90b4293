"""Signatures of incoming webhook calls."""
import hashlib
import hmac


def sign(secret, body):
  return hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(secret, body, signature):
  """Whether `signature` is the hex HMAC-SHA256 of `body` under `secret`."""
  raise NotImplementedError("verify_signature")
