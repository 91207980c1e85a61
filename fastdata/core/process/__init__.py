"""Process plumbing: which process this is and what runs around a fork (``_pid``), per-process handles
(``_handles``), the state a dataset shares with its workers (``_shared``) and reused batch buffers
(``_bufferpool``)."""
