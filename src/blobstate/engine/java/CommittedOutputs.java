/*
 * blobstate committed outputs: the sink's view of a processing stage whose result Spark keeps
 * distributed (persisted on the executors). Each partition of the stage holds the outputs of one or
 * more state partitions, each starting with a header row carrying the uid of the attempt that
 * produced it and ending with a metadata row; the view checks each uid against the attempt the
 * driver commits before any row after that header is passed on, so a partition recomputed by
 * another execution (a lost executor, an evicted cache block) fails the sink's job instead of
 * mixing attempts.
 *
 * Compiled and loaded with the placement helper (blobstate.engine.placement); not a Spark API.
 */
package org.apache.spark.sql.blobstate;

import org.apache.spark.Partition;
import org.apache.spark.TaskContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.execution.LogicalRDD;
import org.apache.spark.sql.execution.LogicalRDD$;

import scala.collection.Iterator;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/** Entry point called from Python through py4j. */
public final class CommittedOutputs {
  /** Text in the message of the error raised when a partition comes from another attempt. */
  public static final String MISMATCH = "blobstate-attempt-mismatch";

  private static final ClassTag<InternalRow> ROW_TAG = ClassTag$.MODULE$.apply(InternalRow.class);

  private CommittedOutputs() {}

  /**
   * The output rows of {@code stage} (same columns; header and metadata rows removed), failing any
   * task whose partition i was not produced by the attempts with the uids {@code uids[i]}: one uid,
   * or several separated by commas (no uid contains one), one per header row the partition holds,
   * in order. The partition must start with a header row, and its header rows must carry exactly
   * those uids in that order (none missing at its end, none beyond them).
   */
  public static Dataset<Row> committedOnly(
      Dataset<Row> stage, String uidColumn, String metaColumn, String[] uids, String what) {
    RDD<InternalRow> parent = stage.queryExecution().toRdd();
    if (parent.getNumPartitions() != uids.length) {
      throw new IllegalArgumentException(
          "blobstate: " + what + " has " + parent.getNumPartitions() + " partitions, expected "
              + uids.length);
    }
    String[][] expected = new String[uids.length][];
    for (int i = 0; i < uids.length; i++) {
      if (uids[i] == null) {
        throw new IllegalArgumentException(
            "blobstate: no committed attempt given for partition " + i + " of " + what);
      }
      expected[i] = uids[i].split(",", -1);
    }
    int uidIndex = stage.schema().fieldIndex(uidColumn);
    int metaIndex = stage.schema().fieldIndex(metaColumn);
    CheckedRDD checked = new CheckedRDD(parent, expected, uidIndex, metaIndex, what);
    LogicalRDD plan = LogicalRDD$.MODULE$.fromDataset(checked, stage, false, false);
    return Dataset.ofRows(stage.sparkSession(), plan);
  }

  static final class CheckedRDD extends RDD<InternalRow> {
    private static final long serialVersionUID = 1L;
    private final String[][] uids;
    private final int uidIndex;
    private final int metaIndex;
    private final String what;

    CheckedRDD(RDD<InternalRow> parent, String[][] uids, int uidIndex, int metaIndex, String what) {
      super(parent, ROW_TAG);
      this.uids = uids;
      this.uidIndex = uidIndex;
      this.metaIndex = metaIndex;
      this.what = what;
    }

    @Override
    public Partition[] getPartitions() {
      return firstParent(ROW_TAG).partitions();
    }

    @Override
    public Iterator<InternalRow> compute(Partition split, TaskContext context) {
      Iterator<InternalRow> rows = firstParent(ROW_TAG).iterator(split, context);
      Headers headers = new Headers(split.index(), uids[split.index()], what);
      // The first header is checked before the task returns (no row of the partition is passed on
      // unchecked); the others as the rows are read.
      String found = null;
      if (rows.hasNext()) {
        InternalRow header = rows.next();
        if (!header.isNullAt(uidIndex)) {
          found = header.getUTF8String(uidIndex).toString();
        }
      }
      headers.check(found);
      return new FilteredRows(
          rows,
          row -> {
            if (!row.isNullAt(uidIndex)) {
              headers.check(row.getUTF8String(uidIndex).toString());
              return false;
            }
            return row.isNullAt(metaIndex);
          },
          headers::checkAllMet);
    }
  }

  /** The header rows expected in one partition of the stage, in order, and how many were met. */
  static final class Headers {
    private final int partition;
    private final String[] expected;
    private final String what;
    private int met;

    Headers(int partition, String[] expected, String what) {
      this.partition = partition;
      this.expected = expected;
      this.what = what;
    }

    /** Checks the uid of the next header row ({@code found}; null: the partition has no header). */
    void check(String found) {
      if (met >= expected.length) {
        throw mismatch(
            found,
            "(none: " + expected.length + (expected.length == 1 ? " header row is" : " header rows are")
                + " expected in this partition)");
      }
      if (!expected[met].equals(found)) {
        throw mismatch(found == null ? "(none: no header row)" : found, expected[met]);
      }
      met++;
    }

    /** Checks, at the end of the partition, that every expected header row was met. */
    void checkAllMet() {
      if (met < expected.length) {
        throw mismatch("(none: the partition ended before its header row)", expected[met]);
      }
    }

    private IllegalStateException mismatch(String found, String committed) {
      String which =
          expected.length == 1 ? "" : " (header " + (met + 1) + " of " + expected.length + " expected)";
      return new IllegalStateException(
          MISMATCH + ": the outputs of partition " + partition + " of " + what + which
              + " come from attempt " + found + ", but the committed attempt is " + committed
              + " (the executor that held them was lost or their cache was evicted)");
    }
  }
}
