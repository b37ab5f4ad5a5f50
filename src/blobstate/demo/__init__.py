"""The ``blobstate demo`` job: per-user click sessions with an event-time timeout, killed and restarted."""
