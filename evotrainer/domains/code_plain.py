"""Plain data across the sandbox wall: a value becomes tagged JSON of builtin types only, and back.

`encode` runs inside the solution's sandboxed process; its output is only a *claim* of what the
solution returned, so it needs to be right for honest values, not safe. `decode` runs on the
trusted side and is the part that must hold: it accepts only the exact tagged shapes below and
builds fresh builtin objects (None, bool, int, float, complex, str, bytes, list, tuple, dict,
set, frozenset), so no object the solution made, and no class it defined, ever crosses.

An instance of a subclass (a Counter, a namedtuple, an IntEnum, or an `int` with a rigged
`__eq__`) is sent as the plain value its base type holds, read through the base type's own
methods: honest answers keep the equality they had, and a rigged comparison never runs. The class
is read with `type()`, which a `__class__` property cannot fake. Ints travel as hex text (no
digit limit on either side), floats as `float.hex` (exact, NaN and infinities included).

This file imports only the standard library: the sandboxed scripts get its source prepended.
"""

ENCODE_DEPTH = 64  # deeper values (or cycles) are not plain answers
_SEQ_TAGS = {"l": list, "t": tuple, "S": set, "F": frozenset}


class Unencodable(Exception):  # not EvotrainerError: this source runs where evotrainer is not importable
    """The value is not plain data (an unsupported type, too deep, a cycle)."""


def encode(value, depth=0):
    if depth > ENCODE_DEPTH:
        raise Unencodable("too deep")
    t = type(value)
    if value is None:
        return ["N"]
    if t is bool:
        return ["b", 1 if value else 0]
    if issubclass(t, int):
        return ["i", format(int.__int__(value), "x")]
    if issubclass(t, float):
        return ["f", float.hex(float.__float__(value))]
    if issubclass(t, complex):
        return ["c", float.hex(complex.real.__get__(value)), float.hex(complex.imag.__get__(value))]
    if issubclass(t, str):
        return ["s", str.__str__(value)]
    if issubclass(t, bytes):
        return ["y", bytes.hex(value)]
    if issubclass(t, dict):
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(value)]]
    for tag, seq in _SEQ_TAGS.items():
        if issubclass(t, seq):
            return [tag, [encode(v, depth + 1) for v in seq.__iter__(value)]]
    if t.__module__ == "numpy" and getattr(value, "ndim", None) == 0:  # a numpy scalar: its Python value
        return encode(value.item(), depth + 1)
    raise Unencodable(t.__name__)


def decode(node, depth=0):
    """The builtin value a tagged node stands for; ValueError on anything not exactly our shape."""
    if depth > ENCODE_DEPTH + 1 or type(node) is not list or not node or type(node[0]) is not str:
        raise ValueError("not a tagged node")
    tag, args = node[0], node[1:]
    if tag == "N" and not args:
        return None
    if tag == "b" and len(args) == 1 and type(args[0]) is int and args[0] in (0, 1):
        return bool(args[0])
    if tag == "i" and len(args) == 1 and type(args[0]) is str and len(args[0]) <= 1 << 20:
        return int(args[0], 16)
    if tag == "f" and len(args) == 1 and type(args[0]) is str:
        return float.fromhex(args[0])
    if tag == "c" and len(args) == 2 and all(type(a) is str for a in args):
        return complex(float.fromhex(args[0]), float.fromhex(args[1]))
    if tag == "s" and len(args) == 1 and type(args[0]) is str:
        return str(args[0])
    if tag == "y" and len(args) == 1 and type(args[0]) is str:
        return bytes.fromhex(args[0])
    if tag == "d" and len(args) == 1 and type(args[0]) is list:
        out = {}
        for pair in args[0]:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("bad dict item")
            out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
        return out
    if tag in _SEQ_TAGS and len(args) == 1 and type(args[0]) is list:
        return _SEQ_TAGS[tag](decode(v, depth + 1) for v in args[0])
    raise ValueError(f"unknown tag {tag[:8]!r}")
