import os
import tempfile
import unittest

from textstats.lines import count_lines


class SecurityTest(unittest.TestCase):

  def test_file_names_are_not_shell_commands(self):
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, "a.txt")
      with open(path, "w") as f:
        f.write("x\n")
      marker = os.path.join(d, "pwned")
      for name in (f"{path}; touch {marker}", f"$(touch {marker})", f"{path} && touch {marker}"):
        try:
          count_lines(name)
        except Exception:
          pass
        self.assertFalse(os.path.exists(marker), name)


if __name__ == "__main__":
  unittest.main()
