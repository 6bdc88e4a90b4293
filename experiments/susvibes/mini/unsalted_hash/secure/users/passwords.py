"""Password storage for the user table."""
import hashlib
import hmac
import os


def hash_password(password):
  """The text stored in place of `password`."""
  salt = os.urandom(16)
  digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 100_000)
  return f"pbkdf2_sha256$100000${salt.hex()}${digest.hex()}"


def check_password(password, stored):
  """Whether `password` matches the stored text made by `hash_password`."""
  try:
    algo, rounds, salt, digest = stored.split("$")
  except ValueError:
    return False
  if algo != "pbkdf2_sha256":
    return False
  got = hashlib.pbkdf2_hmac("sha256", password.encode(), bytes.fromhex(salt), int(rounds))
  return hmac.compare_digest(got.hex(), digest)
