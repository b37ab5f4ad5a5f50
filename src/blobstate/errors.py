"""The root of blobstate's exception tree and its branches.

Every error blobstate raises on purpose derives from :class:`BlobstateError`, through exactly one of its
five branches, so a caller can catch by kind: the blob store failed (:class:`BlobStoreError`), the
checkpoint's state cannot be used as asked (:class:`StateError`, whose :class:`CorruptionError` gathers
every "stored data cannot be trusted" error), an argument, option or installation cannot work
(:class:`ConfigurationError`), a query or a micro-batch failed (:class:`QueryError`), or a processor
misused the state API or handed it data that does not fit (:class:`ProcessorError`). Most classes also
derive from the builtin that says what kind of failure it is (``ValueError``, ``TypeError``,
``RuntimeError``, ``TimeoutError``, ``ImportError``), so code catching the builtin keeps working.

The tree: each class, the module that defines it (below ``blobstate.``) and, after "also", its other
direct bases. A class with two blobstate parents is drawn once, under the one that says most about it.
``tests/test_errors.py`` checks this drawing against the classes themselves.

* BlobstateError [errors]
  * BlobStoreError [errors]
    * BlobNotFoundError [blobstore.base]
    * BucketNotFoundError [blobstore.base]
    * LocationNotFoundError [blobstore.base]
    * LocationNotADirectoryError [blobstore.base]
    * TransientBlobError [blobstore.base]
      * MalformedAnswerError [blobstore.answers]
    * InvalidBlobNameError [blobstore.base; also ValueError]
    * LocalPathError [blobstore.local; also ValueError]
    * S3OptionError [blobstore.s3_options; also ValueError]
    * AzureOptionError [blobstore.azure_options; also ValueError]
    * UnsupportedSchemeError [blobstore.schemes; also ValueError]
    * NoHadoopLocationError [blobstore.schemes; also ValueError]
    * RedactedError [blobstore.redact]
  * StateError [errors]
    * StateLoadError [state.errors; also RuntimeError]
      * MissingObjectError [state.errors]
      * LineageError [state.errors]
    * PartitionClosedError [state.errors; also RuntimeError]
    * PartitionLockedError [state.locking; also TimeoutError]
    * StateStoreError [state.store; also RuntimeError]
      * NotAStoreError [state.store]
      * StoreLockedError [state.store]
      * StoreClosedError [state.store]
    * GcRefusedError [state.retention]
    * LostCommitError [state.lost]
    * AcceptLossError [state.lost]
    * RescaleError [rescale.split; also RuntimeError]
    * CommitLogError [lineage.commitlog]
      * CommitConflictError [lineage.commitlog]
      * MetadataConflictError [lineage.commitlog]
        * PartitionCountMismatchError [engine.startup]
      * IncompleteCommitLogError [lineage.commitlog]
    * SnapshotError [snapshot.index]
      * SnapshotBlobMissingError [snapshot.index]
      * HeadLogError [snapshot.heads]
      * RepositoryError [snapshot.repository]
        * NoSnapshotError [snapshot.repository]
        * LegacyRepositoryError [snapshot.repository]
        * BackupConflictError [snapshot.repository]
      * RestoreTargetError [snapshot.restore]
    * StateReadError [reader.variables; also ValueError]
      * MissingStateVariableError [reader.moving]
    * NotACheckpointError [cli.lineage_cmds]
    * VersionNotCommittedError [cli.lineage_cmds]
    * PartitionNotFoundError [cli.lineage_cmds]
    * CorruptionError [errors]
      * CorruptObjectError [state.errors; also StateLoadError]
      * DeltaFormatError [lineage.delta; also ValueError]
      * CommitLogFormatError [lineage.commitlog; also CommitLogError, ValueError]
      * SnapshotFormatError [snapshot.index; also SnapshotError, ValueError]
      * SnapshotCorruptError [snapshot.index; also SnapshotError]
      * HeadFormatError [snapshot.heads; also HeadLogError, ValueError]
      * ValueFormatError [encoding.values; also ValueError]
      * CorruptKeyError [encoding.codec; also ValueError]
      * StoredSchemaError [stored_schema; also ValueError]
      * DeferredRowsError [adjunct.deferred; also ValueError]
      * AcceptanceFormatError [lineage.acceptance; also ValueError]
  * ConfigurationError [errors]
    * ArgumentTypeError [errors; also TypeError]
    * QueryConfigError [engine.config; also ValueError]
    * UnknownOptionError [engine.config; also TypeError]
    * InvalidIdError [ids; also ValueError]
    * SchemaParseError [processor.schema; also ValueError]
    * InputWatermarkError [engine.watermark; also ValueError]
    * AdjunctError [adjunct.spec; also ValueError]
    * ProgressFormatError [engine.progress; also ValueError]
    * BackendNotInstalledError [blobstore.schemes; also ImportError]
    * ExecutorPythonError [engine.executor_python; also ImportError]
    * HelperCompileError [engine.helper_jar; also RuntimeError]
    * PlacementUnavailableError [engine.placement; also RuntimeError]
      * SparkConnectUnsupportedError [engine.placement]
      * ConnectPluginMissingError [engine.jvm.connect]
    * ReportError [report.render]
    * ReportOutputError [report.output]
    * DemoWorkdirError [demo.run; also ValueError]
    * UnsupportedKeyTypeError [rescale.murmur3; also TypeError]
  * QueryError [errors]
    * QueryAlreadyRunningError [engine.startup; also RuntimeError]
    * ProbeFailedError [batch.jvm; also RuntimeError]
    * SparkCheckpointMismatchError [engine.replay]
    * BatchError [engine.stage; also RuntimeError]
      * ProcessorFailedError [engine.stage]
      * SinkFailedError [engine.stage]
      * SparkCheckpointError [engine.spark_checkpoint]
    * StageFailedError [engine.outputs; also RuntimeError]
    * AttemptMismatchError [engine.outputs; also RuntimeError]
    * GroupInputError [engine.groups; also RuntimeError]
    * BlobstateQueryError [engine.handle; also StreamingQueryException]
      * ProcessorQueryError [engine.handle]
  * ProcessorError [errors]
    * StatefulProcessorError [encoding.errors; also PySparkRuntimeError]
      * InvalidHandleStateError [encoding.errors]
      * InvalidTimeModeError [encoding.errors]
      * StateVariableError [encoding.errors]
      * ImplicitKeyError [encoding.errors]
      * OutputSchemaError [encoding.errors]
    * UnsupportedTypeError [encoding.values; also TypeError]
    * KeyEncodingError [encoding.codec; also TypeError]
    * AdjunctRecordError [adjunct.spec; also ValueError]

Private exceptions (a leading underscore) are control flow inside one module and never reach a caller;
warnings (``CallbackNameWarning``) are not errors. Neither is in the tree.
"""

