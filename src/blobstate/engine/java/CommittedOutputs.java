/*
 * blobstate committed outputs: the sink's view of a processing stage whose result Spark keeps
 * distributed (persisted on the executors). Each partition of the stage starts with a header row
 * carrying the uid of the attempt that produced it; the view checks that uid against the attempt
 * the driver commits before any row of the partition is passed on, so a partition recomputed by
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
   * task whose partition i was not produced by the attempt with uid {@code uids[i]}.
   */
  public static Dataset<Row> committedOnly(
      Dataset<Row> stage, String uidColumn, String metaColumn, String[] uids, String what) {
    RDD<InternalRow> parent = stage.queryExecution().toRdd();
    if (parent.getNumPartitions() != uids.length) {
      throw new IllegalArgumentException(
          "blobstate: " + what + " has " + parent.getNumPartitions() + " partitions, expected "
              + uids.length);
    }
    int uidIndex = stage.schema().fieldIndex(uidColumn);
    int metaIndex = stage.schema().fieldIndex(metaColumn);
    CheckedRDD checked = new CheckedRDD(parent, uids.clone(), uidIndex, metaIndex, what);
    LogicalRDD plan = LogicalRDD$.MODULE$.fromDataset(checked, stage, false, false);
    return Dataset.ofRows(stage.sparkSession(), plan);
  }

  static final class CheckedRDD extends RDD<InternalRow> {
    private static final long serialVersionUID = 1L;
    private final String[] uids;
    private final int uidIndex;
    private final int metaIndex;
    private final String what;

    CheckedRDD(RDD<InternalRow> parent, String[] uids, int uidIndex, int metaIndex, String what) {
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
      int partition = split.index();
      String expected = uids[partition];
      String found = null;
      if (rows.hasNext()) {
        InternalRow header = rows.next();
        if (!header.isNullAt(uidIndex)) {
          found = header.getUTF8String(uidIndex).toString();
        }
      }
      if (!expected.equals(found)) {
        throw new IllegalStateException(
            MISMATCH + ": the outputs of partition " + partition + " of " + what + " come from attempt "
                + (found == null ? "(none: no header row)" : found) + ", but the committed attempt is "
                + expected + " (the executor that held them was lost or their cache was evicted)");
      }
      return new FilteredRows(rows, row -> row.isNullAt(uidIndex) && row.isNullAt(metaIndex));
    }
  }
}
