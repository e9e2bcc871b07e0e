"""Redis URLs: which ones streamkit takes, their parts, TLS options, passwords masked.

Pure (no trio, no Redis client): the Trio side and Spark's executors check, open and
show URLs with it alike, and so connect over TLS with the same checks. Which URL is in
use (named by errors raised without one) is :func:`streamkit._errors.current_url`.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import urllib.parse

import attrs

from ._errors import ConfigError

__all__ = [
    "CLUSTER_SCHEMES",
    "SCHEMES",
    "TLS_ARGUMENTS",
    "TlsOptions",
    "check_redis_url",
    "credentials_refused",
    "is_cluster_url",
    "mask_url",
    "masked_repr",
    "password_required",
    "seed_url",
    "tls_handshake_failed",
    "tls_options",
    "tls_refusal",
    "unknown_host",
    "without_tls_arguments",
]

SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

# ---------------------------------------------------------------------- masking

_MASK = "***"
# Query arguments whose values are masked: their names, decoded, lower-cased and
# without separators, hold one of these (password, passwd, pwd, ssl_password,
# auth_token, client_secret, api-key, credentials, ...), or are a user name.
_SECRET_WORDS = ("pass", "pwd", "secret", "token", "auth", "credential", "apikey", "privatekey")
_USER_NAMES = ("user", "username")


def mask_url(url: str) -> str:
    """Return ``url`` with every password replaced by ``***``, for messages and logs.

    Masks ``user:password@``, ``:password@`` and a lone ``secret@`` (which is at best
    a user name, more likely a password put in the wrong place), percent-encoded or
    not, and even when an unencoded ``/``, ``?`` or ``#`` in the password keeps the
    URL from parsing: everything from the scheme up to the last ``@`` is the
    credentials part. Password-like query arguments (``password=``, ``pwd=``,
    ``auth_token=``, ``client_secret=``, ...) are masked too, their names decoded
    first as clients decode them (``?pass%77ord=`` is a password).
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    at = rest.rfind("@")
    if at >= 0:
        credentials = rest[:at]
        user, colon, _ = credentials.partition(":")
        masked = f"{user}:{_MASK}" if colon else _MASK
        rest = masked + rest[at:]
    rest = _mask_query(rest)
    return f"{scheme}{separator}{rest}" if separator else rest


def _mask_query(rest: str) -> str:
    """``rest`` (a URL past its scheme) with its password-like query arguments masked."""
    before, question, query = rest.partition("?")
    if not question:
        return rest
    query, hash_, fragment = query.partition("#")
    arguments = []
    for argument in query.split("&"):
        name, equals, _ = argument.partition("=")
        arguments.append(f"{name}={_MASK}" if equals and _is_secret(name) else argument)
    return f"{before}?{'&'.join(arguments)}{hash_}{fragment}"


def _is_secret(name: str) -> bool:
    words = re.sub(r"[^a-z0-9]", "", urllib.parse.unquote_plus(name).lower())
    return words in _USER_NAMES or any(word in words for word in _SECRET_WORDS)


def masked_repr(url: str) -> str:
    """``repr(url)`` with its passwords masked: for the ``repr=`` of attrs fields."""
    return repr(mask_url(url))


# --------------------------------------------------------------------- checking


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def check_redis_url(url: object, *, setting: str = "redis_url") -> None:
    """Check that ``url`` is a Redis URL streamkit can use.

    ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS),
    ``unix:///path/to/socket[?db=N]``, or ``redis+cluster://[[user]:password@]host[:port]``
    (``rediss+cluster://`` for TLS) for a Redis Cluster, naming any one of its nodes;
    a password holding ``@``, ``/``, ``:`` and the like must be percent-encoded
    (``%40``, ``%2F``, ``%3A``).

    Error handling:
        :class:`ConfigError` naming ``setting``, with the masked URL and what to
        write instead: no scheme (``127.0.0.1:6379``: use ``redis://127.0.0.1:6379``),
        another scheme, no host, a port that is not a number, or a path that is not
        a database number (``redis://host/abc``), a database other than 0 on a cluster.
    """
    if not isinstance(url, str):
        raise ConfigError(setting, f"must be a redis:// URL, got {url!r}")
    masked = mask_url(url)
    if "://" not in url:
        raise ConfigError(
            setting,
            f"{masked!r} is not a URL; write redis://{masked} (rediss:// for TLS, "
            f"unix:///path for a socket)",
        )
    scheme = url.partition("://")[0].lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            setting,
            f"{masked!r}: expected redis://, rediss://, unix:// or redis+cluster://, "
            f"not {scheme}://",
        )
    parts = urllib.parse.urlsplit(url)
    if scheme == "unix":
        if not parts.path:
            raise ConfigError(setting, f"{masked!r}: expected unix:///path/to/socket")
        return
    rest = url.partition("://")[2]
    if "@" in parts.path or "@" in parts.query or "@" in parts.fragment:
        raise ConfigError(
            setting,
            f"{masked!r}: the password holds a character that ends it early; "
            f"percent-encode it (@ as %40, / as %2F, : as %3A, ? as %3F, # as %23)",
        )
    if not parts.hostname and not rest.startswith("/"):
        raise ConfigError(setting, f"{masked!r}: no host; expected redis://host[:port][/db]")
    try:
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError:
        raise ConfigError(
            setting,
            f"{masked!r}: the port is not a number; expected redis://host[:port][/db] "
            f"(percent-encode a password holding ':')",
        ) from None
    tls_options(url, setting=setting)
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ConfigError(
            setting,
            f"{masked!r}: the path must be a database number (redis://host:6379/0), got /{path}",
        )
    if scheme in CLUSTER_SCHEMES and path and int(path) != 0:
        raise ConfigError(
            setting, f"{masked!r}: a Redis Cluster has database 0 only; drop the /{path}"
        )


