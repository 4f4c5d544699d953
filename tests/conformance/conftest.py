"""Starts a real `cloudstack-sim` process for the conformance tests."""

import os
import queue
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "conformance-api-key"
SECRET_KEY = "conformance-secret-" + uuid.uuid4().hex


def debug_binary(name: str) -> Path:
    """A binary `cargo build --workspace --bins` made (honours CARGO_TARGET_DIR, as cargo does)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    return (target if target.is_absolute() else ROOT / target) / "debug" / name


def _sim_binary() -> Path:
    override = os.environ.get("CLOUDSTACK_SIM_BIN")
    path = Path(override) if override else debug_binary("cloudstack-sim")
    if not path.exists():
        pytest.fail(f"{path} not found: run `cargo build --workspace --bins` first (make test does)")
    return path


def start_sim(args, env=None):
    """Starts `cloudstack-sim` with `args` on a free port; yields its base URL, stops it after."""
    proc = subprocess.Popen(
        [str(_sim_binary()), "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env or dict(os.environ),
    )
    lines: "queue.Queue[str]" = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    base = None
    try:
        while base is None:
            line = lines.get(timeout=20)  # deadline: the simulator must announce itself
            if "listening on " in line:
                base = line.split("listening on ", 1)[1].strip()
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def sim():
    env = dict(os.environ, CLOUDSTACK_SIM_API_KEY=API_KEY, CLOUDSTACK_SIM_SECRET_KEY=SECRET_KEY)
    for base in start_sim([], env):
        yield {"base": base, "endpoint": base + "/client/api", "key": API_KEY, "secret": SECRET_KEY}


@pytest.fixture(scope="session")
def seed_sim():
    """cloudstack-sim with the seed scenario (accounts `admin` and the role-restricted `capi`)."""
    scenario = ROOT / "cloudstack-fixtures" / "scenarios" / "seed.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSTACK_SIM_")}
    for base in start_sim(["--scenario", str(scenario)], env):
        yield {"base": base, "endpoint": base + "/client/api", "scenario": scenario}
