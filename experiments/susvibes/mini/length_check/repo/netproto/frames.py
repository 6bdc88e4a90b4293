"""Framing of the device protocol's message stream."""
import struct


def encode_frames(payloads):
  return b"".join(struct.pack(">H", len(p)) + p for p in payloads)


def parse_frames(data):
  """The payloads of a stream of (2-byte big-endian length, payload) frames; ValueError if malformed."""
  raise NotImplementedError("parse_frames")
