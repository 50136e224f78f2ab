"""Output files written all or nothing (:class:`Outputs`), for the CLI and the sweep.

A command reserves every file it will write before doing any work, writes each into a
temporary folder beside its target and renames them into place only once all were written:
a failed command leaves no partial output and changes no existing file.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from typing import Self

from .errors import InputError


class Outputs:
    """The files one command writes, all or nothing.

    Every output is *reserved* before the command does any work: its folder must exist, the
    path must not be a folder, nor another output's path, nor an existing file this user may
    not overwrite, and a hidden temporary folder is made next to it (``.megamoe-tmp-XXXX``,
    which proves the folder is writable).  The command writes each output into its temporary
    folder; :meth:`commit` renames them into place (``os.replace``, same file system) only
    once every one of them was written.  Leaving the ``with`` block without a commit (an
    error, Ctrl-C, a broken pipe) removes the temporaries: a failed command leaves no partial
    output and clobbers no existing file.

    An existing output that is not a regular file (``/dev/null``, a pipe) is written into at
    the commit instead of being replaced.

    The suffixes are case-blind (``X.NPZ``, ``T.JSON.GZ``) and the suffix decides the
    format: the temporary name ends in the accepted suffix lower-cased (``T.json.gz``), so a
    writer that goes by the suffix (NumPy appends ``.npz`` to anything else, gzip for ``.gz``,
    matplotlib's format) writes what the final name says, whatever its case.
    """

    def __init__(self) -> None:
        self._items: list[tuple[str, str, str, str]] = []  # (flag, path as given, final real path, temp path)
        self._dirs: list[str] = []  # the temporary folders this object made

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()

    def _check(self, flag: str, path: str) -> str:
        final = os.path.realpath(path)  # a symlink's target is written, as open(path, "w") would
        if not os.path.isdir(os.path.dirname(final)):
            raise InputError(flag, "a path in an existing folder", path)
        if os.path.isdir(final):
            raise InputError(flag, "a file path (not a folder)", path)
        for other_flag, other, other_final, _ in self._items:
            if final == other_final or (os.path.exists(final) and os.path.exists(other_final)
                                        and os.path.samefile(final, other_final)):
                raise InputError(flag, f"a path other than {other_flag}'s (each output its own file)",
                                 path if path == other else f"{path} (the same file as {other})")
        if os.path.exists(final) and not os.access(final, os.W_OK):
            raise InputError(flag, "a file this user may overwrite", f"{path} (read-only)")
        name_max = os.pathconf(os.path.dirname(final), "PC_NAME_MAX")
        if len(os.fsencode(os.path.basename(final))) > name_max:
            raise InputError(flag, f"a file name of at most {name_max} bytes",
                             f"{len(os.fsencode(os.path.basename(final)))} bytes")
        return final

    def _tmpdir(self, flag: str, path: str, final: str) -> str:
        try:
            d = tempfile.mkdtemp(prefix=".megamoe-tmp-", dir=os.path.dirname(final))
        except OSError as exc:
            raise InputError(flag, "a path in a folder this user can write",
                             f"{path} ({exc.strerror or type(exc).__name__})") from None
        self._dirs.append(d)
        return d

    def reserve(self, flag: str, path: str | None, suffixes: tuple[str, ...] = ()) -> str | None:
        """Check ``path`` (given as ``flag``) and return the temporary path to write it to
        (``None`` for no path).  ``suffixes``: the accepted suffixes; the longest that ends
        ``path`` (in any case) ends the temporary name, lower-cased.

        Raises:
            InputError: (naming ``flag``) the folder is missing or not writable, the path is
                a folder, another output's path or a read-only file.
        """
        if path is None:
            return None
        final = self._check(flag, path)
        name = os.path.basename(final)
        ext = max((x for x in suffixes if name.lower().endswith(x.lower())), key=len, default="")
        tmp = os.path.join(self._tmpdir(flag, path, final), name[:len(name) - len(ext)] + ext.lower())
        self._items.append((flag, path, final, tmp))
        return tmp

    def reserve_derived(self, flag: str, path: str, tails: list[str]) -> str:
        """Outputs a writer derives from one base path, ``path + tail`` for each of ``tails``
        (``megamoe run --ranks R --trace T`` writes ``T.rank<r>.json``): check each and return
        the temporary base path to hand the writer."""
        finals = [self._check(flag, path + t) for t in tails]
        base = os.path.join(self._tmpdir(flag, path, finals[0]), os.path.basename(path))  # finals' file system
        for t, final in zip(tails, finals):
            self._items.append((flag, path + t, final, base + t))
        return base

    def unwritten(self) -> list[str]:
        """Outputs (paths as given) the command has not written (no file, or an empty one)."""
        return [p for _, p, _, tmp in self._items if not (os.path.isfile(tmp) and os.path.getsize(tmp) > 0)]

    def commit(self) -> list[str]:
        """Rename every output into place; returns the paths as given.

        Raises:
            RuntimeError: an output was not written (a command bug; nothing is renamed).
        """
        absent = self.unwritten()
        if absent:
            raise RuntimeError(f"outputs not written: {', '.join(absent)}")
        umask = os.umask(0)
        os.umask(umask)
        for _, _, final, tmp in self._items:
            if os.path.exists(final):  # keep an existing file's permissions, as open(path, "w") would
                os.chmod(tmp, os.stat(final).st_mode & 0o7777)
            else:
                os.chmod(tmp, 0o666 & ~umask)
        done = []
        for _, path, final, tmp in self._items:
            if os.path.exists(final) and not stat.S_ISREG(os.stat(final).st_mode):
                # a device or a pipe (``--json /dev/null``): written into, never replaced by a file
                with open(tmp, "rb") as src, open(final, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                os.replace(tmp, final)
            done.append(path)
        self._items = []
        self.discard()
        return done

    def discard(self) -> None:
        """Remove the temporary folders and what is left in them (safe to call twice)."""
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)
        self._items, self._dirs = [], []


def check_output_path(flag: str, path: str) -> str:
    """Check one output path up front, as :meth:`Outputs.reserve` does, without reserving it:
    for the benchmark scripts that rewrite their JSON after every row (so that a run cut short
    keeps what it measured) and so cannot write it all or nothing. Returns the real path.

    Raises:
        InputError: (naming ``flag``) the folder is missing, the path is a folder, or an
            existing file this user may not overwrite.
    """
    return Outputs()._check(flag, str(path))

