/*
 * blobstate write-through outputs: the processing stage and a writer sink in one Spark job. The sink
 * writes the output rows of the stage as its tasks produce them; each task's metadata row (what the
 * partition committed) goes to a collection accumulator instead, which Spark merges on the driver for
 * successful tasks only, once each: the driver commits exactly the attempts whose rows the writer
 * committed. Header rows (the attempt's uid) are dropped.
 *
 * Compiled and loaded with the placement helper (blobstate.engine.placement); not a Spark API.
 */
package org.apache.spark.sql.blobstate;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.spark.Partition;
import org.apache.spark.TaskContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.execution.LogicalRDD;
import org.apache.spark.sql.execution.LogicalRDD$;
import org.apache.spark.util.CollectionAccumulator;

import scala.collection.Iterator;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/** Entry point called from Python through py4j. */
public final class WriteThrough {
  private static final ClassTag<InternalRow> ROW_TAG = ClassTag$.MODULE$.apply(InternalRow.class);
  private static final ObjectMapper JSON = new ObjectMapper();

  private WriteThrough() {}

  /**
   * The texts in {@code metas} as one JSON array of strings: the driver reads them in one py4j call
   * instead of one call per task.
   */
  public static String metadataJson(CollectionAccumulator<String> metas) throws JsonProcessingException {
    return JSON.writeValueAsString(metas.value());
  }

  /**
   * The output rows of {@code stage} (same columns; header and metadata rows removed); the text of
   * each metadata row is added to {@code metas} by the task that passes it.
   */
  public static Dataset<Row> tapped(
      Dataset<Row> stage, String uidColumn, String metaColumn, CollectionAccumulator<String> metas) {
    RDD<InternalRow> parent = stage.queryExecution().toRdd();
    int uidIndex = stage.schema().fieldIndex(uidColumn);
    int metaIndex = stage.schema().fieldIndex(metaColumn);
    TappedRDD tapped = new TappedRDD(parent, uidIndex, metaIndex, metas);
    LogicalRDD plan = LogicalRDD$.MODULE$.fromDataset(tapped, stage, false, false);
    return Dataset.ofRows(stage.sparkSession(), plan);
  }

  static final class TappedRDD extends RDD<InternalRow> {
    private static final long serialVersionUID = 1L;
    private final int uidIndex;
    private final int metaIndex;
    private final CollectionAccumulator<String> metas;

    TappedRDD(
        RDD<InternalRow> parent, int uidIndex, int metaIndex, CollectionAccumulator<String> metas) {
      super(parent, ROW_TAG);
      this.uidIndex = uidIndex;
      this.metaIndex = metaIndex;
      this.metas = metas;
    }

    @Override
    public Partition[] getPartitions() {
      return firstParent(ROW_TAG).partitions();
    }

    @Override
    public Iterator<InternalRow> compute(Partition split, TaskContext context) {
      Iterator<InternalRow> rows = firstParent(ROW_TAG).iterator(split, context);
      // A metadata row goes to the accumulator (the writer never sees it); the header row is dropped.
      return new FilteredRows(
          rows,
          row -> {
            if (!row.isNullAt(metaIndex)) {
              metas.add(row.getUTF8String(metaIndex).toString());
              return false;
            }
            return row.isNullAt(uidIndex);
          });
    }
  }
}
