"""A synchronous client of berth's HTTP API, for the operator CLI and scripts.

What it owns: finding the API (:func:`locate`: ``--api``/``$BERTH_API`` and
``--token``/``$BERTH_TOKEN``, else the ``$BERTH_HOME/api.json`` that ``berth up`` writes), one
method per route (:class:`ApiClient`), parsing every answer with the API's own pydantic
schemas (:mod:`berth.api.schemas`), and turning every failure into one of berth's
errors, so the command line prints it as its usual one line:

* an ``application/problem+json`` answer → ``Invalid`` (400 and 422, with the problem's
  ``field``), ``NoCapacity`` (409, the per-reason counts kept in ``reasons``), ``Unavailable``
  (503, and the 409 of a repeat whose first attempt is in progress), or
  :class:`ApiError` (401, 404, a 409 ``identity_taken`` and anything else, with the status);
* connection refused, a timeout, a dropped connection → ``Unavailable`` naming the URL (and,
  for a change sent but never answered, that its outcome is unknown);
* **several endpoints** (every scheduler serves the API: ``api.json``'s ``urls``, or
  ``--api URL,URL``): a request goes to the endpoint that answered last; one that cannot be
  reached (connection refused — nothing was sent) is skipped for the next, whatever the
  method; a read (``GET``) is also asked of the next one after a timeout or a ``503``.  A
  ``POST`` carries an ``Idempotency-Key`` (the same on every attempt), so the API answers a
  repeat with the first attempt's outcome instead of doing it twice: a ``POST`` whose answer
  was lost (a timeout, a dropped connection) is asked of the next endpoint too, and one
  answered ``409 idempotency_in_progress`` (the first attempt still under way) is asked
  again after its ``Retry-After`` while the request's time lasts — except
  ``POST /v1/placements``, whose repeat would take a second lease (:data:`UNREPEATABLE`);
* an answer that does not match the schema → :class:`ApiError` — never a traceback.

What it is not: a second definition of the API's types or rules.  Requests are sent as the
JSON the API documents and validated by the server; the answers are the server's models.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from berth.api import schemas
from berth.boot import WorkloadLogs
from berth.defaults import LOG_CHUNK_BYTES, RUN_TIMEOUT_S, SCHEDULE_TIMEOUT_S
from berth.errors import BerthError, Invalid, NoCapacity, Unavailable
from berth.validation import check_text, one_line, shown

__all__ = [
    "API_FILE",
    "NATS_FILES",
    "ApiClient",
    "ApiError",
    "ApiLocation",
    "NatsAccess",
    "api_file",
    "locate",
    "written_nats",
]

CREATE_MARGIN_S = 5.0
"""What a create may take beyond its placement and its boot (claims, records)."""
API_FILE = "api.json"
"""The file under ``$BERTH_HOME`` (default ``~/.berth``) where ``berth up`` puts its API."""
MAX_API_FILE_BYTES = 64 * 1024
MAX_TOKEN = 4096
MAX_ENDPOINTS = 64
UNREPEATABLE = frozenset({"/v1/placements"})
"""The POSTs a lost answer is not repeated for: each attempt would do it again (a lease)."""
MAX_RETRY_AFTER_S = 2.0
"""The longest wait a ``Retry-After`` of an in-progress answer is followed for."""
MAX_DETAIL = 2000
"""The most of a problem's ``detail`` an error line repeats (a broken server may send more)."""

M = TypeVar("M", bound=BaseModel)


class ApiError(BerthError):
    """An answer of the API that is none of berth's own error kinds (401, 404, 5xx, garbage).

    ``status`` is the HTTP status (0 when the answer could not be read at all).
    """

    def __init__(self, message: str, *, status: int = 0) -> None:
        self.status = status
        super().__init__(message)


