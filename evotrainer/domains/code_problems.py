"""The code domain's procedural problem families: each draws parameters from a key's RNG and
renders a problem text, a reference solution and the inputs its hidden asserts run on."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """One kind of problem. `make(params, rng)` -> (entry, args, text, reference code, test inputs)."""

    name: str
    level: int
    draw: Callable[[random.Random], dict[str, Any]]
    make: Callable[[dict[str, Any], random.Random], tuple[str, str, str, str, list[tuple]]]


def _ints(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _lists(rng: random.Random, n: int, lo: int = -20, hi: int = 20, size: tuple[int, int] = (0, 8)) -> list[tuple]:
    return [(_ints(rng, rng.randint(*size), lo, hi),) for _ in range(n)]


def _words(rng: random.Random, n: int) -> list[tuple]:
    vocab = ["a", "an", "cat", "tree", "house", "python", "go", "apple", "banana", "sky", "river", "zebra",
             "code", "test", "lamp", "mountain", "io", "sun"]
    return [(" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 7))),) for _ in range(n)]


def _strings(rng: random.Random, n: int, alphabet: str, size: tuple[int, int] = (0, 12)) -> list[tuple]:
    return [("".join(rng.choice(alphabet) for _ in range(rng.randint(*size))),) for _ in range(n)]


def _affine(p, rng):
    a, b = p["a"], p["b"]
    tail = f"plus {b}" if b >= 0 else f"minus {-b}"
    return ("scale_and_shift", "x", f"returns `x` multiplied by {a}, {tail}",
            f"def scale_and_shift(x):\n    return x * {a} + ({b})\n", [(x,) for x in _ints(rng, 6, -50, 50)])


def _clamp(p, rng):
    lo, hi = p["lo"], p["hi"]
    return ("clamp", "x", f"returns `x` limited to the range [{lo}, {hi}]: values below {lo} become {lo}, "
            f"values above {hi} become {hi}",
            f"def clamp(x):\n    return max({lo}, min({hi}, x))\n",
            [(lo - 5,), (hi + 3,), (lo,), (hi,)] + [(x,) for x in _ints(rng, 4, lo - 10, hi + 10)])


def _count_char(p, rng):
    c = p["c"]
    return ("count_char", "s", f"returns how many times the character {c!r} appears in the string `s`",
            f"def count_char(s):\n    return s.count({c!r})\n", [("",)] + _strings(rng, 6, "abcdexyziou "))


def _is_multiple(p, rng):
    k = p["k"]
    return ("is_multiple", "n", f"returns True if the integer `n` is divisible by {k}, otherwise False",
            f"def is_multiple(n):\n    return n % {k} == 0\n", [(0,), (k,), (k * 7,)] + [(x,) for x in _ints(rng, 5, -60, 200)])


def _last_digits(p, rng):
    k = p["k"]
    return ("last_digits", "n", f"returns the number formed by the last {k} digit(s) of the non-negative "
            f"integer `n` (for example, leading zeros are dropped: the result is an int)",
            f"def last_digits(n):\n    return n % {10 ** k}\n", [(0,), (7,)] + [(x,) for x in _ints(rng, 5, 0, 999999)])


_WRAPS = (("<", ">"), ("[", "]"), ("**", "**"), ("(", ")"), ("'", "'"))


def _wrap(p, rng):
    left, right = _WRAPS[p["w"]]
    r = p["r"]
    return ("wrap", "s", f"returns the string `s` with {left!r} repeated {r} time(s) before it and {right!r} "
            f"repeated {r} time(s) after it",
            f"def wrap(s):\n    return {left!r} * {r} + s + {right!r} * {r}\n", [("",)] + _strings(rng, 5, "abcxyz"))


_SEPS = ("-", ", ", "", "|")


def _repeat_join(p, rng):
    n, sep = p["n"], _SEPS[p["sep"]]
    return ("repeat_join", "s", f"returns {n} copies of the string `s` joined by the separator {sep!r}",
            f"def repeat_join(s):\n    return {sep!r}.join([s] * {n})\n", [("",)] + _strings(rng, 5, "abc", (1, 4)))


def _sum_multiples(p, rng):
    k, neg = p["k"], p["not"]
    return ("sum_multiples", "nums", f"returns the sum of the elements of the list `nums` that are "
            f"{'not ' if neg else ''}divisible by {k}",
            f"def sum_multiples(nums):\n    return sum(x for x in nums if x % {k} {'!=' if neg else '=='} 0)\n",
            [([],)] + _lists(rng, 6, -30, 60))


_COMPARE = {">": "strictly greater than", ">=": "greater than or equal to", "<": "strictly less than",
            "<=": "less than or equal to"}


def _keep_above(p, rng):
    t, op = p["t"], p["op"]
    return ("keep_if", "nums", f"returns a new list with the elements of `nums` that are {_COMPARE[op]} {t}, "
            "in their original order",
            f"def keep_if(nums):\n    return [x for x in nums if x {op} {t}]\n",
            [([],), ([t - 1, t, t + 1],)] + _lists(rng, 5, -15, 35))


def _long_words(p, rng):
    n, short = p["n"], p["short"]
    return ("pick_words", "text", f"returns the list of words of the string `text` (split on whitespace) "
            f"that have {'at most' if short else 'more than'} {n} characters, in order",
            f"def pick_words(text):\n    return [w for w in text.split() if len(w) {'<=' if short else '>'} {n}]\n",
            [("",), (" ".join("x" * k for k in (n - 1, n, n + 1) if k > 0),)] + _words(rng, 5))


def _running_total(p, rng):
    s = p["s"]
    return ("running_total", "nums", f"returns the list of running totals of `nums`, starting from {s}: "
            f"element i of the result is {s} plus the sum of nums[0..i]",
            f"def running_total(nums):\n    out, total = [], {s}\n    for x in nums:\n        total += x\n"
            f"        out.append(total)\n    return out\n", [([],)] + _lists(rng, 6))


def _index_of(p, rng):
    which, ext = p["which"], p["ext"]
    fn = "max" if ext == "largest" else "min"
    body = (f"    target = {fn}(nums)\n    return nums.index(target)\n" if which == "first" else
            f"    target = {fn}(nums)\n    return len(nums) - 1 - nums[::-1].index(target)\n")
    return ("index_of_extreme", "nums", f"returns the index of the {which} occurrence of the {ext} value in the "
            f"non-empty list `nums`", "def index_of_extreme(nums):\n" + body,
            [([5, 5, 1, 5],), ([2, 2, 2],)] + _lists(rng, 5, -5, 5, (1, 9)))


def _dedupe(p, rng):
    by_abs = p["abs"]
    what = "absolute value" if by_abs else "value"
    key = "abs(x)" if by_abs else "x"
    return ("dedupe", "nums", f"returns the elements of `nums` without repeats, keeping the first element of each "
            f"{what} and the original order",
            f"def dedupe(nums):\n    seen, out = set(), []\n    for x in nums:\n        if {key} not in seen:\n"
            f"            seen.add({key})\n            out.append(x)\n    return out\n",
            [([],), ([3, -3, 3],)] + _lists(rng, 5, -4, 4, (0, 10)))


def _scale_list(p, rng):
    a, b = p["a"], p["b"]
    return ("scale_list", "nums", f"returns a new list where each element x of `nums` becomes x * {a} + ({b})",
            f"def scale_list(nums):\n    return [x * {a} + ({b}) for x in nums]\n", [([],)] + _lists(rng, 5))


def _count_in_range(p, rng):
    lo, hi = p["lo"], p["lo"] + p["w"]
    return ("count_in_range", "nums", f"returns how many elements of `nums` lie between {lo} and {hi}, both included",
            f"def count_in_range(nums):\n    return sum(1 for x in nums if {lo} <= x <= {hi})\n",
            [([],), ([lo, hi, lo - 1, hi + 1],)] + _lists(rng, 5, lo - 10, hi + 10, (0, 10)))


def _chunks(p, rng):
    n = p["n"]
    return ("chunks", "items", f"splits the list `items` into consecutive lists of {n} elements (the last one "
            f"may be shorter) and returns the list of those lists",
            f"def chunks(items):\n    return [items[i:i + {n}] for i in range(0, len(items), {n})]\n",
            [([],)] + _lists(rng, 5, 0, 9, (1, 11)))


def _nth_prime_after(p, rng):
    k = p["k"]
    return ("nth_prime_after", "n", f"returns the {k}{'st' if k == 1 else 'nd' if k == 2 else 'rd' if k == 3 else 'th'}"
            f" prime number strictly greater than the integer `n`",
            "def nth_prime_after(n):\n    def is_prime(m):\n        if m < 2:\n            return False\n"
            "        i = 2\n        while i * i <= m:\n            if m % i == 0:\n                return False\n"
            f"            i += 1\n        return True\n    count, m = 0, n\n    while count < {k}:\n        m += 1\n"
            "        if is_prime(m):\n            count += 1\n    return m\n",
            [(-5,), (0,), (1,), (2,)] + [(x,) for x in _ints(rng, 4, 3, 500)])


def _digit_sum_base(p, rng):
    b = p["b"]
    return ("digit_sum_base", "n", f"returns the sum of the digits of the non-negative integer `n` written in base {b}",
            f"def digit_sum_base(n):\n    total = 0\n    while n:\n        total += n % {b}\n        n //= {b}\n"
            "    return total\n", [(0,), (1,), (b,), (b * b - 1,)] + [(x,) for x in _ints(rng, 4, 2, 100000)])


def _caesar(p, rng):
    k = p["k"] if p["forward"] else -p["k"]
    return ("caesar", "s", f"shifts every lowercase letter a-z of `s` {'forward' if k > 0 else 'backward'} by {abs(k)} "
            f"places in the alphabet, wrapping around {'from z back to a' if k > 0 else 'from a to z'}, and leaves every "
            "other character as it is",
            "def caesar(s):\n    out = []\n    for ch in s:\n        if 'a' <= ch <= 'z':\n"
            f"            out.append(chr((ord(ch) - 97 + {k}) % 26 + 97))\n        else:\n            out.append(ch)\n"
            "    return ''.join(out)\n", [("",), ("xyz",)] + _strings(rng, 5, "abcmnxyzAB .!"))


def _rle(p, rng):
    count_first = p["count_first"]
    piece = "str(n) + ch" if count_first else "ch + str(n)"
    example = "'aaabcc' -> '3a1b2c'" if count_first else "'aaabcc' -> 'a3b1c2'"
    return ("rle", "s", f"returns the run-length encoding of `s`: each run of a repeated character becomes "
            f"{'the run length followed by the character' if count_first else 'the character followed by the run length'}"
            f" ({example})",
            "def rle(s):\n    out, i = [], 0\n    while i < len(s):\n        ch, n = s[i], 1\n"
            "        while i + n < len(s) and s[i + n] == ch:\n            n += 1\n"
            f"        out.append({piece})\n        i += n\n    return ''.join(out)\n",
            [("",), ("a",)] + _strings(rng, 5, "aab", (1, 12)))


_BRACKETS = ("()", "()[]", "()[]{}", "<>()")


def _balanced(p, rng):
    pairs = _BRACKETS[p["set"]]
    opening, closing = pairs[0::2], pairs[1::2]
    alphabet = pairs + "ab"
    return ("balanced", "s", f"returns True if the brackets {' '.join(opening[i] + closing[i] for i in range(len(opening)))}"
            f" in the string `s` are balanced and properly nested (other characters are ignored), else False",
            f"def balanced(s):\n    match = dict(zip({closing!r}, {opening!r}))\n    stack = []\n    for ch in s:\n"
            f"        if ch in {opening!r}:\n            stack.append(ch)\n        elif ch in match:\n"
            "            if not stack or stack.pop() != match[ch]:\n                return False\n"
            "    return not stack\n",
            [("",), (opening[0] + closing[0],), (closing[0] + opening[0],)] + _strings(rng, 5, alphabet, (0, 8)))


def _fib_mod(p, rng):
    m = p["m"]
    return ("fib_mod", "n", f"returns the n-th Fibonacci number modulo {m}, where F(0) = 0 and F(1) = 1",
            f"def fib_mod(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, (a + b) % {m}\n    return a\n",
            [(0,), (1,), (2,)] + [(x,) for x in _ints(rng, 4, 3, 300)])


def _find_index(p, rng):
    insert = p["insert"]
    if insert:
        what = "the index where `target` is, or if it is absent, the index where it would be inserted to keep the order"
        body = ("    lo, hi = 0, len(nums)\n    while lo < hi:\n        mid = (lo + hi) // 2\n"
                "        if nums[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid\n    return lo\n")
    else:
        what = "the index of `target`, or -1 if it is absent"
        body = ("    lo, hi = 0, len(nums) - 1\n    while lo <= hi:\n        mid = (lo + hi) // 2\n"
                "        if nums[mid] == target:\n            return mid\n        if nums[mid] < target:\n"
                "            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1\n")
    cases = [([], 3), ([1], 1)]
    for _ in range(5):
        nums = sorted(set(_ints(rng, rng.randint(1, 10), -20, 40)))
        cases.append((nums, rng.choice(nums + [rng.randint(-25, 45)])))
    return ("find_index", "nums, target", f"takes a sorted list of distinct integers `nums` and returns {what}",
            "def find_index(nums, target):\n" + body, cases)


def _pick(rng: random.Random, options: Iterable[Any]) -> Any:
    return rng.choice(list(options))


FAMILIES: tuple[Family, ...] = (
    Family("affine", 0, lambda r: {"a": r.randint(2, 9), "b": _pick(r, [b for b in range(-9, 10) if b])}, _affine),
    Family("clamp", 0, lambda r: {"lo": r.randint(-10, 0), "hi": r.randint(1, 20)}, _clamp),
    Family("count_char", 0, lambda r: {"c": r.choice("aeiouxyz")}, _count_char),
    Family("is_multiple", 0, lambda r: {"k": r.randint(2, 12)}, _is_multiple),
    Family("last_digits", 0, lambda r: {"k": r.randint(1, 3)}, _last_digits),
    Family("wrap", 0, lambda r: {"w": r.randrange(len(_WRAPS)), "r": r.randint(1, 3)}, _wrap),
    Family("repeat_join", 0, lambda r: {"n": r.randint(2, 5), "sep": r.randrange(len(_SEPS))}, _repeat_join),
    Family("sum_multiples", 1, lambda r: {"k": r.randint(2, 12), "not": r.random() < 0.3}, _sum_multiples),
    Family("keep_if", 1, lambda r: {"t": r.randint(-10, 30), "op": r.choice(sorted(_COMPARE))}, _keep_above),
    Family("pick_words", 1, lambda r: {"n": r.randint(1, 8), "short": r.random() < 0.4}, _long_words),
    Family("running_total", 1, lambda r: {"s": r.randint(-20, 20)}, _running_total),
    Family("scale_list", 1, lambda r: {"a": r.randint(2, 9), "b": r.randint(-9, 9)}, _scale_list),
    Family("count_in_range", 1, lambda r: {"lo": r.randint(-10, 5), "w": r.randint(1, 15)}, _count_in_range),
    Family("index_of_extreme", 1, lambda r: {"which": r.choice(["first", "last"]), "ext": r.choice(["largest", "smallest"])},
           _index_of),
    Family("dedupe", 1, lambda r: {"abs": r.random() < 0.5}, _dedupe),
    Family("chunks", 1, lambda r: {"n": r.randint(2, 9)}, _chunks),
    Family("nth_prime_after", 2, lambda r: {"k": r.randint(1, 8)}, _nth_prime_after),
    Family("digit_sum_base", 2, lambda r: {"b": r.randint(2, 16)}, _digit_sum_base),
    Family("caesar", 2, lambda r: {"k": r.randint(1, 25), "forward": r.random() < 0.5}, _caesar),
    Family("rle", 2, lambda r: {"count_first": r.random() < 0.5}, _rle),
    Family("balanced", 2, lambda r: {"set": r.randrange(len(_BRACKETS))}, _balanced),
    Family("fib_mod", 2, lambda r: {"m": r.randint(2, 200)}, _fib_mod),
    Family("find_index", 2, lambda r: {"insert": r.random() < 0.5}, _find_index),
)
_BY_NAME = {f.name: f for f in FAMILIES}
