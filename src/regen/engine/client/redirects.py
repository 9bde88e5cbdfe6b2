"""Which redirects a request follows. aiohttp would follow any of them to any host, and keep
the answer, which would then be stored as the endpoint's; regen sends every request with
redirects off and follows them itself, by this rule:

- to the endpoint's own origin (the scheme, host and port of `base_url`): followed;
- to a host listed in `[endpoint] follow_redirects_to` (over HTTPS, or the scheme of
  `base_url`): followed, the key and headers with it, since the user named that host;
- anywhere else: refused (`redirect`, which stops the run: it is the endpoint's setting,
  not the item's), and nothing is sent there.

A POST follows 307 and 308 only, which keep the method and body; a 301, 302 or 303 would turn
it into a GET, which no chat endpoint answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from yarl import URL

from regen.engine.client.errors import brief
from regen.errors import EndpointError

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5
"""Redirects followed for one request, beyond which it fails as a loop."""
_FIX = (
    "set [endpoint].base_url to where it points, or list its host in [endpoint].follow_redirects_to"
)


@dataclass(frozen=True, slots=True)
class RedirectPolicy:
    """Where one endpoint's requests may be redirected to."""

    origin: URL
    """The endpoint's own: scheme, host and port of its base URL."""
    hosts: tuple[tuple[str, int | None], ...] = ()
    """`follow_redirects_to`: host names, each with its port when one was given."""

    @classmethod
    def of(cls, base_url: str, follow_to: Iterable[str] = ()) -> RedirectPolicy:
        hosts = []
        for entry in follow_to:
            url = URL(f"//{entry}")
            hosts.append(((url.host or entry).lower(), url.explicit_port))
        return cls(URL(base_url).origin(), tuple(hosts))

    def _listed(self, url: URL) -> bool:
        host = (url.host or "").lower()
        scheme_ok = url.scheme in ("https", self.origin.scheme)
        return scheme_ok and any(h == host and p in (None, url.port) for h, p in self.hosts)

    def target(self, method: str, url: URL, status: int, location: str | None) -> URL:
        """Where a redirect of a request to `url` leads, when it may be followed; otherwise
        an EndpointError of class `redirect`, in one line that says what to change."""
        if not location:
            raise _refused(status, f"HTTP {status} redirect from {url} without a Location")
        try:
            to = url.join(URL(location))
            origin = to.origin()
        except ValueError:
            where = brief(location, 200)
            raise _refused(status, f"HTTP {status} redirect to {where}, not a URL") from None
        shown = brief(str(to), 200)
        if origin != self.origin and not self._listed(to):
            raise _refused(
                status,
                f"HTTP {status} redirect from {self.origin} to {shown}, another host: not "
                "followed (the request would go to, and the answer come from, a server the job "
                f"does not name); {_FIX}",
            )
        if method == "POST" and status not in (307, 308):
            raise _refused(
                status,
                f"HTTP {status} redirect to {shown}: not followed, as it would turn the request "
                "into a GET; set [endpoint].base_url to where it points",
            )
        return to


def too_many(url: URL) -> EndpointError:
    """The error of a request redirected more than MAX_REDIRECTS times."""
    return _refused(None, f"more than {MAX_REDIRECTS} redirects from {brief(str(url), 200)}")


def _refused(status: int | None, message: str) -> EndpointError:
    err = EndpointError("redirect", message, status=status)
    err.unbilled = True  # the redirect came back as the answer: nothing was generated
    return err
