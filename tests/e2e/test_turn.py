"""Calls through a real TURN relay: Debian's coturn, with docs/DEPLOY.md's configuration, between a
client and a server that cannot reach each other.

The test makes its own network namespaces (``tests/e2e/netns.py``): the server's and the client's
reach only the relay's, where coturn listens on ``10.0.0.1`` (and a TCP forwarder carries the
client's HTTP to the server, as a public front end would). ``omni-rtc call`` runs in the client's
namespace: it fetches the server's ICE servers (``GET /v1/realtime/ice_servers``, credentials
included), so the only path for the media is through coturn. Each call must connect through the
relay (the selected candidate pair has a ``relay`` side) and complete a spoken turn, with coturn's
time-limited REST credentials (``--ice-auth-secret``) and with static ones; with a wrong secret the
client fails saying the TURN server gave no relay candidate, and hangs up: the server's slot is
released at once (ended as ``hangup``, not at its 30 s connect timeout).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import DISCONNECT_TIMEOUT_S, GENERATION
from tests.e2e.deploy_doc import deploy_block
from tests.e2e.netns import RELAY_ADDRESS, SERVER_ADDRESS, Sandbox, sandbox
from tests.e2e.processes import SHUTDOWN_DEADLINE_S, STARTUP_DEADLINE_S, stop_all

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
HELLO = REPO_ROOT / "tests" / "fixtures" / "hello.wav"
TURNSERVER = "/usr/bin/turnserver"
API_KEY = "sk-turn-test"
TURN_SECRET = "the-shared-turn-secret"
STATIC_USER, STATIC_PASSWORD = "omni", "static-turn-password"
# One coturn per kind of credential (coturn's REST secret turns its static users off), each with
# its own relay ports; one server per kind, each on its own HTTP port, forwarded on the relay.
KINDS = {
    "secret": {"turn_port": 3478, "relay_ports": (49152, 49999), "http_port": 8002},
    "static": {"turn_port": 3479, "relay_ports": (50000, 50999), "http_port": 8001},
}
CALL_TIMEOUT_S = 180.0
# A call that cannot connect is given this long before the client gives up (its own --timeout).
FAILING_CALL_TIMEOUT_S = 5


@dataclass
class Turn:
    """One coturn in the relay namespace; ``restart`` brings it back with another secret."""

    box: Sandbox
    kind: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, secret: str = TURN_SECRET) -> None:
        ports = KINDS[self.kind]
        low, high = ports["relay_ports"]
        replacements = {
            "listening-port=3478": f"listening-port={ports['turn_port']}",
            "listening-ip=203.0.113.10": f"listening-ip={RELAY_ADDRESS}",
            "relay-ip=203.0.113.10": f"relay-ip={RELAY_ADDRESS}",
            "min-port=49152": f"min-port={low}",
            "max-port=65535": f"max-port={high}",
            "allowed-peer-ip=10.0.0.5": f"allowed-peer-ip={SERVER_ADDRESS}",
            "static-auth-secret=replace-with-the-turn-secret": f"static-auth-secret={secret}",
        }
        if self.kind == "static":  # DEPLOY.md: replace the two REST lines with lt-cred-mech and a user
            replacements["use-auth-secret"] = "lt-cred-mech"
            replacements["static-auth-secret=replace-with-the-turn-secret"] = f"user={STATIC_USER}:{STATIC_PASSWORD}"
        config = self.directory / f"turnserver-{self.kind}.conf"
        config.write_text(deploy_block("coturn", replacements) + "\n")
        log = open(self.directory / f"turnserver-{self.kind}.log", "ab")
        self.process = subprocess.Popen(
            self.box.command("relay", [
                # -v: each session's username is logged (which call's credentials it took).
                TURNSERVER, "-c", str(config), "--log-file", "stdout", "--simple-log", "-v",
                "--pidfile", str(self.directory / f"turnserver-{self.kind}.pid"),
                "--db", str(self.directory / f"turndb-{self.kind}"),
            ]),
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        _wait(lambda: f"{RELAY_ADDRESS}:{ports['turn_port']} " in self.box.run("relay", ["ss", "-lnu"]).stdout,
              what=f"coturn ({self.kind})", process=self.process, log=self.directory / f"turnserver-{self.kind}.log")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=SHUTDOWN_DEADLINE_S)
        self.process = None

    def restart(self, secret: str) -> None:
        self.stop()
        self.start(secret)


@dataclass
class Deployment:
    box: Sandbox
    turns: dict[str, Turn]
    logs: Path

    def url(self, kind: str) -> str:
        return f"http://{RELAY_ADDRESS}:{KINDS[kind]['http_port']}"

    def get(self, kind: str, path: str) -> str:
        """``path`` of the ``kind`` server, asked from the relay namespace with the key."""
        script = (
            "import sys, urllib.request\n"
            f"request = urllib.request.Request('http://{SERVER_ADDRESS}:{KINDS[kind]['http_port']}{path}', "
            f"headers={{'Authorization': 'Bearer {API_KEY}'}})\n"
            "sys.stdout.write(urllib.request.urlopen(request, timeout=10).read().decode())\n"
        )
        return self.box.run("relay", [sys.executable, "-c", script]).stdout

    def call(self, kind: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        """``omni-rtc call`` from the client namespace, through the forwarder on the relay."""
        argv = [sys.executable, "-m", "app.cli", "call", self.url(kind), "--wav", str(HELLO), "--out", str(out),
                "--json", "--api-key", API_KEY, *extra]
        return subprocess.run(self.box.command("client", argv), capture_output=True, text=True,
                              timeout=CALL_TIMEOUT_S, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def _wait(ready, *, what: str, process: subprocess.Popen[bytes], log: Path, deadline_s: float = 30.0) -> None:
    give_up = time.monotonic() + deadline_s
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > give_up:
            raise RuntimeError(f"{what} was not ready within {deadline_s:g} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.3)


def _server_command(kind: str, model_dir: Path) -> list[str]:
    turn_url = f"turn:{RELAY_ADDRESS}:{KINDS[kind]['turn_port']}?transport=udp"
    credentials = (["--ice-auth-secret", TURN_SECRET] if kind == "secret"
                   else ["--ice-username", STATIC_USER, "--ice-credential", STATIC_PASSWORD])
    # The secret's server keeps its media workers (credentials are minted in the worker that takes
    # the call); the static one carries its calls itself, which starts sooner.
    workers = [] if kind == "secret" else ["--media-workers", "1"]
    return [
        sys.executable, "-m", "app.cli", "serve", "--host", SERVER_ADDRESS, "--port", str(KINDS[kind]["http_port"]),
        "--api-key", API_KEY, "--allowed-host", RELAY_ADDRESS, "--ice-server", turn_url, *credentials,
        "--model", str(model_dir), "--device", "cpu", "--seed", "0", "--log-level", "info", *workers,
    ]


@pytest.fixture(scope="module")
def deployment(dev_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    if os.geteuid() != 0:
        if os.environ.get("CI"):  # CI runs as root: there, not being root is a failure, never a skip
            pytest.fail("the TURN test needs root for its network namespaces, and CI runs as root")
        pytest.skip("network namespaces need root (CI runs as root)")
    if shutil.which(TURNSERVER) is None:
        pytest.fail("coturn is not installed: run scripts/system-deps.sh as root")
    logs = tmp_path_factory.mktemp("turn")
    env = {
        **os.environ, "PYTHONPATH": str(REPO_ROOT),
        "OMNI_RTC_GENERATION": json.dumps(GENERATION), "OMNI_RTC_ENGINE_THREADS": "1",
        "OMNI_RTC_DISCONNECT_TIMEOUT_S": str(DISCONNECT_TIMEOUT_S),
    }
    with sandbox() as box:
        turns = {kind: Turn(box, kind, logs) for kind in KINDS}
        processes: list[subprocess.Popen[bytes]] = []
        try:
            # Both servers start at once: most of the wait is their engines loading the model.
            for kind in KINDS:
                with open(logs / f"server-{kind}.log", "wb") as log:
                    processes.append(subprocess.Popen(box.command("server", _server_command(kind, dev_model_dir)),
                                                      stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT))
            for kind in KINDS:
                with open(logs / f"forward-{kind}.log", "wb") as log:
                    port = KINDS[kind]["http_port"]
                    processes.append(subprocess.Popen(
                        box.command("relay", [sys.executable, "-m", "tests.e2e.netns", "forward",
                                              f"{RELAY_ADDRESS}:{port}", f"{SERVER_ADDRESS}:{port}"]),
                        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT))
            for turn in turns.values():
                turn.start()
            deployed = Deployment(box, turns, logs)
            for index, kind in enumerate(KINDS):
                _wait(lambda kind=kind: _healthy(deployed, kind), what=f"the {kind} server", process=processes[index],
                      log=logs / f"server-{kind}.log", deadline_s=STARTUP_DEADLINE_S)
            yield deployed
        finally:
            for turn in turns.values():
                turn.stop()
            stop_all(processes, [signal.SIGINT] * len(processes))  # uvicorn's graceful stop; the forwarders just end


def _healthy(deployment: Deployment, kind: str) -> bool:
    try:
        return json.loads(deployment.get(kind, "/healthz"))["status"] == "ok"
    except (subprocess.CalledProcessError, ValueError, KeyError):
        return False


def _ended_by_hangup(deployment: Deployment, kind: str) -> float:
    metrics = deployment.get(kind, "/metrics")
    match = re.search(r'^omni_rtc_calls_total\{reason="hangup",transport="webrtc"\} (\S+)$', metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("kind", ["secret", "static"])
def test_a_call_connects_through_the_relay_and_completes_a_spoken_turn(
    deployment: Deployment, kind: str, tmp_path: Path
) -> None:
    called = deployment.call(kind, tmp_path)
    assert called.returncode == 0, called.stderr[-3000:]
    session = json.loads(called.stdout)["sessions"][0]
    pair = session["candidate_pair"]
    assert "relay" in (pair["local"], pair["remote"]), pair
    [turn] = session["turns"]
    assert turn["status"] in ("completed", "incomplete")
    assert turn["audio_seconds"] > 0


def test_the_page_gets_fresh_credentials_for_each_call(deployment: Deployment) -> None:
    """``--ice-auth-secret``: every ``GET /v1/realtime/ice_servers`` mints credentials expiring
    ``--ice-credential-ttl`` from now, each fetch with the API key for a user of its own."""
    first, second = (json.loads(deployment.get("secret", "/v1/realtime/ice_servers")) for _ in range(2))
    [server] = first["ice_servers"]
    expiry, _, user = server["username"].partition(":")
    assert int(expiry) == first["expires_at"]
    assert user.startswith("key-") and user != second["ice_servers"][0]["username"].partition(":")[2]
    assert server["urls"] == f"turn:{RELAY_ADDRESS}:{KINDS['secret']['turn_port']}?transport=udp"


ALLOCATE = """
import asyncio, json, sys
import aioice.turn