from __future__ import annotations


class BlobstateError(Exception):
    """Base class of every error blobstate raises; its message names the thing at fault."""


class BlobStoreError(BlobstateError):
    """A blob store operation failed or was refused: a missing object or bucket, a failure still there
    after the retries, a bad name, URL or option. The message names the store and the object."""


class StateError(BlobstateError):
    """A checkpoint's state cannot be used as asked: a partition that will not load, lock or open, a
    commit that conflicts with another driver's, a version, backup or state variable that is not there."""


class CorruptionError(StateError):
    """Data blobstate wrote and read back cannot be trusted: malformed, truncated, a checksum mismatch,
    an unknown format. The message names the object and what is wrong; nothing is repaired or guessed."""


class ConfigurationError(BlobstateError):
    """An argument, option, declaration or installation that cannot work; the message names it.
    Raised before the work it would spoil starts."""


class ArgumentTypeError(ConfigurationError, TypeError):
    """An argument of the wrong type; the message names the argument and the type it got."""


class QueryError(BlobstateError):
    """A streaming query, or one of its micro-batches, could not run or complete; nothing of a failed
    batch was committed."""


class ProcessorError(BlobstateError):
    """A processor used the state API in a way it does not allow, or handed it keys, values, outputs or
    side rows that do not fit their declared types."""


BRANCHES: tuple[type[BlobstateError], ...] = (
    BlobStoreError,
    StateError,
    ConfigurationError,
    QueryError,
    ProcessorError,
)
"""The direct children of :class:`BlobstateError`; every other blobstate error descends from one."""


def process_ending(error: BaseException) -> bool:
    """Whether ``error`` says the process is shutting its thread pools down (an interpreter at exit, or
    a pool shut meanwhile): work in the background stops there, and a later run finishes it."""
    return isinstance(error, RuntimeError) and "cannot schedule new futures after" in str(error)


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type's name when the message is empty): for one-line
    reports of errors whose text (Spark's, py4j's) may run to pages."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


__all__ = [
    "BRANCHES",
    "ArgumentTypeError",
    "BlobStoreError",
    "BlobstateError",
    "ConfigurationError",
    "CorruptionError",
    "ProcessorError",
    "QueryError",
    "StateError",
    "first_line",
]
