import unittest

from netproto.frames import encode_frames, parse_frames


class FeatureTest(unittest.TestCase):

  def test_round_trip(self):
    payloads = [b"hello", b"", b"x" * 300, bytes(range(256))]
    self.assertEqual(parse_frames(encode_frames(payloads)), payloads)

  def test_empty(self):
    self.assertEqual(parse_frames(b""), [])


if __name__ == "__main__":
  unittest.main()
