"""Framing of the device protocol's message stream."""
import struct


def encode_frames(payloads):
  return b"".join(struct.pack(">H", len(p)) + p for p in payloads)


def parse_frames(data):
  """The payloads of a stream of (2-byte big-endian length, payload) frames; ValueError if malformed."""
  out, i = [], 0
  while i < len(data):
    if i + 2 > len(data):
      raise ValueError(f"truncated frame header at byte {i}")
    (n,) = struct.unpack_from(">H", data, i)
    if i + 2 + n > len(data):
      raise ValueError(f"frame at byte {i} declares {n} bytes, {len(data) - i - 2} remain")
    out.append(bytes(data[i + 2:i + 2 + n]))
    i += 2 + n
  return out
