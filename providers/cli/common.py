"""What every `fallgate` command shares: the program name, the exit statuses and `CliError`.

A command reports a failure the user can cause by raising `CliError` with one of
these statuses; `main` prints it as one line on stderr. Kept apart so that every
command module and the parser agree on the numbers without importing each other.
"""

from __future__ import annotations

PROG = "fallgate"

#: Exit statuses: 0 success; 1 the command ran and failed (a property is broken, a demo
#: scenario left its expected path, an output could not be written, the health store
#: cannot be reached); 2 a usage or input
#: error (a bad argument, a missing or invalid policy, trace or script file, an unsupported
#: output suffix); 3 a needed system tool (Graphviz's `dot`) is missing; 130 interrupted.
OK, FAILED, USAGE, MISSING_TOOL, INTERRUPTED = 0, 1, 2, 3, 130

EXIT_STATUS_HELP = """\
exit status:
  0    success
  1    the command ran and failed: a property is broken (check), a scenario
       took an unexpected path (demo), an output could not be written, the
       health store cannot be reached (health)
  2    usage or input error: a bad argument; a missing, unreadable or invalid
       policy, trace or script file; an unsupported output file suffix; a bad
       store URL or an unknown target to reset (health)
  3    a needed system tool is missing (Graphviz's `dot` for SVG and PNG)
  130  interrupted (Ctrl-C)"""


class CliError(Exception):
    """A user-facing failure: printed as one message, exit status `code`."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code
