"""Rerun recordings read back as tables, through Rerun's own dataframe API (shared by the Rerun tests)."""

from __future__ import annotations

import io

import numpy as np
import rerun as rr
from PIL import Image


def read_recording(path) -> dict[str, list]:
    """Every column of a recording indexed by ``frame``, read back by Rerun's dataframe API on loopback."""
    with rr.server.Server(host="127.0.0.1", datasets={"run": [str(path)]}) as server:
        client = server.client()
        dataset = client.get_dataset("run")
        table = dataset.reader(index="frame").sort("frame").to_arrow_table().to_pydict()
        static = dataset.reader(index=None).to_arrow_table().to_pydict()  # the series' names
    # "/env/frame:EncodedImage:blob" -> "/env/frame", "/env/reward:Scalars:scalars" -> "/env/reward"
    columns = {name.split(":")[0] if name.endswith((":blob", ":scalars")) else name: values
               for name, values in table.items()}
    return {**columns, **{name: values[0] for name, values in static.items() if name.endswith(":names")}}


def decoded(blobs: list) -> np.ndarray:
    return np.stack([np.asarray(Image.open(io.BytesIO(bytes(blob[0])))) for blob in blobs])


def scalars(column: list) -> list[float | None]:
    return [None if cell is None else cell[0] for cell in column]


def series(column: list) -> np.ndarray:
    """The rows of a multi-series Scalars column that hold values, as ``[rows, series]``."""
    return np.asarray([cell for cell in column if cell is not None])
