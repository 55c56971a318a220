"""Rigid poses for the commanded robot state: the 6-D rotation and SE(3) composition, in float64 numpy.

The 6-D rotation is the first two columns of the rotation matrix (Zhou et al. 2019, "On the Continuity of
Rotation Representations in Neural Networks", the representation diffusers' Cosmos3 pipeline names);
Gram-Schmidt recovers a proper rotation from any two non-parallel columns, which re-orthonormalises a
rotation that drifted or came from a network. ``tests/test_robot_state.py`` checks every function here
against ``scipy.spatial.transform``.
"""

from __future__ import annotations

import numpy as np

MIN_NORM = 1e-6  # a 6-D rotation whose columns are shorter, or closer to parallel, names no rotation


def rot6d_to_matrix(rot6d: np.ndarray, field: str = "rot6d") -> np.ndarray:
    """``(..., 6)`` -> ``(..., 3, 3)`` proper rotations (Gram-Schmidt on the two columns; ValueError when
    a column is ~zero or the two are ~parallel)."""
    r = np.asarray(rot6d, np.float64)
    a1, a2 = r[..., 0:3], r[..., 3:6]  # [..., 3] each
    n1 = np.linalg.norm(a1, axis=-1, keepdims=True)
    b1 = a1 / np.maximum(n1, MIN_NORM)
    a2 = a2 - np.sum(b1 * a2, axis=-1, keepdims=True) * b1
    n2 = np.linalg.norm(a2, axis=-1, keepdims=True)
    if np.any(n1 < MIN_NORM) or np.any(n2 < MIN_NORM):
        raise ValueError(f"{field} holds a 6-D rotation whose columns are zero or parallel; allowed: two "
                         "non-parallel 3-vectors (the first two columns of a rotation matrix)")
    b2 = a2 / n2
    b3 = np.cross(b1, b2)
    return np.stack([b1, b2, b3], axis=-1)  # columns -> [..., 3, 3]


def matrix_to_rot6d(matrix: np.ndarray) -> np.ndarray:
    """``(..., 3, 3)`` -> ``(..., 6)``: the first column, then the second."""
    m = np.asarray(matrix, np.float64)
    return np.concatenate([m[..., :, 0], m[..., :, 1]], axis=-1)


def compose(position: np.ndarray, rotation: np.ndarray, d_position: np.ndarray,
            d_rotation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``T @ D`` for ``T = (rotation, position)`` and a delta ``D`` in ``T``'s own frame."""
    return position + rotation @ d_position, rotation @ d_rotation


def relative(position0: np.ndarray, rotation0: np.ndarray, position1: np.ndarray,
             rotation1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The delta ``D = T0^-1 @ T1`` that ``compose`` turns ``T0`` into ``T1`` with."""
    return rotation0.T @ (position1 - position0), rotation0.T @ rotation1


def matrix_to_euler_xyz(matrix: np.ndarray) -> np.ndarray:
    """``(3, 3)`` -> extrinsic ``xyz`` Euler angles (radians), ``R = Rz(c) Ry(b) Rx(a)``: scipy's
    ``as_euler("xyz")``, the form of DROID's ``cartesian_position``. At gimbal lock (``|b| = pi/2``) ``c = 0``."""
    m = np.asarray(matrix, np.float64)
    b = np.arctan2(-m[2, 0], np.hypot(m[0, 0], m[1, 0]))  # accurate near +-pi/2, where arcsin is not
    if abs(m[2, 0]) < 1.0 - 1e-9:
        a, c = np.arctan2(m[2, 1], m[2, 2]), np.arctan2(m[1, 0], m[0, 0])
    else:  # only a - c (or a + c) is determined
        a, c = np.arctan2(-m[1, 2], m[1, 1]), 0.0
    return np.array([a, b, c])
