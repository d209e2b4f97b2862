"""HTTP calls of the harnesses with the standard library (no session to keep or reset), and
waiting for an endpoint to answer 200."""

import json
import urllib.error
import urllib.request

from .wait import wait_until


def call(method, url, body=None, headers=None, timeout=30):
    """(status, body text) of one request; an HTTP error status is an answer, a connection
    error (refused, reset, timeout) raises OSError. `body`: bytes, text, or a dict/list sent
    as JSON."""
    headers = dict(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        headers.setdefault("content-type", "application/json")
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def call_json(method, url, body=None, timeout=30):
    """(status, decoded JSON or the text when it is not JSON, None when empty)."""
    status, text = call(method, url, body, timeout=timeout)
    if not text:
        return status, None
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def answers(url, timeout=2):
    """Whether `url` answers 200 now."""
    try:
        return call("GET", url, timeout=timeout)[0] == 200
    except OSError:
        return False


def wait_http(url, timeout, what, child=None, interval=0.3):
    """Waits until `url` answers 200. With `child` (a procs.Child), a process that exited
    meanwhile ends the wait at once (procs.Exited), with the last error it logged."""
    def ready():
        if child is not None:
            child.check_running(f"before {url} answered")
        return answers(url)

    return wait_until(ready, timeout, f"{what} to answer 200 at {url}", interval=interval)
