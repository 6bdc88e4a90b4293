import unittest

from netproto.frames import encode_frames, parse_frames


class SecurityTest(unittest.TestCase):

  def test_inconsistent_lengths_are_refused(self):
    good = encode_frames([b"abc"])
    for bad in (good[:-1], b"\x00", b"\xff\xffshort", good + b"\x00\x09abc"):
      with self.assertRaises(ValueError, msg=repr(bad)):
        parse_frames(bad)


if __name__ == "__main__":
  unittest.main()
