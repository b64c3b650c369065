"""The base of the errors people meet (a bad config, a server that cannot start).

Each says in one line what is wrong and what to do; the `jobdist` command
prints it without a traceback and exits 2.
"""


class JobdistError(Exception):
    """An error whose message is for the person who ran the command."""
