"""``jarvis doctor`` and ``jarvis locate``: one screen of facts for a bug report, and the paths."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from openjarvis import __version__, paths
from openjarvis.cli import CONTEXT_SETTINGS, flag_overrides
from openjarvis.cli.output import emit_json, human_bytes
from openjarvis.config import load_config
from openjarvis.errors import JarvisError

#: CPU flags that decide which llama.cpp kernels run fast, in the order people look for them.
SIMD_FLAGS = (
    "sse3",
    "ssse3",
    "sse4_1",
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "neon",
    "asimd",
    "asimddp",
    "sve",
    "i8mm",
)


def cpu_facts() -> dict[str, Any]:
    import psutil

    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model") and value.strip():
                model = value.strip()
            elif key in ("flags", "Features"):
                flags |= set(value.split())
    elif sys.platform == "darwin":
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, check=False)
        model = out.stdout.strip() or model
        flags.add("neon")
    return {
        "model": model,
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(logical=True),
        "memory": human_bytes(psutil.virtual_memory().total),
        "simd": [f for f in SIMD_FLAGS if f in flags],
    }


def llama_facts() -> dict[str, Any]:
    if importlib.util.find_spec("llama_cpp") is None:
        return {"installed": False, "fix": "pip install llama-cpp-python==0.3.36"}
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    return {
        "installed": True,
        "version": llama_cpp.__version__,
        "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
        "mmap": bool(llama_cpp.llama_supports_mmap()),
        "system_info": " ".join(text.split()),
    }


def gpu_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"torch_extra": importlib.util.find_spec("torch") is not None}
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run(
            [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        facts["nvidia"] = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    elif sys.platform == "darwin" and platform.machine() == "arm64":
        facts["metal"] = "Apple silicon (Metal)"
    else:
        facts["gpu"] = "none found"
    return facts


def torch_backend_note() -> str:
    """Where ``engine.backend = "torch"`` will run, said before a slow first answer surprises."""
    from openjarvis.engine.torch import require_torch

    try:
        require_torch()
    except JarvisError as exc:
        return str(exc)
    import torch

    if torch.cuda.is_available():
        return f"CUDA on {torch.cuda.get_device_name()}, bfloat16"
    return ("no CUDA GPU: both models run on the CPU in float32, several times slower than "
            "llama.cpp (engine.backend = \"llama\")")


def model_facts(overrides: dict[str, str]) -> dict[str, Any]:
    from openjarvis.models import Catalog

    try:
        catalog = Catalog.load(load_config(overrides=overrides))
    except JarvisError as exc:
        return {"error": str(exc)}
    states = {True: "verified", False: "checksum mismatch", None: "installed, not verified yet"}
    out: dict[str, Any] = {"dir": str(catalog.models_dir), "models": {}}
    for m in sorted(catalog.models.values(), key=lambda m: m.id):
        st = catalog.status(m)
        out["models"][m.id] = states[st.verified] if st.installed else "not installed"
    try:
        pair = catalog.pair(load_config(overrides=overrides).models.pair or None)
        out["pair"] = f"{pair.id}: drafter {pair.drafter}, verifier {pair.verifier}"
    except JarvisError as exc:
        out["pair"] = str(exc)
    return out


def collect(overrides: dict[str, str]) -> dict[str, Any]:
    cfg_files: dict[str, Any]
    try:
        cfg = load_config(overrides=overrides)
        cfg_files = {"read": [str(f) for f in cfg.files], "threads": cfg.engine.threads,
                     "backend": cfg.engine.backend}
        if cfg.engine.drafter_backend != "same":
            cfg_files["drafter_backend"] = cfg.engine.drafter_backend
        if "torch" in (cfg.engine.backend, cfg.engine.drafter_backend):
            cfg_files["backend_note"] = torch_backend_note()
            cfg_files["deterministic"] = cfg.engine.deterministic
    except JarvisError as exc:
        cfg_files = {"error": str(exc)}
    sock = paths.socket_path()
    return {
        "openjarvis": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "os": platform.platform(),
        "cpu": cpu_facts(),
        "llama.cpp": llama_facts(),
        "gpu": gpu_facts(),
        "models": model_facts(overrides),
        "config": {"user_file": str(paths.user_config_file()), **cfg_files},
        "daemon": {"socket": str(sock), "running": sock.exists()},
    }


def _render(section: str, value: Any, indent: int = 0) -> None:
    pad = "  " * indent
    if isinstance(value, dict):
        click.echo(f"{pad}{section}:")
        for k, v in value.items():
            _render(k, v, indent + 1)
    elif isinstance(value, list):
        click.echo(f"{pad}{section}: {', '.join(map(str, value)) if value else '-'}")
    else:
        click.echo(f"{pad}{section}: {value}")


@click.command(context_settings=CONTEXT_SETTINGS, short_help="Print what a bug report needs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for a bug report or a script.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Print what a bug report needs: Python, OS, CPU, llama.cpp build, GPU, models, config, socket.

    \b
    Example:
      jarvis doctor --json > doctor.json
    """
    facts = collect(flag_overrides(ctx))
    if as_json:
        emit_json(facts)
        return
    for section, value in facts.items():
        _render(section, value)


@click.command(context_settings=CONTEXT_SETTINGS, short_help="Print where config, models, caches and the socket live.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def locate(as_json: bool) -> None:
    """Print where Open Jarvis keeps its configuration, models, caches, logs and socket.

    \b
    Example:
      ls "$(jarvis locate --json | python -c 'import json,sys; print(json.load(sys.stdin)["models"])')"
    """
    locs = {k: str(v) for k, v in dataclasses.asdict(paths.Locations.current()).items()}
    if as_json:
        emit_json(locs)
        return
    width = max(map(len, locs))
    for key, value in locs.items():
        click.echo(f"{key:<{width}}  {value}")
    if os.environ.get("XDG_RUNTIME_DIR") is None:
        click.echo("(XDG_RUNTIME_DIR is unset: the socket lives in a private 0700 temp folder)")
