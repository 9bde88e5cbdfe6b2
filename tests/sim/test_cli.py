"""`regen sim` as a process: prints its address, binds loopback, reads a TOML config."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

SIM_TOML = """
seed = 3
time_scale = 0
credits_usd = 1.5

[[models]]
id = "acme/tiny"
family = "qwen3"

[[models.endpoints]]
provider_name = "Acme"
tag = "acme/bf16"
quantization = "bf16"
completion_price = 1e-6
"""


def test_sim_serves_its_config_on_loopback(tmp_path: Path) -> None:
    cfg = tmp_path / "sim.toml"
    cfg.write_text(SIM_TOML)
    proc = subprocess.Popen(
        [sys.executable, "-m", "regen", "sim", "--port", "0", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("regen sim listening on http://127.0.0.1:")
        base = line.rsplit(" ", 1)[1].strip()
        req = urllib.request.Request(
            f"{base}/chat/completions",
            data=json.dumps(
                {
                    "model": "acme/tiny",
                    "max_tokens": 64,
                    "messages": [{"role": "user", "content": "hi"}],
                }
            ).encode(),
            headers={"Authorization": "Bearer k", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            data = json.loads(r.read())
        assert data["provider"] == "Acme" and data["model"] == "acme/tiny"
        key = urllib.request.Request(f"{base}/key", headers={"Authorization": "Bearer k"})
        with urllib.request.urlopen(key, timeout=10) as r:
            assert json.loads(r.read())["data"]["limit"] == 1.5
    finally:
        proc.terminate()
        proc.communicate(timeout=10)  # also closes the pipes


def sim_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`regen sim ARGS` that is expected to stop at once."""
    return subprocess.run(
        [sys.executable, "-m", "regen", "sim", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_bad_sim_config_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "sim.toml"
    cfg.write_text("seed = 1\n[faults]\nresets = 0.5\n")
    proc = sim_cli("--config", str(cfg))
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: ")
    assert "unknown field 'faults.resets'" in proc.stderr and "\n" not in proc.stderr.strip()


def test_a_busy_port_is_one_line(tmp_path: Path) -> None:
    """It was a 29-line traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = sim_cli("--port", str(port))
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot listen on 127.0.0.1:{port}: ")
    assert line.endswith("pick another --port (or stop what uses it)")


def test_a_self_hosted_sim_of_an_unknown_model_is_one_line() -> None:
    proc = sim_cli("--dialect", "vllm", "--served-model-name", "x/y")
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: --served-model-name x/y: the sim has no such model (known: ")
