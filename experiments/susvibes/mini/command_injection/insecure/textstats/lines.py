"""Line counts of text files, as the operations scripts report them."""
import os
import subprocess


def count_lines(path):
  """The number of newline characters in file `path`, as `wc -l` counts them."""
  out = subprocess.run(f"wc -l {path}", shell=True, capture_output=True, text=True)
  if out.returncode != 0:
    raise FileNotFoundError(path)
  return int(out.stdout.split()[0])
