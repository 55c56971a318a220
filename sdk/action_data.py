"""Raw action arrays for `worldstep stats`: from .npy/.npz files or a LeRobot dataset's parquet files.

The Cosmos3 pose convention (cosmos-framework's `pose_abs_to_rel`, `backward_framewise`, `rot6d`):
an arm's action at step t is the end-effector motion from t to t+1 expressed in its own frame at t,
`dT = T_t^-1 @ T_{t+1}`, written as nine numbers

    [dT[0,3], dT[1,3], dT[2,3],  dT[0,0], dT[1,0], dT[2,0],  dT[0,1], dT[1,1], dT[2,1]]

(the translation, then the first and second columns of the rotation), followed by the gripper
command as the dataset records it: 10 numbers for one arm (DROID, Bridge, fractal, UMI), 2 x 10 for
two. A standing arm is `[0, 0, 0, 1, 0, 0, 0, 1, 0, g]`. `relative_pose_actions` builds these rows
from absolute 4x4 poses; `worldstep stats` then computes q01/q99/mean/std/min/max per column.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def relative_pose_actions(poses: np.ndarray, gripper: np.ndarray | None = None) -> np.ndarray:
    """`[T, 4, 4]` absolute end-effector poses (+ optional `[T - 1]` gripper commands) -> `[T - 1, 9 or 10]`."""
    poses = np.asarray(poses, dtype=np.float64)
    if poses.ndim != 3 or poses.shape[1:] != (4, 4) or poses.shape[0] < 2:
        raise ValueError(f"poses shape {poses.shape} is invalid; allowed: [T, 4, 4] with T >= 2")
    if not np.all(np.isfinite(poses)):
        raise ValueError("poses contain NaN or inf; allowed: finite values")
    delta = np.linalg.inv(poses[:-1]) @ poses[1:]  # [T-1,4,4]: motion in the frame at t
    translation = delta[:, :3, 3]  # [T-1,3]
    rot6d = delta[:, :3, :2].transpose(0, 2, 1).reshape(-1, 6)  # [T-1,6]: column 0, then column 1
    rows = np.concatenate([translation, rot6d], axis=1)
    if gripper is None:
        return rows.astype(np.float32)
    gripper = np.asarray(gripper, dtype=np.float64).reshape(-1)
    if gripper.shape[0] != rows.shape[0]:
        raise ValueError(f"gripper has {gripper.shape[0]} values; allowed: one per step, {rows.shape[0]}")
    return np.concatenate([rows, gripper[:, None]], axis=1).astype(np.float32)


def load_array_actions(path: str | os.PathLike, key: str | None = None) -> np.ndarray:
    """Action rows `[N, D]` from a .npy file, or from one array of a .npz (`key`, else `actions`/`action`,
    else its only array). Arrays of `[episodes, T, D]` are flattened to rows."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"action file {path} does not exist")
    if path.suffix == ".npy":
        array = np.load(path, allow_pickle=False)
    elif path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            names = list(archive.files)
            if key is None:
                key = next((k for k in ("actions", "action") if k in names), names[0] if len(names) == 1 else None)
            if key not in names:
                raise ValueError(f"{path}: key={key!r} is not in the archive; allowed: {names}")
            array = archive[key]
    else:
        raise ValueError(f"{path}: suffix {path.suffix!r} is not supported; allowed: .npy, .npz, a parquet file "
                         "or a LeRobot dataset folder")
    return _rows(array, str(path))


def load_lerobot_actions(root: str | os.PathLike, column: str = "action") -> tuple[np.ndarray, dict]:
    """Action rows `[N, D]` of a LeRobot dataset (every `data/**/*.parquet`, or one parquet file) and
    what its `meta/info.json` says about the column (`fps`, `names`)."""
    try:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading parquet needs pyarrow: pip install 'worldstep[lerobot]'") from None
    root = Path(root)
    files = [root] if root.is_file() else sorted((root / "data").rglob("*.parquet")) or sorted(root.rglob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no parquet files under {root} (a LeRobot dataset keeps them in data/)")
    chunks = []
    for file in files:
        schema = pq.read_schema(file)
        if column not in schema.names:
            raise ValueError(f"{file}: column={column!r} is missing; allowed: {schema.names}")
        values = pq.read_table(file, columns=[column]).column(column).combine_chunks()
        if _is_list(values.type):
            lengths = np.unique(pc.list_value_length(values).to_numpy(zero_copy_only=False))
            if lengths.size != 1:
                raise ValueError(f"{file}: column {column!r} has rows of widths {lengths.tolist()}; allowed: one")
            flat = values.flatten().to_numpy(zero_copy_only=False)
            chunks.append(flat.reshape(len(values), int(lengths[0])))
        else:
            chunks.append(values.to_numpy(zero_copy_only=False).reshape(-1, 1))
    rows = _rows(np.concatenate(chunks), str(root))
    return rows, _lerobot_meta(root, column, len(files))


def _is_list(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_large_list(kind)


def _lerobot_meta(root: Path, column: str, num_files: int) -> dict:
    meta: dict = {"source": str(root), "column": column, "files": num_files}
    info_path = root / "meta" / "info.json"
    if root.is_dir() and info_path.is_file():
        info = json.loads(info_path.read_text())
        if "fps" in info:
            meta["fps"] = info["fps"]
        names = info.get("features", {}).get(column, {}).get("names")
        if names is not None:
            meta["names"] = names
    return meta


def _rows(array: np.ndarray, where: str) -> np.ndarray:
    if array.dtype.kind not in "fiu" or array.dtype == np.bool_:
        raise ValueError(f"{where}: actions dtype {array.dtype} is invalid; allowed: numbers")
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim < 2:
        raise ValueError(f"{where}: actions shape {array.shape} is invalid; allowed: [N, D] or [..., D]")
    return array.reshape(-1, array.shape[-1])
