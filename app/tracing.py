"""OpenTelemetry traces of the sessions: exported over OTLP/HTTP when an endpoint is configured.

The standard variables configure it: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the whole URL) or
``OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces`` is appended), ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``... (the SDK and its exporter read
them). With neither endpoint set, or ``OTEL_SDK_DISABLED=true``, there is no :class:`Tracing`: no
provider, no exporter, no thread.

Every process that holds sessions exports its own spans: the server process (its WebSocket
sessions, and its WebRTC calls without media workers) and each media worker, which gets the
front's ``OTEL_*`` variables (:class:`TracingEnvironment`) when it is spawned. Each has one
:class:`Tracing`: a tracer provider with one ``BatchSpanProcessor`` (its thread sends batches off
the event loop) and the OTLP/HTTP exporter, shut down, flushing what is left, when the process
stops serving (``Tracing.shutdown``). The spans themselves: ``app.session_spans``; docs/OPERATING.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_SDK_DISABLED,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME, SERVICE_VERSION

from app.session_spans import SessionSpans, WallClock

logger = logging.getLogger(__name__)

SERVICE = "omni-rtc"  # service.name unless OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) names another
PROCESS_ATTRIBUTE = "omni_rtc.process"  # "front", or "media-worker-N": which process sent the span
_VARIABLE_PREFIX = "OTEL_"


@dataclass(frozen=True)
class TracingEnvironment:
    """The ``OTEL_*`` variables of a process that exports traces (at least one endpoint is set)."""

    variables: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> TracingEnvironment | None:
        """``environ``'s OpenTelemetry variables, or None when they configure no trace export."""
        variables = {name: value for name, value in environ.items() if name.startswith(_VARIABLE_PREFIX)}
        if variables.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
            return None
        if not (variables.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or variables.get(OTEL_EXPORTER_OTLP_ENDPOINT)):
            return None
        return cls(variables)

    @property
    def endpoint(self) -> str:
        """Where the spans go, for the log: the traces endpoint, else the base one (``/v1/traces`` follows)."""
        return self.variables.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or self.variables[OTEL_EXPORTER_OTLP_ENDPOINT]

    def apply_to(self, environ: MutableMapping[str, str]) -> None:
        """Makes ``environ``'s ``OTEL_*`` variables these: a media worker, forked from a server that
        started before the front's were read, takes the front's (the SDK reads them from there)."""
        for name in [name for name in environ if name.startswith(_VARIABLE_PREFIX)]:
            del environ[name]
        environ.update(self.variables)


class Tracing:
    """One process's span export (see the module docstring); ``session_spans`` gives each session's observer."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("app.session_spans")
        self._clock = WallClock.now()

    @classmethod
    def start(cls, environment: TracingEnvironment | None, *, process: str) -> Tracing | None:
        """The export ``environment`` configures (None: no tracing at all); ``process`` is put on
        every span's resource (``omni_rtc.process``). The variables are read from ``os.environ``,
        which a media worker has made its front's first (``TracingEnvironment.apply_to``)."""
        if environment is None:
            return None
        resource = Resource.create({PROCESS_ATTRIBUTE: process, SERVICE_VERSION: _package_version()})
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):  # the SDK's default
            resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
        # shutdown_on_exit=False: the process shuts it down itself when it stops serving, off its
        # event loop (Tracing.shutdown), not in an atexit hook.
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        # Endpoint, headers, timeout, TLS: the OTEL_EXPORTER_OTLP_* variables.
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        logger.info("%s exports traces over OTLP/HTTP to %s", process, environment.endpoint)
        return cls(provider)

    def session_spans(self, transport: str) -> SessionSpans:
        """A new session's observer: its spans, with ``transport`` on the session span."""
        return SessionSpans(self._tracer, self._clock, transport)

    def shutdown(self) -> None:
        """Sends the spans not yet sent and stops the exporting thread; blocks (up to the exporter's
        timeout when the collector does not answer): run it off the event loop. Safe twice."""
        self._provider.shutdown()


def _package_version() -> str:
    try:
        return version("omni-rtc")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"
