"""Errors raised for bad input.

Every validation failure in megamoe raises :class:`InputError` (a ``ValueError``) whose
message is one line: ``<field>: expected <what>, got <value>``.  The CLI turns it into a
one-line message on stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import argparse
import contextlib

import numpy as np


class InputError(ValueError):
    """Bad input: names the field, what was expected and what came.

    Attributes:
        field: dotted name of the offending input (``"shape.hidden"``, ``"routing.file"``).
        expected: human-readable description of what is accepted.
        got: what was given (``repr`` of the value, or a short description).
    """

    def __init__(self, field: str, expected: str, got: object):
        self.field = field
        self.expected = expected
        self.got = got
        self.message = (f"{field}: expected {expected}, got {got!r}" if not isinstance(got, str)
                        else f"{field}: expected {expected}, got {got}")
        # args keep the three parts so copies (pickling, SimPy re-raising) rebuild the error
        super().__init__(field, expected, got)

    def __str__(self) -> str:
        return self.message


def require(cond: bool, field: str, expected: str, got: object) -> None:
    """Raise :class:`InputError` unless ``cond`` holds."""
    if not cond:
        raise InputError(field, expected, got)


def is_int(v: object) -> bool:
    """An integer value (``int`` or numpy integer, not ``bool``): what integer fields take."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _typed(text: str, conv):
    """``conv(text)`` (``int`` or ``float``) for a number as typed on a command line, refusing
    what Python reads and no option of megamoe means: digit-group underscores (``1_000``) and
    non-ASCII digits (``'١٢'``). Raises ValueError (the caller names the option)."""
    if not text.isascii() or "_" in text:
        raise ValueError(f"not a plain ASCII number: {text!r}")
    return conv(text)


def parse_int(text: str) -> int:
    """An integer as typed on a command line: Python's ``int()`` (blanks around and a sign
    allowed) without digit-group underscores or non-ASCII digits.

    Raises:
        ValueError: anything else (the caller names the option in its message).
    """
    return _typed(text, int)


def parse_float(text: str) -> float:
    """A number as typed on a command line: Python's ``float()`` (so ``1e3``, ``inf`` and ``nan``,
    which the caller's range check refuses where they do not belong) without digit-group
    underscores or non-ASCII digits.

    Raises:
        ValueError: anything else (the caller names the option in its message).
    """
    return _typed(text, float)


def is_real(v: object) -> bool:
    """A real number (``int`` / ``float`` or numpy scalar, not ``bool``); may be NaN or Inf."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def shown(v: object) -> object:
    """``v`` for an error message: a string where a number belongs is quoted (``'64'``, not
    ``64``, which :class:`InputError` would print for the string)."""
    return repr(v) if isinstance(v, str) else v


def shown_text(text: str) -> str:
    """A name or path typed by the user, for an error message: as typed, but quoted where it is
    empty or has blanks around it (``''``, ``' h100'``), which would not show otherwise."""
    return text if text and text == text.strip() else repr(text)


_SEEN = "_megamoe_options_seen"  # the dests a parse has stored a value for (removed after it)


class _StoreOnce(argparse.Action):
    """argparse's plain store, but an option that takes a value given twice (however spelt or
    abbreviated) is an error: argparse keeps the last one silently (``--json a.json --json
    b.json`` wrote only b.json)."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = namespace.__dict__.setdefault(_SEEN, {})
        if self.dest in seen:
            parser.error(f"{self.option_strings[-1]}: expected the option once, got it twice "
                         f"({seen[self.dest]}, then {values})")
        seen[self.dest] = values
        setattr(namespace, self.dest, values)


_ARGPARSE_TYPES = {"int": "an integer", "float": "a number"}


# argparse's own messages, and each one's field form (from the match's groups; an option's form
# also from the option's name)
_WHOLE = ((r"unrecognized arguments: (.*)",
           lambda g: f"arguments: expected only options the command takes (see its --help), got {g[0]}"),
          (r"the following arguments are required: (.*)", lambda g: f"{g[0]}: expected a value (required), got none"))
