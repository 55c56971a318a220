"""What a figure was measured on: CPU model, cores, torch threads, load; device name on CUDA."""

from __future__ import annotations

import os
import platform
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


_ISA = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


def _cpu_isa() -> list[str]:
    """The vector extensions that decide CPU matmul/conv speed (oneDNN picks kernels by them)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [isa for isa in _ISA if isa in flags]
    except OSError:
        pass
    return []


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def load_average() -> list[float] | None:
    """1/5/15-minute load: a load above the core count means the figures were taken on a busy box."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def describe_machine() -> dict[str, Any]:
    """A JSON-able description of this machine and the torch build."""
    import torch

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_isa": _cpu_isa(),
        "nproc": affinity,
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_start": load_average(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _torch_part(machine: dict[str, Any]) -> str:
    threads = machine.get("torch_threads", "?")
    return f"torch {machine.get('torch', '?')} ({threads} thread{'' if threads == 1 else 's'})"


def machine_line(machine: dict[str, Any], load: bool = True) -> str:
    """One line for a table caption (`load`: with the load average at the start)."""
    parts = [f"{machine.get('cpu', '?')}", f"{machine.get('nproc', '?')} cores",
             _torch_part(machine)]
    if machine.get("gpu"):
        parts.append(machine["gpu"])
    start, end = machine.get("load_average_start"), machine.get("load_average_end")
    if load and start:
        parts.append(f"load {start[0]:g} at start" + (f", {end[0]:g} at end" if end else ""))
    return ", ".join(parts)
