"""One error tree for everything the connector raises on purpose.

Callers and tests check types and attributes, never message substrings::

    JetStreamConnectorError
    +-- OptionError             a bad, missing, unknown or conflicting option
    +-- SchemaError             an input column the sink does not accept
    +-- ServerBinaryNotFound    the embedded server harness found no nats-server
    +-- NatsConnectError        cannot reach the servers, or authentication failed
    +-- JetStreamApiError       a $JS.API request answered with an error
    +-- StreamConfigError       the target stream is missing or cannot enforce ADR-43
    +-- PublishError            a row was rejected (by the server or client-side)
    +-- AckTimeoutError         PubAcks did not arrive within ackTimeout
    +-- DataLossError           planned sequences were removed before being read
    |   +-- StreamRecreatedError    the stream was deleted and created again
    +-- PartitionReadError      a partition could not be read to its end
    +-- LocalDirectoryError     a folder the connector keeps on an executor (task notes, the sort's
    |                           spill) cannot be written or read: a guard that cannot decide refuses
    +-- OrderError              a write would store a subject's messages out of source order

Every message names what was wrong and what to do about it, and never contains
a secret: secrets are kept in :class:`pyspark_jetstream.options.spec.Secret`,
whose ``repr`` and ``str`` are redacted.
"""

from __future__ import annotations


class JetStreamConnectorError(Exception):
    """Base class of every error the connector raises on purpose."""


class OptionError(JetStreamConnectorError, ValueError):
    """An option is missing, unknown, malformed, out of range or conflicts with another."""

    def __init__(self, option: str, value: object, expected: str, *, unknown: bool = False) -> None:
        self.option = option
        self.value = value
        self.expected = expected
        self.unknown = unknown
        if unknown:  # the name is the mistake, not the value
            super().__init__(f"Unknown option '{option}' {expected}")
            return
        shown = "<missing>" if value is None else repr(value)
        super().__init__(f"Invalid value for option '{option}': {shown}. {expected}")


class SchemaError(JetStreamConnectorError, ValueError):
    """A schema the connector cannot use: the DataFrame handed to the sink has a column it cannot
    publish, or the schema given to a read names a column the source does not have."""


class ServerBinaryNotFound(JetStreamConnectorError, FileNotFoundError):
    """No nats-server binary could be found for the embedded server harness."""


class NatsConnectError(JetStreamConnectorError, ConnectionError):
    """The servers could not be reached, or refused the credentials."""


class JetStreamApiError(JetStreamConnectorError):
    """A JetStream API request ($JS.API.*) answered with an error."""

    def __init__(self, api: str, code: int, err_code: int, description: str) -> None:
        self.api = api
        self.code = code
        self.err_code = err_code
        self.description = description
        codes = f"code {code}, err_code {err_code}" if err_code else f"code {code}"
        super().__init__(f"JetStream API {api} failed: {description} ({codes})")


class StreamConfigError(JetStreamConnectorError):
    """The target stream is missing or its configuration cannot satisfy the write."""


class PublishError(JetStreamConnectorError):
    """A row could not be stored in the stream and no dead-letter subject was set.

    ``position`` is the row's 0-based index within the Spark partition; ``err_code``
    is the server's JetStream error code, or ``None`` for a client-side rejection.
    """

    def __init__(
        self,
        *,
        subject: str | None,
        position: int,
        partition: int | None,
        reason: str,
        err_code: int | None = None,
        value: object = None,
        column: str | None = None,
    ) -> None:
        self.subject = subject
        self.position = position
        self.partition = partition
        self.reason = reason
        self.err_code = err_code
        self.value = value
        self.column = column
        where = f"row {position}" + (f" of partition {partition}" if partition is not None else "")
        parts = [f"Publishing {where} to subject {subject!r} failed: {reason}"]
        if column is not None:
            parts.append(f"column '{column}' value {value!r}")
        if err_code is not None:
            parts.append(f"server err_code {err_code}")
        parts.append("Fix the row, or set the option 'deadLetterSubject' to divert rejected rows.")
        super().__init__(". ".join(parts))


class StreamBusyError(JetStreamConnectorError):
    """The server dropped a row because the stream's ingest queue was full (429, err_code 10167). The row
    is not at fault, so it is never dead-lettered; the task fails, and its retry publishes the row again
    (its ``Nats-Msg-Id`` drops whatever was stored)."""

    def __init__(self, *, subject: str, position: int, partition: int | None, rows: int) -> None:
        self.subject, self.position, self.partition = subject, position, partition
        where = f"row {position}" + (f" of partition {partition}" if partition is not None else "")
        super().__init__(
            f"The server dropped {rows} row(s), the first {where} to subject {subject!r}: the stream's ingest "
            "queue was full (429 too many requests, err_code 10167). The rows are not at fault and were not "
            "dead-lettered. Lower the option 'maxPendingAcks' or the number of partitions writing to this "
            "stream, or raise the server's jetstream max_buffered_msgs; a retry of the task publishes them again.")


class AckTimeoutError(JetStreamConnectorError, TimeoutError):
    """PubAcks for published rows did not arrive in time."""


class DataLossError(JetStreamConnectorError):
    """Planned sequences were removed from the stream before they were read."""

    def __init__(self, stream: str, first_lost: int, last_lost: int, first_available: int) -> None:
        self.stream = stream
        self.first_lost = first_lost
        self.last_lost = last_lost
        super().__init__(
            f"Data loss in stream '{stream}': sequences {first_lost}..{last_lost} were removed (limits, purge or "
            f"TTL) before this query read them; the stream now starts at {first_available}. Some data may have "
            "been lost because it is not available in JetStream any more. If you want the query to go on and "
            "skip the lost range, set the source option 'failOnDataLoss' to 'false'."
        )


class StreamRecreatedError(DataLossError):
    """The stream was deleted and created again (or its sequence went backwards) since an offset was planned."""

    def __init__(self, stream: str, checkpointed_seq: int, checkpointed_created: str | None, last_seq: int,
                 created: str | None) -> None:
        self.stream = stream
        self.first_lost = checkpointed_seq + 1
        self.last_lost = None
        if checkpointed_created is not None:
            what = (f"it was deleted and created again since the checkpoint (created {checkpointed_created} then, "
                    f"{created} now), so its sequences restarted at 1")
        else:
            what = (f"its sequence went backwards: the checkpoint is at sequence {checkpointed_seq}, the stream now "
                    f"ends at {last_seq}, which happens when it is deleted and created again")
        JetStreamConnectorError.__init__(
            self,
            f"Data loss in stream '{stream}': {what}. Messages of the old stream after sequence {checkpointed_seq} "
            "that were not read are gone, and the checkpoint's sequences mean nothing in the new stream. To read the "
            "new stream from its first sequence and go on, set the source option 'failOnDataLoss' to 'false'; to "
            "start over, use a new checkpointLocation.",
        )


class PartitionReadError(JetStreamConnectorError):
    """A partition could not be read to its end (server errors, no progress within consume.maxWait)."""


class LocalDirectoryError(JetStreamConnectorError):
    """A folder the connector keeps under an executor's Spark local directory (a read's note to the write
    of its task, the sort's spill) cannot be written, read or found. ``path`` is the folder or file.

    The guards that use them refuse rather than guess (issue #47): without its note, the sink's order guard
    could not tell a copy straight from a split read from a shuffled one."""

    def __init__(self, message: str, path: object = None) -> None:
        self.path = path
        super().__init__(message)


class OrderError(JetStreamConnectorError):
    """A write would store a subject's (a key's) messages out of their source order, and the sink option
    ``order`` asks for that order (its default)."""