_OF_ARGUMENT = ((r"invalid choice: (.*) \(choose from (.*)\)",
                 lambda g, opt: f"expected one of {g[1].replace(chr(39), '')}, got {g[0]}"),
                (r"invalid (\w+) value: (.*)", lambda g, opt: f"expected {_ARGPARSE_TYPES.get(g[0], g[0])}, got {g[1]}"),
                # the value may have looked like an option (argparse takes '-256,6,...' for one)
                (r"expected (?:one|at least one) argument", lambda g, opt: "expected a value, got none" + (
                    f" (a value that starts with '-' goes as {opt.split('/')[-1]}=VALUE)" if opt.startswith("--") else "")),
                (r"ignored explicit argument (.*)", lambda g, opt: f"expected no value (a flag), got {g[0]}"))


def _field_form(message: str) -> str:
    """argparse's own messages in the project's ``<field>: expected <what>, got <value>`` form
    (unrecognized and missing arguments, a bad choice or type, a missing value); the
    ``argument <option>: `` prefix of a message that has the form already is dropped."""
    import re

    for pattern, form in _WHOLE:
        m = re.fullmatch(pattern, message)
        if m:
            return form(m.groups())
    m = re.fullmatch(r"argument (\S+): (.*)", message)
    if not m:
        return message
    opt, rest = m.groups()
    opt = "command" if opt == "cmd" else opt
    for pattern, form in _OF_ARGUMENT:
        m = re.fullmatch(pattern, rest)
        if m:
            return f"{opt}: {form(m.groups(), opt)}"
    return f"{opt}: {rest}"


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse with the project's rule for bad input: one line, ``<program>: error:
    <message>`` on stderr, exit code 2, no usage dump. The program is the first word of
    ``prog`` (a subcommand's parser, ``megamoe simulate``, reports as ``megamoe``). An option
    that takes one value is refused when given twice, and an option is spelled out in full (no
    abbreviations: ``--tok`` is not ``--tokens``). Used by the ``megamoe`` CLI and the benchmark
    scripts."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        ns.__dict__.pop(_SEEN, None)
        return ns, rest

    def parse_args(self, args=None, namespace=None):
        ns, rest = self.parse_known_args(args, namespace)
        if rest:  # argparse's "unrecognized arguments", with the nearest option of the command named
            self.error(f"unrecognized arguments: {' '.join(rest)}{self._nearest_option(ns, rest)}")
        return ns

    def _nearest_option(self, ns, rest: list[str]) -> str:
        """`` (did you mean --tokens?)`` for the first unknown ``--option`` in ``rest`` that starts
        an option of the command (its subcommand's, where one was chosen) or is close to one."""
        import difflib

        opts = set(self._option_string_actions)
        for act in self._actions:
            if isinstance(act, argparse._SubParsersAction) and getattr(ns, act.dest, None) in act.choices:
                opts |= set(act.choices[getattr(ns, act.dest)]._option_string_actions)
        for tok in rest:
            if tok.startswith("--"):
                name = tok.split("=", 1)[0]
                near = sorted(o for o in opts if o.startswith(name) and o.startswith("--")) or \
                    difflib.get_close_matches(name, sorted(opts), n=1, cutoff=0.85)
                if near:
                    return f" (did you mean {' or '.join(near[:3])}?)"
                return ""
        return ""

    def error(self, message: str):
        self.exit(2, f"{self.prog.split()[0]}: error: {_field_form(message)}\n")

    @contextlib.contextmanager
    def input_errors(self):
        """Report an :class:`InputError` raised in the ``with`` block (a script's own checks of
        its arguments) as this parser's one-line error, exit code 2."""
        try:
            yield
        except InputError as e:
            self.error(str(e))
