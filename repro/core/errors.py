"""The line between a user's mistake and a bug.

A `UserError` is something the user can fix (a config key, a file, a budget, a missing package):
its message names what and how, and the CLI prints it and exits with status 2. Every error class
of that kind derives from it (ConfigError, SelectionError, DataError, RunFileError, ...), and
`UserValueError` stands in for a plain ValueError raised on the user's input. An exception raised
inside a selector or allocator plugin becomes `PluginFailed` (repro/contracts.py), a user error
too: the fault is the plugin's, so the CLI names it, exits with status 2 and writes its traceback
to the run folder. Any other exception is a bug of the suite: the CLI exits with status 1, says
so, and keeps the traceback (repro/cli.py).
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake of the user's whose message names what to fix (exit status 2 in the CLI)."""


class UserValueError(UserError, ValueError):
    """A value the user gave is wrong (a ValueError, for callers that catch those)."""