def api_file(environ: dict[str, str] | None = None) -> Path:
    """``$BERTH_HOME/api.json``, ``~/.berth/api.json`` without ``$BERTH_HOME``."""
    env = os.environ if environ is None else environ
    home = env.get("BERTH_HOME") or str(Path.home() / ".berth")
    return Path(home) / API_FILE


@dataclass(frozen=True)
class ApiLocation:
    """Where the API is (``url``, and ``others`` serving the same cluster), the token to show
    it, where that came from (for error messages) and the CA file its certificates are
    checked against (``None``: the system's)."""

    url: str
    token: str | None
    source: str
    others: tuple[str, ...] = ()
    ca: str | None = None

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url, *self.others)


def _checked_url(url: str, field: str) -> str:
    expected = f"expected an http:// or https:// URL, got {shown(url)}"
    if not url.isprintable() or any(character.isspace() for character in url):
        raise Invalid(expected, field=field)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError when out of range
    except ValueError as error:
        raise Invalid(f"{expected}: {error}", field=field) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid(expected, field=field)
    if parts.query or parts.fragment:
        raise Invalid(f"expected a URL without a query, got {shown(url)}", field=field)
    return url.rstrip("/")


def _checked_urls(urls: str | list[Any], field: str) -> tuple[str, ...]:
    """``URL,URL,…`` (a flag) or a JSON list of URLs (``api.json``), each checked, at least
    one, none twice."""
    items = urls.split(",") if isinstance(urls, str) else urls
    if not items or len(items) > MAX_ENDPOINTS:
        raise Invalid(f"expected 1 to {MAX_ENDPOINTS} URLs, got {len(items)}", field=field)
    checked: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise Invalid(f"expected a URL, got {shown(item)}", field=field)
        url = _checked_url(item, field)
        if url in checked:
            raise Invalid(f"{url} is given twice", field=field)
        checked.append(url)
    return tuple(checked)


def _checked_token(token: str | None, field: str) -> str | None:
    """A token travels in a header: printable ASCII without spaces (the server says more)."""
    if token is None:
        return None
    if not token or len(token) > MAX_TOKEN or not token.isascii() or not _visible(token):
        raise Invalid(  # a secret: its value is not repeated
            f"expected 1-{MAX_TOKEN} printable ASCII characters without spaces, got "
            f"{len(token)} characters that are not",
            field=field,
        )
    return token


def _visible(text: str) -> bool:
    return all(33 <= ord(character) <= 126 for character in text)


