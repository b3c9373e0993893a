"""Make a failure reason that harness code could shape safe for a report, the store or a prompt.

Whatever a harness raises (or writes to its worker's pipe) is untrusted text: it may hold a
secret it read (`/proc/self/environ`, a key file), a dump of a file, terminal escapes, or lines
made to look like ours ("decision: promote"). `redact` is the one function the trusted side
applies to such text before it reaches a backtest report, the store or the LLM agent's prompt.
The rules, in order:

1. Text only: lone surrogates become `?`, ANSI escape sequences go, every other control or
   format character (C0, C1, DEL, bidi overrides, zero-width marks) becomes a space.
2. Secrets of the trusted process: the value of every environment variable whose name looks
   secret (KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL, AUTH, ...) and is 4 characters or longer,
   and of every other variable 8 characters or longer, becomes `$NAME`. A blanket rule, because
   what is identifying (a user name in a path, an internal host) cannot be listed in advance.
   Values that are paths are left to rule 3, which also hides where they point.
3. Absolute paths keep only their last part: `/home/me/ws/store.db` becomes `…/store.db`.
4. Token-like runs (20 or more characters of letters, digits and `_+/=-` with upper case, lower
   case and a digit, as API keys and base64 are) become `[redacted]`, and so does lower-case hex
   longer than a sha1 (a hex-encoded secret); commit shas and uuid hex ids stay readable.
5. One line: only the first line of the text is kept (the exception's type and message head);
   the rest, which is where a file dump or a traceback goes, is cut and counted. A trailing
   "(on rollout ID)" / "(on group ID)" on the last line, which the backtest adds, is kept.
6. At most `limit` characters (300), cut in the middle so that head and tail survive; backticks
   become `'` so that a Markdown code span holds the whole reason.

A harness that can read a secret can also encode it past any filter; what keeps secrets out of
harness reach is the worker boundary (no keys in its environment). This is the second line.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Mapping

MAX_CHARS = 300
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS\b|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE",
                          re.IGNORECASE)
_MIN_SECRET, _MIN_VALUE = 4, 8
# Settings, not secrets: replacing every "false" by $TOKENIZERS_PARALLELISM would only confuse.
_PLAIN_VALUES = frozenset({"true", "false", "yes", "no", "none", "null", "on", "off", "enabled",
                           "disabled", "auto", "default"})
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]"          # CSI: colours, cursor moves
                   r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks
                   r"|\x1b[P^_X][^\x1b]*(?:\x1b\\)?"     # DCS, PM, APC, SOS strings
                   r"|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]")
_LINE_BREAKS = re.compile(r"[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")
_PATH = re.compile(r"(?<![\w.~$/…-])~?(?:/[^\s/'\"`()\[\]{},;:=]+)*/(?=[^\s/'\"`()\[\]{},;:=])")
_TOKEN = re.compile(r"[A-Za-z0-9_+/=-]{20,}")
_HEX = re.compile(r"[0-9a-f]+")
_SUFFIX = re.compile(r"\s\(on (?:rollout|group) [^\s()]{1,256}\)$")


def _visible(text: str) -> str:
    """Rule 1: printable text; line breaks stay (rule 5 needs them), all else odd is a space."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = _ANSI.sub("", text)
    out = []
    for ch in text:
        if _LINE_BREAKS.match(ch):
            out.append("\n")
        elif ch == "\t" or unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(" ")
        else:
            out.append(ch)
    return "".join(out)


def _env_secrets(env: Mapping[str, str]) -> list[tuple[str, str]]:
    found = []
    for name, value in env.items():
        if not value.strip() or value.startswith(("/", "~/")) or value.lower() in _PLAIN_VALUES:
            continue
        if len(value) >= _MIN_VALUE or (_SECRET_NAME.search(name) and len(value) >= _MIN_SECRET):
            found.append((name, value))
    return sorted(found, key=lambda item: -len(item[1]))  # the longest first: one may hold another


def _token(match: re.Match) -> str:
    word = match.group(0)
    if any(c.isupper() for c in word) and any(c.islower() for c in word) and any(c.isdigit() for c in word):
        return "[redacted]"
    if len(word) > 40 and _HEX.fullmatch(word):  # longer than a sha1: a hex-encoded secret
        return "[redacted]"
    return word


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f" [… {len(text) - limit} chars cut …] "
    keep = max(0, limit - len(marker))
    head = keep * 2 // 3
    return text[:head] + marker + text[len(text) - (keep - head):] if keep - head else text[:head] + marker


def redact(text: object, limit: int = MAX_CHARS, env: Mapping[str, str] | None = None) -> str:
    """`text` as one safe line of at most about `limit` characters (see the module doc)."""
    try:
        text = text if isinstance(text, str) else str(text)
    except Exception:
        text = f"<unprintable {type(text).__name__}>"
    text = _visible(text)
    for name, value in _env_secrets(os.environ if env is None else env):
        if value in text:
            text = text.replace(value, f"${name}")
    text = _PATH.sub("…/", text)
    text = _TOKEN.sub(_token, text)
    lines = [line.strip() for line in text.split("\n")]
    lines = [line for line in lines if line] or [""]
    first = " ".join(lines[0].split())
    suffix = ""
    if len(lines) > 1:
        found = _SUFFIX.search(lines[-1])
        suffix = f" [{len(lines) - 1} more line(s) cut]" + (found.group(0) if found else "")
    else:
        found = _SUFFIX.search(first)
        if found:
            first, suffix = first[:found.start()], found.group(0)
    body = _cut(first, max(40, limit - len(suffix)))
    return (body + suffix).replace("`", "'")


__all__ = ["MAX_CHARS", "redact"]
