"""What an RTSP camera says when OpenCV cannot open it, and stream addresses without their passwords.

OpenCV's FFmpeg backend reports only "not opened": a wrong path, a wrong password and a camera that is off
look the same. When a stream will not open, edged asks the camera itself: one RTSP DESCRIBE (RFC 2326), with
the URL's user and password (Basic or Digest, as the camera asks), and reports its answer plainly (404: no
stream at that path; 401: the user name or password was refused) or that nothing answered.
"""

from __future__ import annotations

import hashlib
import re
import socket
from urllib.parse import unquote, urlsplit, urlunsplit

RTSP_PORT = 554


def redact_uri(uri: str) -> str:
    """A stream address fit for logs and status: the password in its user info replaced by `***`."""
    parts = urlsplit(uri) if "://" in uri else None
    if parts is None or parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def probe(uri: str, timeout: float = 3.0) -> str | None:
    """Why an rtsp:// stream does not open, in words, from the camera's own answer; None when it answers
    200 (OpenCV's trouble is elsewhere: codec, transport) or `uri` is not rtsp://."""
    parts = urlsplit(uri)
    if parts.scheme.lower() not in ("rtsp", "rtsps") or not parts.hostname:
        return None
    where = f"{parts.hostname}:{parts.port or RTSP_PORT}"
    bare = urlunsplit((parts.scheme, f"{parts.hostname}" + (f":{parts.port}" if parts.port else ""), parts.path,
                       parts.query, ""))  # fmt: skip
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    try:
        with socket.create_connection((parts.hostname, parts.port or RTSP_PORT), timeout=timeout) as sock:
            sock.settimeout(timeout)
            status, headers = _describe(sock, bare, 1, None)
            if status == 401 and (user or password):  # Unauthorized
                status, headers = _describe(sock, bare, 2, _authorization(headers, bare, user, password))
    except TimeoutError:
        return f"no RTSP answer from {where} within {timeout:g} s"
    except ConnectionRefusedError:
        return f"nothing listens on {where} (connection refused)"
    except OSError as exc:
        return f"cannot reach {where}: {exc.strerror or exc}"
    return _meaning(status, where, parts.path or "/", given_credentials=bool(user or password))


def _meaning(status: int | None, where: str, path: str, *, given_credentials: bool) -> str | None:
    """The camera's answer to DESCRIBE, in words (None for a success)."""
    if status is None:
        return f"{where} did not answer RTSP"
    meanings = {
        401: f"the camera at {where} refused "
        + ("the user name or password in the URL" if given_credentials else "no user name and password")
        + " (401 Unauthorized)",
        404: f"the camera at {where} has no stream at {path} (404 Not Found): check the path",
    }
    if status in meanings:
        return meanings[status]
    return f"the camera at {where} answered {status} to a DESCRIBE of {path}" if status >= 300 else None


def _describe(sock: socket.socket, uri: str, cseq: int, authorization: str | None) -> tuple[int | None, dict[str, str]]:
    request = f"DESCRIBE {uri} RTSP/1.0\r\nCSeq: {cseq}\r\nAccept: application/sdp\r\nUser-Agent: edged\r\n"
    if authorization:
        request += f"Authorization: {authorization}\r\n"
    sock.sendall((request + "\r\n").encode("utf-8"))
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:  # the headers; a body is not needed
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    lines = head.split("\r\n")
    match = re.match(r"RTSP/\d\.\d (\d{3})", lines[0]) if lines else None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), value.strip())
    return (int(match.group(1)) if match else None), headers


def _authorization(headers: dict[str, str], uri: str, user: str, password: str) -> str | None:
    """The Authorization header for the camera's WWW-Authenticate challenge (Basic or Digest, RFC 2617)."""
    challenge = headers.get("www-authenticate", "")
    if challenge.lower().startswith("basic"):
        import base64  # noqa: PLC0415

        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    if not challenge.lower().startswith("digest"):
        return None
    fields = dict(re.findall(r'(\w+)="?([^",]*)"?', challenge[6:]))
    realm, nonce = fields.get("realm", ""), fields.get("nonce", "")
    ha1 = hashlib.md5(f"{user}:{realm}:{password}".encode()).hexdigest()  # noqa: S324  (RTSP Digest is MD5)
    ha2 = hashlib.md5(f"DESCRIBE:{uri}".encode()).hexdigest()  # noqa: S324
    response = hashlib.md5(f"{ha1}:{nonce}:{ha2}".encode()).hexdigest()  # noqa: S324
    return f'Digest username="{user}", realm="{realm}", nonce="{nonce}", uri="{uri}", response="{response}"'
