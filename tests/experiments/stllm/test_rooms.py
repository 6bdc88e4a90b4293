"""experiments.stllm.rooms: the camera and rasterizer against hand-computed projections, mesh points from
pybullet_data, rooms and clips; and experiments.stllm.overlap's BLEU / ROUGE-L against hand computations."""
import math

import numpy as np
import pytest

from experiments.stllm import rooms as R
from experiments.stllm import overlap

CFG = R.RoomConfig(image_size=32)


def test_camera_facing_plus_x_projects_a_known_point_to_its_pixel():
  # eye at (1, 2, 1.4) facing +x, no pitch: camera x (right) = -y world, y (down) = -z, z (forward) = +x
  cfg = R.RoomConfig(image_size=32, pitch_deg=0.0, fov_deg=90.0)
  c2w, k = R.camera(np.array([1.0, 2.0, 0.0]), cfg)
  np.testing.assert_allclose(c2w[:3, :3], [[0, 0, 1], [-1, 0, 0], [0, -1, 0]], atol=1e-12)
  assert k[0, 0] == pytest.approx(16.0) and k[0, 2] == 16.0  # f = 16 / tan(45 deg)
  # 2 m ahead, 0.5 m to the right (y - 0.5), 0.25 m below the eye: u = 16 + 16 * 0.5 / 2, v = 16 + 16 * 0.25 / 2
  p = np.array([[3.0, 1.5, 1.15]])
  uv, z = R.project(p, c2w, k)
  np.testing.assert_allclose(uv[0], [20.0, 18.0], atol=1e-9)
  assert z[0] == pytest.approx(2.0)
  img = R.rasterize(p, np.array([[1.0, 0.0, 0.0]]), c2w, k, 32, splat=0.0)  # splat 0: one pixel per point
  assert (np.argwhere(np.all(img == [1, 0, 0], -1)) == [[18, 20]]).all()
  assert np.all(img[30, 5] == np.float32(R.FLOOR)) and np.all(img[2, 5] == np.float32(R.WALL))


def test_nearest_point_wins_and_points_behind_are_dropped():
  cfg = R.RoomConfig(image_size=16, pitch_deg=0.0)
  c2w, k = R.camera(np.array([0.0, 0.0, 0.0]), cfg)
  pts = np.array([[2.0, 0.0, 1.4], [1.0, 0.0, 1.4], [-1.0, 0.0, 1.4]])
  cols = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
  img = R.rasterize(pts, cols, c2w, k, 16, splat=0.0)
  assert np.all(img[8, 8] == [0, 1, 0])  # the nearer (green) point hides the red one behind it
  assert not np.any(np.all(img == [0, 0, 1], -1))  # the blue point is behind the camera
  assert R.rasterize(pts[:1], cols[:1], c2w, k, 16, splat=2.0)[7:10, 7:10].reshape(-1, 3).tolist() == [[1, 0, 0]] * 9


def test_mesh_points_are_pybullet_meshes_in_the_unit_box():
  for name, (mesh, up, _, _) in {**R.FURNITURE, **R.OBJECTS}.items():
    p = R.unit_points(mesh, up, 64)
    assert p.shape == (64, 3), name
    np.testing.assert_allclose(p.min(0), [-0.5, -0.5, 0.0], atol=1e-5)
    np.testing.assert_allclose(p.max(0), [0.5, 0.5, 1.0], atol=1e-5)


def test_rooms_clips_and_point_clouds():
  rng = np.random.default_rng(0)
  for _ in range(20):
    room = R.generate_room(CFG, rng)
    names = [f.name for f in room.furniture]
    assert len(set(names)) == CFG.n_furniture and {o.on for o in room.objects} <= set(names)
    assert len({o.on for o in room.objects}) == CFG.n_objects  # one object per piece
    src = {o.name: o.on for o in room.objects}[room.item]
    assert room.source == src and (room.target == src) == (room.action != "move")
    stand = R.stand_pose({f.name: f for f in room.furniture}[room.target], CFG)
    np.testing.assert_allclose(room.poses[-1][:2], stand[:2])
    if room.action != "pick":
      assert room.poses[-1][2] == stand[2]
    else:  # turned toward the centre
      to_centre = np.array([CFG.size / 2, CFG.size / 2]) - stand[:2]
      assert np.dot(to_centre, [np.cos(room.poses[-1][2]), np.sin(room.poses[-1][2])]) == pytest.approx(
          np.linalg.norm(to_centre))
    xyz, rgb = R.point_cloud(room, CFG)
    assert xyz.shape == rgb.shape == (CFG.n_points, 3)
    assert xyz[:, :2].min() > -0.1 and xyz[:, :2].max() < CFG.size + 0.1 and xyz[:, 2].min() >= -1e-5
    frames, c2w, k = R.render_clip(room, CFG)
    assert frames.shape == (CFG.n_frames, 32, 32, 3) and c2w.shape == (CFG.n_frames, 4, 4)
    item_col = np.float32(R.OBJECTS[room.item][3])
    held = [np.all(f == item_col, -1).sum() for f in frames]
    # in the hand the item is near the eye, larger than anywhere on the furniture
    assert all(h > 0 for h, is_held in zip(held, room.held) if is_held)
    end = R.final_item(room, CFG)
    assert (end is None) == (room.action == "pick")


def test_bleu_and_rouge_l_by_hand():
  cand, ref = "the cat sat on the mat".split(), "the cat is on the mat".split()
  # unigrams 5/6, bigrams 3/5 (the cat, on the, the mat), trigrams 1/4 (on the mat), 4-grams 0/3 -> BLEU 0
  assert overlap.corpus_bleu([cand], [ref]) == 0.0
  assert overlap.corpus_bleu([cand], [ref], max_n=3) == pytest.approx((5 / 6 * 3 / 5 * 1 / 4) ** (1 / 3))
  assert overlap.corpus_bleu([ref], [ref]) == pytest.approx(1.0)
  # shorter candidate: brevity penalty exp(1 - 6 / 4) on perfect precisions
  assert overlap.corpus_bleu([ref[:4]], [ref]) == pytest.approx(math.exp(1 - 6 / 4))
  # corpus level: n-gram counts add over pairs; clipping: "the the the" matches "the" at most twice
  two = overlap.corpus_bleu([cand, ref], [ref, ref], max_n=2)
  assert two == pytest.approx(((5 + 6) / 12 * (3 + 5) / 10) ** 0.5)
  assert overlap.corpus_bleu(["the the the".split()], [ref], max_n=1) == pytest.approx(2 / 3 * math.exp(1 - 6 / 3))
  assert overlap.rouge_l([cand], [ref]) == pytest.approx(5 / 6)  # LCS: the cat on the mat
  assert overlap.rouge_l([cand, ["x"]], [ref, ["y"]]) == pytest.approx(5 / 12)
  p, r = 2 / 3, 2 / 4
  assert overlap.rouge_l([["a", "b", "c"]], [["a", "x", "c", "y"]]) == pytest.approx(2 * p * r / (p + r))