def seed_url(url: str) -> str:
    """The plain ``redis://`` (``rediss://``) URL of a cluster URL's node."""
    scheme, _, rest = url.partition("://")
    return f"{scheme.lower().removesuffix('+cluster')}://{rest}"


# -------------------------------------------------------------------------- TLS

#: The query arguments of a ``rediss://`` URL that say how the server is checked.
TLS_ARGUMENTS = (
    "ssl_cert_reqs",
    "ssl_check_hostname",
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
)
_CERT_REQS = {"required": True, "optional": True, "none": False}
_BOOLEANS = {
    **dict.fromkeys(("true", "yes", "on", "1"), True),
    **dict.fromkeys(("false", "no", "off", "0"), False),
}
# The checks turned off that this process has warned about.
_warned: set[str] = set()

log = logging.getLogger("streamkit.redis")


@attrs.frozen(kw_only=True)
class TlsOptions:
    """How the connections of a ``rediss://`` URL check the server (see :func:`tls_options`).

    Attributes:
        verify: check the server's certificate chain against the trusted CAs
            (``ssl_cert_reqs=none`` turns it off, and host name checking with it).
        check_hostname: check that the certificate is for the host connected to
            (``ssl_check_hostname=false`` turns it off alone).
        ca_certs: a CA file or directory trusted besides the system's (``ssl_ca_certs``).
        certfile: a client certificate (``ssl_certfile``), for servers that ask.
        keyfile: its private key (``ssl_keyfile``).
    """

    verify: bool = True
    check_hostname: bool = True
    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    def context(self, *, setting: str = "redis_url") -> ssl.SSLContext:
        """An SSL context that checks the server as these options say.

        Error handling:
            :class:`ConfigError` naming ``setting`` when a file cannot be loaded.
        """
        context = ssl.create_default_context()
        try:
            if self.ca_certs:
                where = "capath" if os.path.isdir(self.ca_certs) else "cafile"
                context.load_verify_locations(**{where: self.ca_certs})
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                setting, f"ssl_ca_certs={self.ca_certs}: cannot load it ({_why(exc)})"
            ) from exc
        try:
            if self.certfile:
                context.load_cert_chain(self.certfile, self.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                setting, f"ssl_certfile={self.certfile}: cannot load it ({_why(exc)})"
            ) from exc
        context.check_hostname = self.verify and self.check_hostname
        context.verify_mode = ssl.CERT_REQUIRED if self.verify else ssl.CERT_NONE
        return context

    def warn_once(self, url: str) -> None:
        """Warn, once per process, that a check is off for the server at ``url``."""
        if not self.verify:
            _warn_once(
                "ssl_cert_reqs=none",
                "TLS certificate checking is off for Redis at %s (ssl_cert_reqs=none in the "
                "URL): the connection is encrypted, but anyone on the network path can pose "
                "as the server",
                url,
            )
        elif not self.check_hostname:
            _warn_once(
                "ssl_check_hostname=false",
                "TLS host name checking is off for Redis at %s (ssl_check_hostname=false in "
                "the URL): any server with a certificate from a trusted CA can pose as this one",
                url,
            )


