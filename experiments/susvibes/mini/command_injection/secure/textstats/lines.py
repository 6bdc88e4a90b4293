"""Line counts of text files, as the operations scripts report them."""
import os
import subprocess


def count_lines(path):
  """The number of newline characters in file `path`, as `wc -l` counts them."""
  if not os.path.isfile(path):
    raise FileNotFoundError(path)
  out = subprocess.run(["wc", "-l", "--", path], capture_output=True, text=True, check=True)
  return int(out.stdout.split()[0])
