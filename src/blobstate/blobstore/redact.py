"""Secrets kept out of messages: :func:`redact` masks, with ``***``, every secret a blob store URL or an
endpoint can carry, in a URL alone or anywhere in the text of a message.

It masks:

* a URL's userinfo, user and password both: ``s3://KEY:SECRET@bucket/p`` is ``s3://***@bucket/p`` and
  ``http://user:password@host:9000`` is ``http://***@host:9000`` (also when the password holds a ``/``,
  as AWS secrets may, which a URL parser reads as the start of the path). The one userinfo kept is an
  Azure URL's container (``az://container@account.blob.core.windows.net/p``, ``abfss://``, ``wasbs://``),
  when it is a valid container name;
* in a URL's query, the value of every parameter named as a secret: ``secret_access_key``,
  ``session_token``, ``access_key_id``, ``sas_token``, ``account_key``, ``connection_string``, a SAS
  ``sig`` and any name containing ``secret``, ``token``, ``key``, ``passw``, ``pwd``, ``sig``,
  ``credential`` or ``auth``; in every other parameter, a URL given as the value (``endpoint_url=``
  ``http://user:pass@host``, percent-encoded or not) is redacted in turn;
* outside URLs, ``name=value`` pairs whose name says secret (a connection string's ``AccountKey=...``
  and ``SharedAccessSignature=...``, ``sig=...``, ``Signature=...``, ``password=...``) and a bare
  ``user:password@host`` (botocore quotes an invalid bucket name ``KEY:SECRET@bucket`` so).

It recognizes these forms, not the secrets' values: code never puts a secret value into a message on
purpose; this is what keeps one out when it hides in a URL, an endpoint or a library's error text.
"""

from __future__ import annotations

import contextlib
import re
from urllib.parse import quote, unquote

from blobstate.errors import BlobStoreError

MASK = "***"
"""What a secret is replaced with."""

_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*)://(\S*)")
_TRAILING = "'\")]}>,.:;!"
"""Punctuation a message puts right after a URL (a closing quote or bracket), kept out of the URL."""
_AZURE_SCHEMES = frozenset({"az", "abfs", "abfss", "wasb", "wasbs"})
_CONTAINER = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]|\$root")
_SECRET_PARAM = re.compile(r"secret|token|key|passw|pwd|sig|credential|auth|connection_?string", re.I)
_PAIR = re.compile(r"(?<![\w.\-])([\w.\-]{1,64})=([^\s&;'\"]+)")
_SECRET_PAIR_NAME = re.compile(
    r"secret|token|passw|signature|accountkey|account_key|connection_?string", re.I
)
_BARE_USERINFO = re.compile(r"(?<![\w/:@*.%+\-])[^\s/?#'\"@:=&;,()<>\[\]]+:(?!//)[^\s?#'\"@]+@(?=[\w\[])")


def redact(text: str) -> str:
    """``text`` (a URL, an endpoint or a whole message) with every secret a URL can carry masked.

    See the module's docstring for the forms it masks. Idempotent; text without such forms is returned
    unchanged.
    """
    text = _URL.sub(_redact_url, text)
    text = _PAIR.sub(_mask_pair, text)
    return _BARE_USERINFO.sub(f"{MASK}@", text)


def _redact_url(match: re.Match[str]) -> str:
    scheme, rest = match.group(1), match.group(2)
    body = rest.rstrip(_TRAILING)
    tail = rest[len(body) :]
    body = _mask_userinfo(scheme.lower(), body)
    location, question, query = body.partition("?")
    if question:
        query = "".join(_mask_parameter(part) for part in re.split(r"([&;])", query))
    return f"{scheme}://{location}{question}{query}{tail}"


def _mask_pair(match: re.Match[str]) -> str:
    """A ``name=value`` outside a URL's query, its value masked if the name says secret."""
    name, value = match.group(1), match.group(2)
    if name.lower() == "sig" or _SECRET_PAIR_NAME.search(name):
        return f"{name}={MASK}{value[len(value.rstrip(_TRAILING)) :]}"
    return match.group(0)