def _why(exc: OSError | ssl.SSLError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _warn_once(check: str, message: str, url: str) -> None:
    if check not in _warned:
        _warned.add(check)
        log.warning(message, mask_url(url))


def tls_options(url: str, *, setting: str = "redis_url") -> TlsOptions | None:
    """The TLS options of ``url``, ``None`` for a URL without TLS.

    A ``rediss://`` (``rediss+cluster://``) URL checks the server's certificate chain
    and host name unless its query says otherwise: ``ssl_cert_reqs=none`` turns both
    checks off, ``ssl_check_hostname=false`` the host name check alone
    (``ssl_cert_reqs=required`` and ``optional`` keep them). ``ssl_ca_certs``,
    ``ssl_certfile`` and ``ssl_keyfile`` name files.

    Error handling:
        :class:`ConfigError` naming ``setting`` for a value it does not know.
    """
    if not url.lower().startswith(("rediss:", "rediss+cluster:")):
        return None
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    given = {name: values[-1] for name, values in query.items() if name in TLS_ARGUMENTS}
    masked = mask_url(url)
    reqs = given.get("ssl_cert_reqs", "required").lower()
    if reqs not in _CERT_REQS:
        raise ConfigError(
            setting, f"{masked!r}: ssl_cert_reqs must be required, optional or none, not {reqs!r}"
        )
    hostname = given.get("ssl_check_hostname", "true").lower()
    if hostname not in _BOOLEANS:
        raise ConfigError(
            setting, f"{masked!r}: ssl_check_hostname must be true or false, not {hostname!r}"
        )
    return TlsOptions(
        verify=_CERT_REQS[reqs],
        check_hostname=_BOOLEANS[hostname],
        ca_certs=given.get("ssl_ca_certs") or None,
        certfile=given.get("ssl_certfile") or None,
        keyfile=given.get("ssl_keyfile") or None,
    )


def without_tls_arguments(url: str) -> str:
    """``url`` without its :data:`TLS_ARGUMENTS`, which clients are then given as
    options (so that no client reads them its own way)."""
    parts = urllib.parse.urlsplit(url)
    if not parts.query:
        return url
    kept = [
        item
        for item in parts.query.split("&")
        if urllib.parse.unquote_plus(item.partition("=")[0]) not in TLS_ARGUMENTS
    ]
    return urllib.parse.urlunsplit(parts._replace(query="&".join(kept)))


_MISMATCH = re.compile(r"not valid for '([^']*)'")


def tls_refusal(error: ssl.SSLCertVerificationError, url: str, *, setting: str) -> ConfigError:
    """The one-line error for a server certificate that failed the checks."""
    masked = mask_url(url)
    reason = error.verify_message or str(error)
    mismatch = _MISMATCH.search(reason)
    if mismatch is not None:
        return ConfigError(
            setting,
            f"the TLS certificate of Redis at {masked} is not valid for host "
            f"{mismatch[1]!r}: connect by a host name the certificate lists, or give the "
            f"server a certificate for {mismatch[1]}",
        )
    return ConfigError(
        setting,
        f"the TLS certificate of Redis at {masked} was refused ({reason}): "
        f"give the CA with ?ssl_ca_certs=/path/ca.pem",
    )


# ------------------------------------------------------------- failures to connect
# The one-line errors for connections that retrying cannot cure, worded once for the
# Trio layer and the redis-py layer (Spark, the blocking and asyncio clients).

_PERCENT_ENCODE = "percent-encode @ / : ? # in it as %40 %2F %3A %3F %23"


def password_required(url: str, *, setting: str) -> ConfigError:
    """Redis asks for a password the URL does not give."""
    return ConfigError(
        setting,
        f"Redis at {mask_url(url)} requires a password: give it in the URL, "
        f"redis://:PASSWORD@host:port ({_PERCENT_ENCODE})",
    )


def credentials_refused(url: str, reason: str, *, setting: str) -> ConfigError:
    """Redis refused the URL's user name or password."""
    return ConfigError(
        setting,
        f"Redis at {mask_url(url)} refused the user name or password in the URL ({reason}): "
        f"check them ({_PERCENT_ENCODE})",
    )


def tls_handshake_failed(url: str, reason: str, *, setting: str) -> ConfigError:
    """The TLS handshake failed for another reason than the certificate's checks."""
    return ConfigError(
        setting,
        f"the TLS handshake with Redis at {mask_url(url)} failed ({reason}): is the "
        f"server speaking TLS? Use redis:// for a plain server, rediss:// for TLS",
    )


def unknown_host(url: str, reason: str | None, *, setting: str) -> ConfigError:
    """The URL's host name does not exist."""
    return ConfigError(setting, f"unknown host in {mask_url(url)} ({reason}): check the host name")
