"""The deployed job's own module: its processor, as a team's job keeps it beside the job's script.

``packed_env_driver.py`` imports :class:`DeployedSessions` from here, so cloudpickle pickles the
processor by reference and every executor's Python imports this module to run it: the test ships it with
``spark-submit --py-files``, as the README's "Shipping the job's own code" says.
"""

from __future__ import annotations

from blobstate.demo.sessions import SessionProcessor


class DeployedSessions(SessionProcessor):
    """The demo's sessionizer under the job's own name (the same state variables and outputs)."""
