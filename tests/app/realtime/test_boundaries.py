"""The session core is transport-agnostic: importing it loads no web framework, WebRTC or ONNX runtime,
and no torch (the session counts tokens without the engine's tokenizer: pipeline/token_count.py)."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("fastapi", "starlette", "aiortc", "onnxruntime", "torch", "transformers")


def test_importing_the_session_core_loads_no_transport_or_onnx():
    modules = " ".join(
        f"app.realtime.{name}"
        for name in ("session", "history", "response_run", "ledger", "gate", "protocol", "session_config", "input_buffer",
                     "prompt_budget")
    )
    code = (
        f"import importlib, sys\n"
        f"for name in {modules.split()!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_call_imports_nothing_of_the_http_service_above_it():
    code = "import sys, app.webrtc.call\nprint(sorted(m for m in sys.modules if m.startswith('app.web.')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_websocket_call_imports_nothing_of_the_http_service_above_it():
    code = "import sys, app.websocket.call\nprint(sorted(m for m in sys.modules if m.startswith('app.web.')))"
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
    code = f"import sys, {modules}\nprint(sorted(m for m in sys.modules if m.startswith('app.web.')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
