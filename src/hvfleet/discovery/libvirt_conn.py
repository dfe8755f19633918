"""The thin edge between hvfleet and libvirt: open a connection, read what the
parsers need, and deliver lifecycle and close events.

Everything here is I/O; everything that interprets what libvirt says lives in
the pure parsers next to this module. libvirt errors become `Unavailable`
(libvirt cannot be reached or went away) with a one-line message naming the URI.

libvirt delivers events only while an event loop runs, and the loop must be
registered before the first connection is opened: `ensure_event_loop()` does
both, once per process, in a daemon thread.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import libvirt

from hvfleet.discovery.domains import DomainRecord
from hvfleet.discovery.host import NodeInfo
from hvfleet.model.errors import Unavailable

if TYPE_CHECKING:
    from lxml import etree

log = logging.getLogger(__name__)

_loop_lock = threading.Lock()
_loop_thread: threading.Thread | None = None


def _silence_libvirt_stderr(_ctx: object, _err: object) -> None:
    # libvirt prints every error to stderr by default; we report them ourselves.
    return None


def _run_event_loop() -> None:
    while True:
        try:
            libvirt.virEventRunDefaultImpl()
        except Exception:  # the loop must outlive any one bad callback
            log.exception("libvirt event loop iteration failed")


def ensure_event_loop() -> None:
    """Register libvirt's default event loop and run it in a daemon thread (once)."""
    global _loop_thread
    with _loop_lock:
        if _loop_thread is not None:
            return
        libvirt.registerErrorHandler(_silence_libvirt_stderr, None)
        libvirt.virEventRegisterDefaultImpl()
        _loop_thread = threading.Thread(target=_run_event_loop, name="libvirt-events", daemon=True)
        _loop_thread.start()


def version_string(packed: int) -> str:
    """libvirt's packed version (major * 1e6 + minor * 1e3 + release) → '9.0.0'."""
    return f"{packed // 1_000_000}.{packed // 1000 % 1000}.{packed % 1000}"


def node_file_of_test_uri(uri: str) -> str | None:
    """The node file of a `test:///abs/path.xml` URI, or None (also for test:///default)."""
    parts = urlsplit(uri)
    if parts.scheme != "test" or parts.path in ("", "/", "/default"):
        return None
    return unquote(parts.path)


def _message(exc: libvirt.libvirtError) -> str:
    msg = exc.get_error_message() or str(exc)
    return " ".join(str(msg).split())


LifecycleCallback = Callable[[str, int, int], None]  # (domain uuid, event, detail)
CloseCallback = Callable[[int], None]  # (reason)


