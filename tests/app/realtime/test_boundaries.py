"""The session core is transport-agnostic: importing it loads no web framework, WebRTC or ONNX runtime,
no torch (the session counts tokens without the engine's tokenizer: pipeline/token_count.py), and no
OpenTelemetry (its observer is app/session_spans.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import app.realtime

FORBIDDEN = ("fastapi", "starlette", "aiortc", "onnxruntime", "torch", "transformers", "opentelemetry")
REALTIME = Path(app.realtime.__file__).parent
REALTIME_MODULES = sorted(path.stem for path in REALTIME.glob("*.py") if path.stem != "__init__")


def realtime_imports(name: str) -> set[str]:
    """The app.realtime modules ``name`` imports (``protocol`` for anything in app.realtime.protocol)."""
    tree = ast.parse((REALTIME / f"{name}.py").read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            modules = [node.module] if node.names[0].name != "*" else [node.module]
            if node.module == "app.realtime":
                modules = [f"app.realtime.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[:2] == ["app", "realtime"] and len(parts) > 2:
                imported.add(parts[2])
    return imported - {name}


def floors() -> dict[str, int]:
    """Each module's import floor: 1 for one that imports nothing of app.realtime (the protocol
    counts as a module), else one above the highest it imports."""
    graph = {name: realtime_imports(name) for name in REALTIME_MODULES}
    graph["protocol"] = set()
    floor: dict[str, int] = {}

    def visit(name: str, path: tuple[str, ...]) -> int:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        if name not in floor:
            floor[name] = 1 + max((visit(below, (*path, name)) for below in graph[name]), default=0)
        return floor[name]

    for name in graph:
        visit(name, ())
    return floor


def test_the_realtime_core_is_a_dozen_or_so_modules_on_at_most_six_floors():
    assert len(REALTIME_MODULES) <= 16, REALTIME_MODULES
    assert max(floors().values()) <= 6, floors()
    assert floors()["session"] == max(floors().values())  # the session sits on top and nothing imports it


def test_the_floor_walk_sees_every_import():
    """The walk itself: the session imports the parts it joins, and a part below imports none above it."""
    assert {"turn_taking", "response", "history", "playback", "speculation"} <= realtime_imports("session")
    assert "session" not in set().union(*(realtime_imports(name) for name in REALTIME_MODULES))
    assert realtime_imports("playback") == {"protocol"}


def test_the_package_names_its_nouns():
    doc = app.realtime.__doc__ or ""
    for name in REALTIME_MODULES:
        assert f"``{name}``" in doc, f"app/realtime/__init__.py does not name {name}"


def test_importing_the_session_core_loads_no_transport_or_onnx():
    modules = " ".join(f"app.realtime.{name}" for name in (*REALTIME_MODULES, "protocol"))
    code = (
        f"import importlib, sys\n"
        f"for name in {modules.split()!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_call_imports_nothing_of_the_http_service_above_it():
    code = "import sys, app.transports.webrtc.peer_call\nprint(sorted(m for m in sys.modules if m.startswith('app.http.')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_websocket_call_imports_nothing_of_the_http_service_above_it():
    code = "import sys, app.transports.websocket.socket_call\nprint(sorted(m for m in sys.modules if m.startswith('app.http.')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_registry_and_the_call_lifecycle_load_no_transport():
    """What a call is to the registry holds calls of either transport, and imports neither."""
    code = (
        "import sys, app.calls.registry, app.calls.lifecycle\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_process_topology_imports_nothing_of_the_http_service_above_it():
    """app/web wires app/serving in; the metrics both read live beside them (app/metrics.py)."""
    modules = ", ".join(f"app.serving.{name}" for name in ("media_workers", "media_worker", "call_factory", "engines", "ipc", "runtime"))
    code = f"import sys, {modules}\nprint(sorted(m for m in sys.modules if m.startswith('app.http.')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
