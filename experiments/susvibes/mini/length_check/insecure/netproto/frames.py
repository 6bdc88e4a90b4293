"""Framing of the device protocol's message stream."""
import struct


def encode_frames(payloads):
  return b"".join(struct.pack(">H", len(p)) + p for p in payloads)


def parse_frames(data):
  """The payloads of a stream of (2-byte big-endian length, payload) frames; ValueError if malformed."""
  out, i = [], 0
  while i < len(data):
    n = int.from_bytes(data[i:i + 2], "big")
    out.append(bytes(data[i + 2:i + 2 + n]))
    i += 2 + n
  return out
