"""Who may read the dashboard and the metrics: anyone who can reach a server bound to loopback,
and only holders of its access token when it is bound to any other address (or when the user
gave a token, wherever it is bound).

A token travels as ``Authorization: Bearer TOKEN`` (what a Prometheus scrape config's
``authorization`` section sends), as the query parameter ``?token=TOKEN`` (an address pasted into
a browser), or, for the dashboard only, in the cookie the dashboard sets when a page was opened
with the query parameter (so the page's own script, style sheet and snapshot fetches carry it
without the page knowing the token). Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs, quote

from batchline.errors import ConfigurationError

__all__ = [
    "MIN_TOKEN_LENGTH",
    "TOKEN_PARAMETER",
    "check_token",
    "cookie_name",
    "is_loopback",
    "new_token",
    "query_token",
    "required_token",
    "token_admits",
    "unauthorized_message",
    "with_token",
]

TOKEN_PARAMETER = "token"
"""The query parameter a browser passes the token in: ``http://host:port/?token=TOKEN``."""

MIN_TOKEN_LENGTH = 16
"""A shorter token is refused: the servers answer as fast as anyone asks, so a short one could
be guessed."""

_TOKEN_CHARACTERS = re.compile(r"[A-Za-z0-9._~+/=-]+")
"""Characters that pass unchanged in an ``Authorization`` header and in a cookie (RFC 6750's
token68 alphabet); ``secrets.token_urlsafe`` makes tokens of these."""

_COOKIE_PREFIX = "batchline_token_"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a host name) is this machine's loopback interface."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_token(token: object, what: str = "access_token") -> None:
    """Raise ``ConfigurationError`` unless ``token`` is None or a usable access token."""
    if token is None:
        return
    if not isinstance(token, str) or not _TOKEN_CHARACTERS.fullmatch(token) or len(token) < MIN_TOKEN_LENGTH:
        shown = f"a {type(token).__name__}" if not isinstance(token, str) else f"{len(token)} characters"
        raise ConfigurationError(
            f"{what} must be at least {MIN_TOKEN_LENGTH} characters of letters, digits and . _ ~ + / = - "
            f"(got {shown}); make one with: python -c 'import secrets; print(secrets.token_urlsafe())', "
            "or leave it out to have one made at start when the server is bound off loopback")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def required_token(host: str, given: str | None) -> str | None:
    """The token a server bound to ``host`` requires: the one given, else a new one when ``host``
    is not loopback (other machines can reach it), else none."""
    check_token(given)
    if given is not None:
        return given
    return None if is_loopback(host) else new_token()


def cookie_name(port: int) -> str:
    """The dashboard's cookie, named for its port: a browser sends a host's cookies to all its
    ports, and two dashboards on one host have different tokens."""
    return f"{_COOKIE_PREFIX}{port}"


def _presented(authorization: str | None, query: str, cookie_header: str | None,
               cookie: str | None) -> list[str]:
    """Every token a request carries, wherever it carries one."""
    found: list[str] = []
    if authorization:
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            found.append(credentials.strip())
    found.extend(parse_qs(query, keep_blank_values=False).get(TOKEN_PARAMETER, []))
    if cookie_header and cookie is not None:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(cookie_header)
        except CookieError:
            pass  # a malformed Cookie header carries no token; the other ways may still do
        if cookie in jar:
            found.append(jar[cookie].value)
    return found


def token_admits(expected: str | None, authorization: str | None, query: str, cookie_header: str | None = None,
                 cookie: str | None = None) -> bool:
    """Whether a request may be answered: always when no token is required, else when it carries
    ``expected`` in its ``Authorization`` header, its query string or (with ``cookie``, the
    name of the dashboard's cookie) its cookies."""
    if expected is None:
        return True
    want = expected.encode()
    # Every candidate is compared, in constant time each, so that which way carried it does not show in the timing.
    matches = [hmac.compare_digest(want, candidate.encode("utf-8", "replace"))
               for candidate in _presented(authorization, query, cookie_header, cookie)]
    return any(matches)


def query_token(query: str, expected: str) -> bool:
    """Whether the query string itself carries ``expected`` (the dashboard then sets its cookie)."""
    want = expected.encode()
    return any([hmac.compare_digest(want, value.encode("utf-8", "replace"))
                for value in parse_qs(query).get(TOKEN_PARAMETER, [])])


def with_token(url: str, token: str | None) -> str:
    """``url`` with ``?token=TOKEN`` added (as it is when ``token`` is None): the address to open."""
    if token is None:
        return url
    return f"{url}{'&' if '?' in url else '?'}{TOKEN_PARAMETER}={quote(token, safe='')}"


def unauthorized_message(what: str, url: str) -> str:
    """The body of a 401: what is missing and the ways to pass it."""
    return (f"The {what} at {url} needs its access token.\n"
            f"In a browser, open {with_token(url, 'TOKEN')}; a scraper or script sends the header "
            "'Authorization: Bearer TOKEN' (Prometheus: authorization: {credentials: TOKEN} in the scrape "
            "config).\nTOKEN is the access token the pipeline was given (StreamingContext(access_token=...), "
            "batchline run --access-token or BATCHLINE_ACCESS_TOKEN), or else the one it made at start: its "
            "start log line shows the address with it.\n")