class LibvirtConnection:
    """One open libvirt connection with its event registrations."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._conn: Any = None
        self._callback_ids: list[int] = []
        self._close_registered = False

    # -- lifecycle ----------------------------------------------------------------------

    def open(self) -> None:
        ensure_event_loop()
        try:
            conn = libvirt.open(self.uri)
        except libvirt.libvirtError as exc:
            raise Unavailable(f"libvirt {self.uri}: cannot connect: {_message(exc)}") from None
        if conn is None:
            raise Unavailable(f"libvirt {self.uri}: cannot connect")
        self._conn = conn
        # Remote connections only (qemu:///system through libvirtd): notice a dead
        # daemon even when its socket does not close. Local drivers refuse it.
        with contextlib.suppress(libvirt.libvirtError):
            conn.setKeepAlive(5, 3)

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        for cid in self._callback_ids:
            with contextlib.suppress(libvirt.libvirtError):
                conn.domainEventDeregisterAny(cid)
        self._callback_ids.clear()
        if self._close_registered:
            with contextlib.suppress(libvirt.libvirtError):
                conn.unregisterCloseCallback()
            self._close_registered = False
        with contextlib.suppress(libvirt.libvirtError):
            conn.close()

    def _c(self) -> Any:
        if self._conn is None:
            raise Unavailable(f"libvirt {self.uri}: not connected")
        return self._conn

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except libvirt.libvirtError as exc:
            raise Unavailable(f"libvirt {self.uri}: {what}: {_message(exc)}") from None

    # -- events -------------------------------------------------------------------------

    def on_lifecycle(self, callback: LifecycleCallback) -> None:
        """Call `callback(uuid, event, detail)` for every domain lifecycle event
        (defined, undefined, started, stopped, suspended, ...). Runs on the libvirt
        event thread: keep it short."""

        def relay(_conn: Any, dom: Any, event: int, detail: int, _opaque: Any) -> None:
            try:
                uuid = dom.UUIDString()
            except libvirt.libvirtError:
                uuid = ""
            callback(uuid, event, detail)

        cid = self._call(
            "register lifecycle events",
            lambda: self._c().domainEventRegisterAny(
                None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, relay, None
            ),
        )
        self._callback_ids.append(int(cid))

    def on_resource_change(self, callback: Callable[[str], None]) -> None:
        """Call `callback(uuid)` when a domain's resources or placement change
        without a lifecycle event: vCPU/emulator pinning or numatune changed
        (tunable), a device (e.g. a memory DIMM) added or removed."""

        def uuid_of(dom: Any) -> str:
            try:
                return str(dom.UUIDString())
            except libvirt.libvirtError:
                return ""

        def tunable(_conn: Any, dom: Any, _params: Any, _opaque: Any) -> None:
            callback(uuid_of(dom))

        def device(_conn: Any, dom: Any, _alias: Any, _opaque: Any) -> None:
            callback(uuid_of(dom))

        relays: list[tuple[int, Callable[[Any, Any, Any, Any], None], str]] = [
            (libvirt.VIR_DOMAIN_EVENT_ID_TUNABLE, tunable, "tunable"),
            (libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_ADDED, device, "device-added"),
            (libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED, device, "device-removed"),
        ]
        for event_id, relay, what in relays:
            try:
                cid = self._c().domainEventRegisterAny(None, event_id, relay, None)
            except libvirt.libvirtError as exc:
                raise Unavailable(f"libvirt {self.uri}: register {what} events: {_message(exc)}") from None
            self._callback_ids.append(int(cid))

    def on_close(self, callback: CloseCallback) -> bool:
        """Call `callback(reason)` when the connection closes (remote drivers only).
        Returns False where the driver has no such notion (test, embed)."""

        def relay(_conn: Any, reason: int, _opaque: Any) -> None:
            callback(reason)

        try:
            self._c().registerCloseCallback(relay, None)
        except libvirt.libvirtError:
            return False
        self._close_registered = True
        return True

    # -- what the agent reads -------------------------------------------------------------

    def hostname(self) -> str:
        return str(self._call("hostname", lambda: self._c().getHostname()))

    def capabilities(self) -> str:
        return str(self._call("capabilities", lambda: self._c().getCapabilities()))

    def domain_capabilities(self) -> str | None:
        """The default domcapabilities, or None where the driver has none (test)."""
        try:
            return str(self._c().getDomainCapabilities(None, None, None, None, 0))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in (
                libvirt.VIR_ERR_NO_SUPPORT,
                libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
            ):
                return None
            raise Unavailable(f"libvirt {self.uri}: domcapabilities: {_message(exc)}") from None

    def node_info(self) -> NodeInfo:
        return NodeInfo.from_libvirt(self._call("node info", lambda: self._c().getInfo()))

    def libvirt_version(self) -> str:
        return version_string(int(self._call("library version", lambda: self._c().getLibVersion())))

    def hypervisor_version(self) -> str:
        return version_string(int(self._call("hypervisor version", lambda: self._c().getVersion())))

    def domains(self) -> list[DomainRecord]:
        """Every domain libvirt knows (defined and transient), XML and state. A
        domain that disappears while being read is simply not in the list."""
        doms = self._call("list domains", lambda: self._c().listAllDomains(0))
        out: list[DomainRecord] = []
        for dom in doms:
            try:
                name, uuid = str(dom.name()), str(dom.UUIDString())
                state = int(dom.state()[0])
                xml = str(dom.XMLDesc(0))
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    continue
                raise Unavailable(f"libvirt {self.uri}: read domain: {_message(exc)}") from None
            out.append(DomainRecord(name, uuid, xml, state))
        return out


def domain_xml_error(domain: etree._Element) -> str | None:
    """What libvirt says of a domain definition (as parsed, safely, by its
    reader), or None when it takes it: its schema and its own domain parser
    (the ranges, units, addresses and names `defineXML` refuses), through the
    test driver in this process (no daemon, nothing of a host's). A copy is
    tried under a name and uuid of its own, so two checks never meet;
    libvirt's rule for the name itself (no '/') is checked here."""
    from lxml import etree

    dom = copy.deepcopy(domain)
    name = dom.findtext("name") or ""
    if "/" in name or "\n" in name:
        return f"name {name!r} cannot contain '/' or a newline"
    for old in dom.findall("name") + dom.findall("uuid"):
        dom.remove(old)
    probe = etree.SubElement(dom, "name")
    probe.text = f"hvfleet-check-{uuid.uuid4().hex}"
    ensure_event_loop()  # (also silences libvirt's own printing of errors)
    try:
        conn = libvirt.open("test:///default")
    except libvirt.libvirtError as exc:
        raise Unavailable(f"test:///default: {exc.get_error_message()}") from None
    text = etree.tostring(dom, encoding="unicode")
    try:
        # The parser first (its words name the value: "expected unicast mac
        # address"), then the schema too (what the parser lets by).
        for flags in (0, libvirt.VIR_DOMAIN_DEFINE_VALIDATE):
            try:
                conn.defineXMLFlags(text, flags).undefine()
            except libvirt.libvirtError as exc:
                lines = str(exc.get_error_message() or exc).strip().splitlines()
                return "; ".join(line.strip() for line in lines if line.strip())
        return None
    finally:
        conn.close()