def _read_api_file(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_API_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise Invalid(f"cannot read it: {error.strerror or error}", field=str(path)) from None
    if len(raw) > MAX_API_FILE_BYTES:
        raise Invalid(f"larger than {MAX_API_FILE_BYTES} bytes", field=str(path))
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, nested too deeply
        raise Invalid(f"not a JSON document: {error}", field=str(path)) from None
    if not isinstance(document, dict) or not isinstance(document.get("url"), str):
        raise Invalid('expected {"url": ..., "token": ...}', field=str(path))
    token = document.get("token")
    if token is not None and not isinstance(token, str):
        raise Invalid(f"token: expected a string, got {shown(token)}", field=str(path))
    urls = document.get("urls", [document["url"]])
    if not isinstance(urls, list):
        raise Invalid(f"urls: expected a list of URLs, got {shown(urls)}", field=str(path))
    ca = document.get("ca")
    if ca is not None and (not isinstance(ca, str) or not ca):
        raise Invalid(f"ca: expected a file path, got {shown(ca)}", field=str(path))
    return document


def locate(
    api: str | None, token: str | None, *, environ: dict[str, str] | None = None
) -> ApiLocation:
    """The API to talk to: ``api``/``token`` (the flags, or their environment variables),
    else ``$BERTH_HOME/api.json``.  The file's token and CA are used with the file's URL, or
    with an ``api`` equal to one of the file's; a token given explicitly always wins (the CA
    is no secret: it says whom to trust, so it is taken with either token)."""
    path = api_file(environ)
    token = _checked_token(token, "--token")
    if api is not None:
        urls = _checked_urls(api, "--api")
        ca = None
        written = _read_api_file(path)
        if written is not None and urls[0] in _written_urls(written, path):
            if token is None:
                token = _checked_token(written.get("token"), f"{path}: token")
            ca = _written_ca(written, path)
        return ApiLocation(urls[0], token, "--api", urls[1:], ca)
    written = _read_api_file(path)
    if written is None:
        raise Invalid(
            f"no API to talk to: pass --api URL or set BERTH_API, or start a cluster with "
            f"`berth up` (it writes {path})",
            field="--api",
        )
    urls = _written_urls(written, path)
    if token is None:
        token = _checked_token(written.get("token"), f"{path}: token")
    return ApiLocation(urls[0], token, str(path), urls[1:], _written_ca(written, path))


NATS_FILES = ("creds", "tls_ca", "tls_cert", "tls_key")
"""The files of ``api.json``'s ``nats`` object besides its ``url``, each optional: a
client's credentials and its TLS CA, certificate and key."""


@dataclass(frozen=True)
class NatsAccess:
    """How a client reaches a cluster's NATS: its servers' ``url`` and the ``files``
    (:data:`NATS_FILES` that it has), read from ``source``."""

    url: str
    files: dict[str, Path]
    source: str


def written_nats(environ: dict[str, str] | None = None) -> NatsAccess | None:
    """The NATS access ``berth up`` wrote into ``$BERTH_HOME/api.json`` (its ``nats``
    object), or ``None`` when there is no such file or it has none; a malformed one is
    ``Invalid`` naming the file."""
    path = api_file(environ)
    written = _read_api_file(path)
    if written is None or "nats" not in written:
        return None
    nats = written["nats"]
    field = f"{path}: nats"
    if not isinstance(nats, dict) or not isinstance(nats.get("url"), str):
        raise Invalid(f'expected {{"url": ..., "creds": ...}}, got {shown(nats)}', field=field)
    files: dict[str, Path] = {}
    for name in NATS_FILES:
        value = nats.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise Invalid(f"{name}: expected a file path, got {shown(value)}", field=field)
        files[name] = path.parent / value
    return NatsAccess(nats["url"], files, str(path))


def _written_ca(written: dict[str, Any], path: Path) -> str | None:
    """``api.json``'s CA file, a relative one taken from the file's own directory."""
    ca = written.get("ca")
    return None if ca is None else str(path.parent / ca)


def _written_urls(written: dict[str, Any], path: Path) -> tuple[str, ...]:
    """``api.json``'s endpoints: its ``urls`` (every scheduler's API), else its ``url``."""
    urls = written.get("urls")
    if urls is None:
        return (_checked_url(written["url"], str(path)),)
    return _checked_urls(urls, f"{path}: urls")


def _problem(response: httpx.Response) -> dict[str, Any]:
    """The problem document of an error answer; whatever else it is, its text, shortened."""
    try:
        document = response.json()
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deeply
        return {"detail": one_line(response.text[:200]) or response.reason_phrase}
    return document if isinstance(document, dict) else {"detail": shown(document)}


class ApiClient:
    """One method per route of the API (see ``docs/openapi.json``); a context manager.

    ``transport`` is httpx's port: tests and callers may pass another driver (an
    ``httpx.ASGITransport`` over an app in this process) instead of a socket.
    """

    def __init__(
        self,
        location: ApiLocation,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.location = location
        self.timeout_s = timeout_s
        self._headers = {"Accept": "application/json", "User-Agent": "berth-cli"}
        if location.token:
            self._headers["Authorization"] = f"Bearer {location.token}"
        self._transport = transport
        self._clients: dict[str, httpx.Client] = {}
        self._current = 0
        """The endpoint that answered last (an index into ``location.urls``): asked first."""

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    @property
    def url(self) -> str:
        """The endpoint requests go to first (the one that answered last)."""
        return self.location.urls[self._current]

    def _http(self, url: str) -> httpx.Client:
        client = self._clients.get(url)
        if client is None:
            verify: ssl.SSLContext | bool = True
            if self.location.ca is not None and url.startswith("https:"):
                try:
                    verify = ssl.create_default_context(cafile=self.location.ca)
                except OSError as error:
                    raise Invalid(
                        f"cannot read the API's CA {self.location.ca}: {error.strerror or error}",
                        field="ca",
                    ) from None
            client = self._clients[url] = httpx.Client(
                base_url=url,
                headers=self._headers,
                timeout=self.timeout_s,
                transport=self._transport,
                verify=verify,
            )
        return client

    # -- the transport and the error mapping -------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Send one request — to the next endpoint when one cannot be reached (see the module
        docstring); the decoded JSON answer, or one of berth's errors."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        check_text(body)  # a lone surrogate (a non-UTF-8 byte of argv) is Invalid, not a crash
        headers = {"Idempotency-Key": uuid.uuid4().hex} if method == "POST" else None
        repeatable = method == "GET" or (method == "POST" and path not in UNREPEATABLE)
        deadline = time.monotonic() + timeout
        while True:
            response, url = self._send(method, path, body, params, timeout, headers, repeatable)
            wait_s = _in_progress(response)
            if wait_s is None or time.monotonic() + wait_s > deadline:
                return self._answer(response, method, path, url)
            time.sleep(wait_s)  # the same request, its first attempt still under way

    def _send(
        self,
        method: str,
        path: str,
        body: Any,
        params: dict[str, str] | None,
        timeout: float,
        headers: dict[str, str] | None,
        repeatable: bool,
    ) -> tuple[httpx.Response, str]:
        """One round over the endpoints (see the module docstring): the first answer and the
        endpoint that gave it, or ``Unavailable`` saying what each did."""
        urls = self.location.urls
        order = [(self._current + step) % len(urls) for step in range(len(urls))]
        failures: list[Unavailable] = []
        refused = 0  # endpoints where nothing listens
        for position, index in enumerate(order):
            url, last = urls[index], position == len(order) - 1
            try:
                response = self._http(url).request(
                    method, path, json=body, params=params or None, timeout=timeout, headers=headers
                )
            except httpx.ConnectError as error:  # nothing was sent: any method may go on
                refused += 1
                failures.append(
                    Unavailable(f"cannot reach the berth API at {url + path}: {_reason(error)}")
                )
                continue
            except httpx.HTTPError as error:  # sent, perhaps done: a repeatable request goes on
                what = (
                    f"did not answer within {timeout:g}s"
                    if isinstance(error, httpx.TimeoutException)
                    else f"failed: {_reason(error)}"
                )
                failures.append(
                    Unavailable(f"the berth API at {url + path} {what}{_outcome(method, error)}")
                )
                if repeatable and not last:
                    continue
                raise failures[-1] from None
            if response.status_code == 503 and method == "GET" and not last:
                failures.append(Unavailable(str(_problem(response).get("detail", "503"))))
                continue
            self._current = index
            return response, url
        said = (
            str(failures[0])
            if len(failures) == 1
            else f"none of the {len(urls)} berth API endpoints answered: "
            + "; ".join(str(failure) for failure in failures)
        )
        source = self.location.source
        if refused == len(urls) and source.endswith(API_FILE):  # where berth up's file says
            said += (
                f" ({source} says the API is there: if that berth up was killed, the file is "
                "stale — start berth up again, or pass --api URL)"
            )
        raise Unavailable(said)

    def _answer(self, response: httpx.Response, method: str, path: str, url: str) -> Any:
        if response.status_code >= 400:
            raise self._error(response, method, path)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deeply
            raise ApiError(
                f"{method} {url + path}: the answer is not JSON: {shown(response.text[:100])}",
                status=response.status_code,
            ) from None

    def _error(self, response: httpx.Response, method: str, path: str) -> BerthError:
        status = response.status_code
        problem = _problem(response)
        detail = str(problem.get("detail") or problem.get("title") or response.reason_phrase)
        if len(detail) > MAX_DETAIL:
            detail = detail[:MAX_DETAIL] + "…"
        if status == 400 or status == 422:
            field = _field(problem.get("field"))
            if field and detail.startswith(f"{problem.get('field')}: "):  # said twice otherwise
                detail = detail.split(": ", 1)[1]
            # the server's schema speaks pydantic ("Input should be …"); berth says "must be"
            return Invalid(detail.replace("Input should be", "must be"), field=field)
        if status == 409 and str(problem.get("type", "")).endswith("/identity_taken"):
            return ApiError(detail, status=status)  # not a capacity problem: say it as it is
        if status == 409 and str(problem.get("type", "")).endswith("/idempotency_in_progress"):
            return Unavailable(detail)  # the same request, still under way: try again
        if status == 409:
            error = NoCapacity(detail)
            reasons = problem.get("reasons")  # {"mem_exhausted": 3, …}: counts per reason
            if isinstance(reasons, dict):
                error.reasons = {str(reason): str(count) for reason, count in reasons.items()}
            return error
        if status == 503:
            return Unavailable(detail)
        if status == 401:
            why = str(problem.get("title") or detail)
            return ApiError(
                f"the berth API at {self.url} refused the token ({why}): pass "
                f"--token or set BERTH_TOKEN (berth up writes it to {api_file()})",
                status=status,
            )
        if status == 404:
            return ApiError(f"not found: {detail}", status=status)
        return ApiError(
            f"{method} {self.url}{path} failed with HTTP {status}: {detail}", status=status
        )

    def _parsed(self, model: type[M], document: Any, what: str) -> M:
        try:
            return model.model_validate(document)
        except RecursionError:
            raise ApiError(f"the API's answer to {what} is nested too deeply") from None
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(map(str, first.get("loc", ()))) or "the document"
            raise ApiError(
                f"the API's answer to {what} does not match its schema: {where}: {first['msg']}"
            ) from None

    # -- routes ------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        document = self.request("GET", "/healthz")
        return document if isinstance(document, dict) else {}

    def create_workload(self, body: dict[str, Any]) -> schemas.Workload:
        # The API places (up to SCHEDULE_TIMEOUT_S) then boots (up to RUN_TIMEOUT_S): wait for
        # its answer rather than give up first and leave the outcome unknown.
        timeout = max(self.timeout_s, SCHEDULE_TIMEOUT_S + RUN_TIMEOUT_S + CREATE_MARGIN_S)
        answer = self.request("POST", "/v1/workloads", body=body, timeout_s=timeout)
        return self._parsed(schemas.Workload, answer, "run")

    def workloads(
        self, *, namespace: str | None = None, node: str | None = None, state: str | None = None
    ) -> schemas.WorkloadList:
        params = {
            key: value
            for key, value in (("namespace", namespace), ("node", node), ("state", state))
            if value is not None
        }
        document = self.request("GET", "/v1/workloads", params=params)
        return self._parsed(schemas.WorkloadList, document, "ps")

    def workload(self, workload_id: str) -> schemas.Workload:
        document = self.request("GET", f"/v1/workloads/{_segment(workload_id)}")
        return self._parsed(schemas.Workload, document, "get workload")

    def logs(self, workload_id: str, offset: int = 0, limit: int = LOG_CHUNK_BYTES) -> WorkloadLogs:
        params = {"offset": str(offset), "limit": str(limit)}
        document = self.request("GET", f"/v1/workloads/{_segment(workload_id)}/logs", params=params)
        return self._parsed(WorkloadLogs, document, "logs")

    def stop(self, workload_id: str, *, grace_s: float | None = None) -> schemas.Workload:
        body = {} if grace_s is None else {"grace_s": grace_s}
        timeout = self.timeout_s + (grace_s or 0.0)
        document = self.request(
            "POST", f"/v1/workloads/{_segment(workload_id)}/stop", body=body, timeout_s=timeout
        )
        return self._parsed(schemas.Workload, document, "stop")

    def explain(self, body: dict[str, Any]) -> schemas.Explanation:
        document = self.request("POST", "/v1/explain", body=body)
        return self._parsed(schemas.Explanation, document, "explain")

    def recent_placements(self, limit: int = 50) -> schemas.RecentPlacements:
        document = self.request("GET", "/v1/placements/recent", params={"limit": str(limit)})
        return self._parsed(schemas.RecentPlacements, document, "recent placements")

    def nodes(self) -> schemas.NodeList:
        return self._parsed(schemas.NodeList, self.request("GET", "/v1/nodes"), "nodes")

    def node(self, name: str) -> schemas.NodeInfo:
        document = self.request("GET", f"/v1/nodes/{_segment(name)}")
        return self._parsed(schemas.NodeInfo, document, "node")

    def cordon(self, name: str) -> schemas.NodeInfo:
        document = self.request("POST", f"/v1/nodes/{_segment(name)}/cordon")
        return self._parsed(schemas.NodeInfo, document, "cordon")

    def uncordon(self, name: str) -> schemas.NodeInfo:
        document = self.request("POST", f"/v1/nodes/{_segment(name)}/uncordon")
        return self._parsed(schemas.NodeInfo, document, "uncordon")

    def drain(self, name: str, *, grace_s: float, timeout_s: float) -> schemas.DrainReport:
        document = self.request(
            "POST",
            f"/v1/nodes/{_segment(name)}/drain",
            body={"grace_s": grace_s},
            timeout_s=timeout_s,
        )
        return self._parsed(schemas.DrainReport, document, "drain")

    def images(self) -> schemas.ImageList:
        return self._parsed(schemas.ImageList, self.request("GET", "/v1/images"), "images")

    def add_image(self, body: dict[str, Any]) -> schemas.Image:
        return self._parsed(
            schemas.Image, self.request("POST", "/v1/images", body=body), "images add"
        )

    def import_oci(self, path: str, name: str | None = None) -> schemas.Image:
        body: dict[str, Any] = {"path": path}
        if name is not None:
            body["name"] = name
        document = self.request("POST", "/v1/images/oci", body=body)
        return self._parsed(schemas.Image, document, "images import-oci")


def _field(field: object) -> str | None:
    """A problem's ``field`` as the request's own: ``query.state`` → ``state``."""
    if not isinstance(field, str) or not field:
        return None
    head, _, rest = field.partition(".")
    return rest if head in ("query", "path", "body") and rest else field


def _outcome(method: str, error: httpx.HTTPError) -> str:
    """What a failed request leaves unknown: a change sent but never answered may have been
    made (a create may have booted, a stop may have stopped) — said, so nobody assumes not."""
    unsent = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
    if method == "GET" or isinstance(error, unsent):
        return ""
    return f" (the outcome of the {method} is unknown: it may have been done)"


def _in_progress(response: httpx.Response) -> float | None:
    """How long to wait before asking again when ``response`` says the same request's first
    attempt is still under way (``409 idempotency_in_progress``); ``None`` otherwise."""
    if response.status_code != 409:
        return None
    if not str(_problem(response).get("type", "")).endswith("/idempotency_in_progress"):
        return None
    try:
        after = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        after = 1.0
    return min(max(after, 0.05), MAX_RETRY_AFTER_S)


def _segment(value: str) -> str:
    """``value`` as one path segment (a node named ``a/b`` stays one segment)."""
    return quote(value, safe="")


def _reason(error: httpx.HTTPError) -> str:
    """The innermost cause's words: ``[Errno 111] Connection refused`` → ``connection refused``."""
    cause: BaseException = error
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
    text = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
    return one_line(str(text)).lower() if isinstance(text, str) else type(cause).__name__
