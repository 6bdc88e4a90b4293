"""Unpacking of uploaded plugin bundles (zip archives)."""
import os
import zipfile


def extract_bundle(zip_path, dest):
  """Extracts the files of zip archive `zip_path` into `dest`; returns their archive names, sorted."""
  names = []
  with zipfile.ZipFile(zip_path) as zf:
    for m in zf.infolist():
      if m.is_dir():
        continue
      target = os.path.join(dest, m.filename)
      os.makedirs(os.path.dirname(target), exist_ok=True)
      with open(target, "wb") as f:
        f.write(zf.read(m))
      names.append(m.filename)
  return sorted(names)
