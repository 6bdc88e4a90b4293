"""Unpacking of uploaded plugin bundles (zip archives)."""
import os
import zipfile


def extract_bundle(zip_path, dest):
  """Extracts the files of zip archive `zip_path` into `dest`; returns their archive names, sorted."""
  raise NotImplementedError("extract_bundle")