def _mask_userinfo(scheme: str, body: str) -> str:
    """``body`` (what follows ``scheme://``) with its userinfo masked."""
    authority = re.split(r"[/?#]", body, maxsplit=1)[0]
    if "@" in authority:
        userinfo, _, _ = authority.rpartition("@")
        if scheme in _AZURE_SCHEMES and _CONTAINER.fullmatch(userinfo):
            return body  # az://container@account...: the container, not a user
        return f"{MASK}@{body[len(userinfo) + 1 :]}"
    host, colon, port = authority.rpartition(":")
    if colon and host and not port.isdigit() and "@" in body:
        # user:pass/word@host: the parser's authority ends at the password's "/"; mask up to the last "@"
        return f"{MASK}@{body.rpartition('@')[2]}"
    return body


def _mask_parameter(part: str) -> str:
    """One ``name=value`` of a query (or a separator) with a secret value or a URL's secrets masked."""
    name, equals, value = part.partition("=")
    if not equals:
        return part
    if _SECRET_PARAM.search(unquote(name)):
        return f"{name}={MASK}"
    plain = unquote(value)
    if "@" in plain or "=" in plain:
        masked = redact(plain)
        if masked != plain:
            return f"{name}={masked if plain == value else quote(masked, safe='*')}"
    return part


class RedactedError(BlobStoreError):
    """Stands in, in the chain of an error blobstate raised, for a library's exception whose text showed
    a secret that its arguments do not hold (a ``__str__`` of its own): the library exception's type and
    text, redacted, with its traceback and what it was raised from."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(f"{kind}: {text}")


def scrub_chain(error: BaseException) -> BaseException:
    """Keep secrets out of every exception ``error`` was raised from or while handling.

    A blob store error names its object and store with :func:`redact`'s care, and is raised ``from`` the
    library's exception, whose text may quote a request URL with its SAS (``...?sv=...&sig=...``) or a
    connection string. A traceback (a Spark task's log, a driver's, ``--debug``) prints that whole chain
    (``__cause__`` and ``__context__``, recursively). Each exception in it gets its arguments redacted in
    place (and, for an argument that is itself an exception, that one's), and its ``message`` and
    ``exc_msg`` (Azure's) when they are strings; one whose text still shows a secret is replaced in the
    chain by a :class:`RedactedError`. Returns ``error`` itself, its arguments redacted too (it keeps its
    type, so callers catching it by type still do; blobstate's own errors are safe as made).
    """
    safe_links: dict[int, BaseException] = {}
    """Each exception of the chain already scrubbed, by id: itself or its stand-in (an exception is often
    both the ``__cause__`` and the ``__context__`` of the one raised from it, and a chain may loop)."""

    def scrubbed(link: BaseException) -> BaseException:
        safe_links[id(link)] = link
        _redact_arguments(link, set())
        for attribute in ("__cause__", "__context__"):
            below = getattr(link, attribute)
            if below is None:
                continue
            if id(below) not in safe_links:
                safe_links[id(below)] = _with_safe_text(scrubbed(below))
            setattr(link, attribute, safe_links[id(below)])
        return link

    return scrubbed(error)


def _with_safe_text(link: BaseException) -> BaseException:
    """``link``, or a :class:`RedactedError` in its place when its text (its arguments already redacted)
    still shows a secret."""
    try:
        text = str(link)
    except Exception:  # a text that cannot be built shows nothing
        return link
    safe = redact(text)
    if safe == text:
        return link
    kind = f"{type(link).__module__}.{type(link).__qualname__}"
    stand_in = RedactedError(kind, safe).with_traceback(link.__traceback__)
    stand_in.__cause__, stand_in.__context__ = link.__cause__, link.__context__
    stand_in.__suppress_context__ = link.__suppress_context__
    return stand_in


def _redact_arguments(error: BaseException, seen: set[int]) -> None:
    """Redact ``error``'s string arguments, and those of the exceptions among them, in place."""
    if id(error) in seen:
        return
    seen.add(id(error))
    arguments = []
    changed = False
    for argument in error.args:
        if isinstance(argument, str):
            safe = redact(argument)
            changed = changed or safe != argument
            arguments.append(safe)
        else:
            if isinstance(argument, BaseException):
                _redact_arguments(argument, seen)
            arguments.append(argument)
    if changed:
        with contextlib.suppress(AttributeError, TypeError):
            error.args = tuple(arguments)
    for attribute in ("message", "exc_msg"):
        try:
            value = getattr(error, attribute, None)
            if isinstance(value, str) and redact(value) != value:
                setattr(error, attribute, redact(value))
        except Exception:  # a read-only or computed attribute: the chain's text is still checked
            pass