async def main(host, port, username, password, count):
    held, refused = [], 0
    for _ in range(count):  # each from a socket of its own: a new allocation
        try:
            endpoint = aioice.turn.create_turn_endpoint(asyncio.DatagramProtocol, (host, port), username, password)
            held.append((await asyncio.wait_for(endpoint, 10))[0])
        except Exception:
            refused += 1
    print(json.dumps({"allocated": len(held), "refused": refused}))
    for transport in held:
        transport.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])))
"""


def test_one_holders_credentials_take_at_most_the_user_quota_of_relays(deployment: Deployment) -> None:
    # DEPLOY.md's coturn sets a user-quota: with total-quota alone one holder could take every relay.
    [server] = json.loads(deployment.get("secret", "/v1/realtime/ice_servers"))["ice_servers"]
    argv = [sys.executable, "-c", ALLOCATE, RELAY_ADDRESS, str(KINDS["secret"]["turn_port"]),
            server["username"], server["credential"], "10"]
    result = deployment.box.run("client", argv, timeout=120, cwd=REPO_ROOT)
    assert json.loads(result.stdout) == {"allocated": 8, "refused": 2}  # user-quota=8


def test_the_servers_own_peer_relays_as_its_call(deployment: Deployment, tmp_path: Path) -> None:
    called = deployment.call("secret", tmp_path)
    assert called.returncode == 0, called.stderr[-3000:]
    call_id = json.loads(called.stdout)["sessions"][0]["call"].rsplit("/", 1)[1]
    log = (deployment.logs / "turnserver-secret.log").read_text()
    assert re.search(rf"username=<\d+:{re.escape(call_id)}>", log), log[-3000:]


def test_a_wrong_turn_secret_fails_the_call_clearly_and_releases_the_slot(deployment: Deployment, tmp_path: Path) -> None:
    ended_before = _ended_by_hangup(deployment, "secret")
    deployment.turns["secret"].restart("not-the-server's-secret")
    try:
        called = deployment.call("secret", tmp_path, "--timeout", str(FAILING_CALL_TIMEOUT_S))
        sessions = json.loads(deployment.get("secret", "/healthz"))["sessions"]
        ended_after = _ended_by_hangup(deployment, "secret")
    finally:
        deployment.turns["secret"].restart(TURN_SECRET)
    assert called.returncode == 1
    assert "gave no relay candidate" in called.stderr, called.stderr[-3000:]
    assert sessions == 0
    assert ended_after == ended_before + 1
    assert "no relay candidate from turn:" in (deployment.logs / "server-secret.log").read_text()
